"""The loader cases of issue 34, each through a real `tensorboard` on both loaders.

Before the plugin read a local logdir's tags itself (`server/store/local.py`), TensorBoard's own
loaders decided what the tab showed: one flipped bit made the Python loader serve 20 of 40 steps,
a FIFO named like an event file blanked its runs list for every run, two writers on interleaved
steps showed 501 of 1,000 steps on the Rust loader, and 2,000 tags took the Rust loader 89 s to
list. One logdir holds a run per case; one TensorBoard process per loader serves it all, with
``--reload_interval 0`` (nothing changes after it starts). Whatever TensorBoard's own loader
does with these files (the Python loader's reload thread blocks for ever opening the FIFO), the
plugin must answer the same on both loaders.

Every request has a timeout (`HANG_S`): a hang fails, nothing waits for ever. No timing is
asserted below that: `benchmarks/many_tags.py` measures the first `runs` answer at 2,000 tags.
"""

import os
import pathlib
import subprocess
import sys
import urllib.parse
from typing import List, NamedTuple

import numpy as np
import pytest

import tensorboard_gradients as tg
from support import ROOT, TensorBoard, flip_byte, get_json

sys.path.insert(0, str(ROOT / "benchmarks"))
from many_tags import write_one_file  # noqa: E402  (benchmarks/many_tags.py: its run's writer)

ROUTES = "/data/plugin/gradients/"
TAG = "gradients"
STAT = "l2_norm"
# A request or a start this long has hung: far above what any of them takes on a loaded 2-core
# machine (the first `runs` answer at 2,000 tags is the slowest).
HANG_S = 180
FLIPPED_STEPS, FLIPPED_STEP = 40, 20
HEALTHY_STEPS = 10
# Sorts before a writer's file: TensorBoard's Python loader opens it first, and blocks there.
FIFO_NAME = "events.out.tfevents.0000000000.fifo"
INTERLEAVED_STEPS = 1000
MANY_TAGS, MANY_TAG_STEPS = 2000, 3
# What the plugin lists of the logdir: the run holding only a FIFO has no tag to list.
LISTED_STEPS = {"flipped": FLIPPED_STEPS - 1, "beside_fifo": HEALTHY_STEPS,
                "healthy": HEALTHY_STEPS, "interleaved": INTERLEAVED_STEPS}


def gradients(step):
    return {"fc1/weight": np.full((4, 3), 1.0 + step), "fc2/bias": np.ones(3)}


def write_run(run_dir, steps):
    with tg.GradientWriter(str(run_dir)) as writer:
        for step in range(steps):
            writer.write(step, gradients(step))


def write_interleaved_run(run_dir):
    """Two writers in one process, each with its own event file (`EventFileWriter` names it
    with the pid and a counter), on alternate steps."""
    with tg.GradientWriter(str(run_dir)) as even, tg.GradientWriter(str(run_dir)) as odd:
        for step in range(INTERLEAVED_STEPS):
            (odd if step % 2 else even).write(step, gradients(step))


class Logdir(NamedTuple):
    root: pathlib.Path
    many_tags: List[str]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader_cases")
    write_run(root / "flipped", FLIPPED_STEPS)
    (path,) = (root / "flipped").glob("*tfevents*")
    flip_byte(path, FLIPPED_STEP)  # its record now fails its checksum
    write_run(root / "beside_fifo", HEALTHY_STEPS)
    os.mkfifo(root / "beside_fifo" / FIFO_NAME)
    (root / "fifo_alone").mkdir()
    os.mkfifo(root / "fifo_alone" / FIFO_NAME)
    write_run(root / "healthy", HEALTHY_STEPS)
    write_interleaved_run(root / "interleaved")
    # One writer, each tag a variable set of its own, all in one event file: the cheapest way
    # to write 2,000 tags.
    return Logdir(root, write_one_file(str(root / "many"), MANY_TAGS, MANY_TAG_STEPS))


