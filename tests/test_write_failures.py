"""Monitoring never kills training: a full or unwritable log directory drops steps, loudly.

The training runs happen in fresh processes whose file-size limit (RLIMIT_FSIZE) makes the kernel
refuse writes part way, as a full disk does (EFBIG instead of ENOSPC; no privileges needed), for
a stretch of steps; a real full tmpfs is used too where this machine may mount one.
"""

import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from tensorboard_gradients import GradientWriter, read_logdir
from tensorboard_gradients.format import event_files

SCRIPT = os.path.join(os.path.dirname(__file__), "full_disk_training.py")
STEPS, FULL_UNTIL = 30, 20  # as in full_disk_training.py


def train_with_a_full_disk(framework, logdir, strict=False):
    return subprocess.run(
        [sys.executable, SCRIPT, framework, str(logdir), "strict" if strict else "lenient"],
        capture_output=True, text=True, timeout=300,
    )


def events_of(directory):
    """Every event of a run's files, and the damage the reader met (none expected)."""
    damage = event_files.ReadDamage()
    events = []
    for name in sorted(os.listdir(directory)):
        events += list(event_files.read_events(os.path.join(directory, name), damage))
    return events, damage


@pytest.mark.parametrize("framework", ["torch", "keras", "tensorflow", "jax"])
def test_training_outlives_a_full_disk_and_says_how_much_was_lost(tmp_path, framework):
    pytest.importorskip({"keras": "tensorflow"}.get(framework, framework))
    finished = train_with_a_full_disk(framework, tmp_path)
    assert finished.returncode == 0, finished.stderr[-3000:]
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    assert result["trained"] == STEPS
    assert result["dropped"] > 0
    # Loud once per outage, naming the directory; then how much was lost when it ends.
    assert finished.stderr.count("cannot write to") == 1
    assert str(tmp_path) in finished.stderr and "NOT being logged" in finished.stderr
    assert finished.stderr.count("again from step") == 1
    run = "train" if framework == "keras" else "."
    series = read_logdir(tmp_path)[run]["gradients"]
    # Every step was either written whole or counted as dropped, and writing resumed.
    assert len(series.steps) + result["dropped"] == STEPS
    assert series.steps[-1] == STEPS and set(range(FULL_UNTIL, STEPS + 1)) <= set(series.steps)
    assert series.damaged_points == 0
    events, damage = events_of(tmp_path / ("train" if framework == "keras" else ""))
    assert not damage, f"a torn record was left in the file: {damage}"
    reported = [v.tensor.float_val[0] for e in events for v in e.summary.value
                if v.tag == "gradients/dropped_steps"]
    assert reported == [result["dropped"]]


def test_strict_raises_the_disk_error_into_the_training_loop(tmp_path):
    pytest.importorskip("torch")
    finished = train_with_a_full_disk("torch", tmp_path, strict=True)
    assert finished.returncode != 0
    assert "OSError" in finished.stderr and "File too large" in finished.stderr


def write_steps(writer, steps):
    # 50 variables: ~16 KiB of statistics and histograms per step.
    gradient = {f"dense_{i}/kernel": np.ones((8, 8), np.float32) for i in range(50)}
    for step in steps:
        writer.write(step, gradient, histograms=True)


def test_an_unwritable_directory_is_named_at_the_first_write(tmp_path, caplog):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    logdir = not_a_directory / "run"
    with caplog.at_level(logging.ERROR, logger="tensorboard_gradients"):
        writer = GradientWriter(str(logdir))
        write_steps(writer, range(3))
        writer.flush()  # the writes run on the writer's thread: all of them done
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and str(logdir) in errors[0] and "Not a directory" in errors[0]
    assert writer.dropped_steps == 3
    with pytest.raises(NotADirectoryError):
        write_steps(GradientWriter(str(logdir), strict=True), [0])


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A real 512 KiB tmpfs (needs the privilege to mount; skipped without it)."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs",
                              str(mount_point)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root): the RLIMIT_FSIZE tests cover it")
    yield mount_point
    subprocess.run(["umount", "--lazy", str(mount_point)], check=True)


def test_a_really_full_tmpfs_drops_whole_steps_and_resumes_when_space_is_freed(tiny_tmpfs):
    filler = tiny_tmpfs / "filler"
    filler.write_bytes(b"\0" * (400 << 10))
    writer = GradientWriter(str(tiny_tmpfs / "run"))
    write_steps(writer, range(40))  # ~16 KiB per step: the disk fills part way through
    writer.flush()  # every queued write tried
    assert writer.dropped_steps > 0
    filler.unlink()
    write_steps(writer, range(40, 45))
    writer.close()
    series = read_logdir(str(tiny_tmpfs))["run"]["gradients"]
    assert len(series.steps) + writer.dropped_steps == 45 and series.steps[-1] == 44
    _, damage = events_of(tiny_tmpfs / "run")
    assert not damage