class Served(NamedTuple):
    base: str
    first_runs: dict  # the plugin's first `runs` answer, asked as soon as it answers at all

    def get(self, route, **params):
        query = "?" + urllib.parse.urlencode(params) if params else ""
        return get_json(self.base + ROUTES + route + query, timeout=HANG_S)


@pytest.fixture(scope="module", params=["true", "false"], ids=["rust", "python"])
def served(request, logdir):
    tensorboard = TensorBoard(logdir.root, load_fast=request.param, reload_interval=0,
                              with_tensorflow=True)
    try:
        # `thresholds` reads no logdir: it answers as soon as the plugin is up, so the first
        # `runs` below cannot have waited for TensorBoard to load anything.
        tensorboard.wait_for(lambda: _answers(tensorboard.base + ROUTES + "thresholds"),
                             "the Gradients plugin to answer", timeout=HANG_S)
        yield Served(tensorboard.base, get_json(tensorboard.base + ROUTES + "runs",
                                                timeout=HANG_S))
    finally:
        try:
            tensorboard.stop()
        except subprocess.TimeoutExpired:
            tensorboard.process.kill()
            raise


def _answers(url):
    try:
        get_json(url)
    except OSError:
        return False
    return True


def _steps_of(runs):
    return {run: tags[TAG]["steps"] for run, tags in runs.items() if run != "many"}


def test_a_flipped_bit_costs_its_own_step_on_both_loaders(served):
    heatmap = served.get("heatmap", run="flipped", tag=TAG, stat=STAT)
    assert heatmap["steps"] == [s for s in range(FLIPPED_STEPS) if s != FLIPPED_STEP]
    assert heatmap["damaged"] == 1
    (damage,) = heatmap["damage"]
    assert "1 logged step of this tag was left out" in damage and "fails its checksum" in damage
    assert served.first_runs["flipped"][TAG]["damaged"] == 1


def test_a_flipped_bit_costs_read_logdir_its_own_step_too(logdir):
    report = tg.read_logdir_report(str(logdir.root / "flipped"))
    steps = report.runs["."][TAG].steps
    assert list(steps) == [s for s in range(FLIPPED_STEPS) if s != FLIPPED_STEP]
    (problem,) = report.problems
    assert problem.message == "1 damaged record(s) skipped"


def test_a_fifo_named_like_an_event_file_is_reported_and_skipped(served):
    beside = served.first_runs["beside_fifo"][TAG]
    assert beside["steps"] == HEALTHY_STEPS
    assert beside["damage"] == [f"{FIFO_NAME} is a FIFO, not an event file: skipped"]
    heatmap = served.get("heatmap", run="beside_fifo", tag=TAG, stat=STAT)
    assert heatmap["steps"] == list(range(HEALTHY_STEPS))
    assert heatmap["damage"] == beside["damage"]


def test_a_fifo_hides_no_other_run(served):
    # The first answer, and a later one, whatever TensorBoard's own loader got to meanwhile.
    assert _steps_of(served.first_runs) == LISTED_STEPS
    later = served.get("runs")
    assert _steps_of(later) == LISTED_STEPS
    assert "damage" not in later["healthy"][TAG]


def test_two_writers_on_interleaved_steps_show_every_step(served, logdir):
    assert len(list((logdir.root / "interleaved").glob("*tfevents*"))) == 2
    heatmap = served.get("heatmap", run="interleaved", tag=TAG, stat=STAT)
    assert heatmap["steps"] == list(range(INTERLEAVED_STEPS))
    assert (heatmap["damaged"], heatmap["damage"]) == (0, [])


def test_the_first_runs_answer_lists_every_one_of_2000_tags_with_its_steps(served, logdir):
    many = served.first_runs["many"]
    assert len(logdir.many_tags) == len(set(logdir.many_tags)) == MANY_TAGS
    assert {tag: info["steps"] for tag, info in many.items()} == dict.fromkeys(
        logdir.many_tags, MANY_TAG_STEPS)
    assert not any("error" in info or "damage" in info for info in many.values())
