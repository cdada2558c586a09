"""Writers to buckets (issue 37): `GradientWriter` and the monitors take an fsspec URL and upload
the run as segments (`format.segments`), against real servers on loopback (moto's S3 server, a
GCS emulator: `object_stores`): the bucket reads back as the same run written to a directory,
across segments, after a crash, and a store that does not answer never stops training."""

import glob
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import tensorboard_gradients as tg
from object_stores import BUCKET, SCHEMES, SECRET, stores_with_buckets
from processes import free_ports
from tensorboard_gradients.format import event_files, metadata, reader, segments
from test_long_runs_served import _get, _plugin_busy
from test_object_storage import assert_same_series, gradients_app, train_torch_run

# What differs between two digests of the same steps: which writer wrote them.
NOT_SAME = {"writer"}
# Every child process here ends in seconds; a hang fails the test instead of eating CI's time.
CHILD_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stores():
    with stores_with_buckets() as started:
        yield started


def objects(stores, url):
    """The event files under ``url``, as URLs, in name order."""
    scheme, path = url.split("://")
    fs = stores.filesystem(scheme)
    fs.invalidate_cache()
    return [f"{scheme}://{name}" for name in sorted(fs.find(path))
            if event_files.is_event_file(name)]


def digest_records(urls):
    """``(step, digest)`` of every digest record in the files ``urls``, in their order."""
    found = []
    for url in urls:
        for event in event_files.read_events(url):
            for value in event.summary.value:
                if value.tag.endswith(metadata.DIGEST_TAG_SUFFIX):
                    found.append((event.step,
                                  metadata.decode_digest(value.tensor.string_val[0])))
    return found


def run_child(code, stores, **environment):
    """Runs ``code`` in a fresh Python with the stores' variables; returns the finished process."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S,
                          env=stores.child_environment(**environment))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_torch_run_in_a_bucket_reads_as_the_same_run_on_disk(stores, tmp_path, scheme):
    url = f"{scheme}://{BUCKET}/torch-{scheme}"
    train_torch_run(str(tmp_path / "run"))
    train_torch_run(url)
    [segment] = objects(stores, url)  # a short run: one segment, uploaded at close
    assert segment.endswith(".s00000000.gradients")
    local = reader.read_logdir(str(tmp_path / "run"))
    assert len(local["."]["gradients"].steps) == 60
    assert len(local["."]["gradients"].histograms.steps) == 3
    assert_same_series(local, reader.read_logdir(url), wall_times=False)


@pytest.fixture(scope="module")
def long_run(stores, tmp_path_factory):
    """``(directory, URL)``: the same 1,200 steps of a torch run written to each, the bucket's
    in segments of 64 KiB (several, and a digest record every 1,000 steps and at close)."""
    local = tmp_path_factory.mktemp("long")
    url = f"s3://{BUCKET}/long"
    train_torch_run(str(local / "run"), steps=1200)
    kept, segments.SEGMENT_BYTES = segments.SEGMENT_BYTES, 64 << 10
    try:
        train_torch_run(url + "/run", steps=1200)
    finally:
        segments.SEGMENT_BYTES = kept
    return str(local), url


def test_a_long_run_is_several_segments_read_as_one_run_with_its_digest(stores, long_run):
    local, url = long_run
    found = objects(stores, url)
    sizes = [stores.filesystem("s3").size(name) for name in found]
    assert len(found) >= 4 and all(size >= 64 << 10 for size in sizes[:-1])
    for name in found:  # each segment a whole event file: its version record first, undamaged
        damage = event_files.ReadDamage()
        events = list(event_files.read_events(name, damage))
        assert events[0].file_version == "brain.Event:2" and not damage
    assert_same_series(reader.read_logdir(local), reader.read_logdir(url), wall_times=False)
    local_digest = digest_records(sorted(glob.glob(os.path.join(local, "run", "*"))))
    assert [step for step, _ in local_digest] == [999, 1199]  # every 1,000 steps and at close
    remote_digest = digest_records(found)
    assert [step for step, _ in remote_digest] == [999, 1199]
    for (_, here), (_, there) in zip(local_digest, remote_digest):
        assert here.keys() == there.keys()
        np.testing.assert_equal({k: v for k, v in here.items() if k not in NOT_SAME},
                                {k: v for k, v in there.items() if k not in NOT_SAME})
    # A digest record covers the steps of the segments before its own.
    assert segments.precedes(found[0], found[-1]) and not segments.precedes(found[-1], found[0])


def test_the_plugin_opens_a_long_run_in_segments_from_the_writers_digest(long_run,
                                                                        monkeypatch):
    client = gradients_app(long_run[1])
    with _plugin_busy(client, monkeypatch) as fed:
        long = _get(client, "alerts", True, monkeypatch)
        assert long["steps_to_read"] == 0 and fed == []  # no step judged again
        assert long == _get(client, "alerts", False, monkeypatch)


def test_a_segment_goes_up_when_due_without_another_write(stores, monkeypatch):
    monkeypatch.setattr(segments, "SEGMENT_SECONDS", 0.3)
    url = f"gs://{BUCKET}/idle"
    writer = tg.GradientWriter(url)
    for step in range(5):
        writer.write(step, {"dense/kernel": np.full((3, 2), step + 1.0)})
    deadline = time.monotonic() + 10
    while not objects(stores, url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(reader.read_logdir(url)["."]["gradients"].steps) == 5  # before close
    writer.close()


def test_a_store_that_comes_back_gets_what_it_missed(stores, monkeypatch, caplog):
    """Uploads to a bucket that does not exist yet fail and are kept, the oldest given up past
    KEPT_BYTES (counted as dropped); once the bucket exists the rest goes up, in order."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 1)  # a segment per write
    monkeypatch.setattr(segments, "KEPT_BYTES", 8 << 10)
    url = "s3://late-bucket/run"
    writer = tg.GradientWriter(url)
    gradients = {"dense/kernel": np.ones((8, 8))}
    with caplog.at_level(logging.WARNING):
        for step in range(40):
            writer.write(step, gradients)
        writer.flush()
        dropped = writer.dropped_steps
        assert 0 < dropped < 40
        stores.filesystem("s3").mkdir("late-bucket")
        writer.write(40, gradients)
        writer.close()
    series = reader.read_logdir(url)["."]["gradients"]
    assert list(series.steps) == list(range(dropped, 41))  # the newest kept, none torn
    assert writer.dropped_steps == dropped
    messages = [record.getMessage() for record in caplog.records]
    assert sum("cannot upload to s3://late-bucket/run" in m for m in messages) == 1
    assert any("no such bucket" in m for m in messages)
    assert any("uploads to s3://late-bucket/run again" in m for m in messages)


def test_strict_raises_the_upload_error_naming_the_url(stores, monkeypatch):
    # Kept from the uploads at exit: its segment, never uploaded, would be tried again then.
    monkeypatch.setattr(segments, "_LIVE", weakref.WeakSet())
    writer = tg.GradientWriter("s3://no-such-bucket/run", strict=True)
    writer.write(0, {"dense/kernel": np.ones(3)})  # held in memory: nothing to fail yet
    with pytest.raises(FileNotFoundError, match="cannot write 's3://no-such-bucket/run/events"):
        writer.flush()


def test_a_killed_run_loses_at_most_the_segment_not_yet_uploaded(stores):
    url = f"s3://{BUCKET}/killed"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        import numpy as np
        import tensorboard_gradients as tg
        from tensorboard_gradients.format import segments
        segments.SEGMENT_SECONDS = 0.2  # segments also end between the flushes
        writer = tg.GradientWriter({url!r})
        for step in range(100000):
            writer.write(step, {{"dense/kernel": np.full((4, 4), step + 1.0)}})
            time.sleep(0.002)
            if step % 20 == 19:
                writer.flush()
                print("flushed", step, flush=True)
        """)], stdout=subprocess.PIPE, text=True, env=stores.child_environment())
    watchdog = threading.Timer(CHILD_TIMEOUT_S, child.kill)  # a hang ends the reads below
    watchdog.start()
    try:
        flushed = [int(child.stdout.readline().split()[1]) for _ in range(4)]
        time.sleep(0.05)  # killed between flushes, a segment being filled
        child.send_signal(signal.SIGKILL)
        flushed += [int(line.split()[1]) for line in child.stdout.read().split("\n") if line]
    finally:
        watchdog.cancel()
        child.kill()
        child.wait(CHILD_TIMEOUT_S)
    found = objects(stores, url)
    assert len(found) >= 4
    for name in found:  # whole objects only
        damage = event_files.ReadDamage()
        list(event_files.read_events(name, damage))
        assert not damage
    steps = list(reader.read_logdir(url)["."]["gradients"].steps)
    assert steps == list(range(len(steps)))  # no gap
    assert len(steps) > flushed[-1]  # every step flushed is there: only the rest was lost


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_run_that_never_closes_its_writer_keeps_its_last_steps(stores, scheme):
    url = f"{scheme}://{BUCKET}/unclosed"
    child = run_child(f"""
        import numpy as np
        import tensorboard_gradients as tg
        writer = tg.GradientWriter({url!r})
        for step in range(30):
            writer.write(step, {{"dense/kernel": np.ones((2, 2))}})
        """, stores)
    assert child.returncode == 0, child.stderr
    assert list(reader.read_logdir(url)["."]["gradients"].steps) == list(range(30))


def test_an_unreachable_store_drops_and_counts_steps_and_training_goes_on(stores):
    dead_port, = free_ports(1)  # bound and released: nothing listens there
    url = f"s3://{BUCKET}/unreachable"
    started = time.monotonic()
    child = run_child(f"""
        import torch
        from tensorboard_gradients.torch import GradientMonitor
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        with GradientMonitor(model, {url!r}) as monitor:
            for _ in range(40):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                monitor.step(loss=loss)
                optimizer.step()
        print("dropped", monitor.dropped_steps)
        """, stores, AWS_ENDPOINT_URL=f"http://127.0.0.1:{dead_port}")
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["dropped", "40"]
    assert f"cannot write to {url} (cannot write '{url}/events.out.tfevents." in child.stderr
    assert f"40 step(s) could not be written to {url}" in child.stderr
    assert "Traceback" not in child.stderr and SECRET not in child.stderr + child.stdout
    assert time.monotonic() - started < 60


def test_a_keras_fit_logs_to_a_bucket(stores):
    url = f"s3://{BUCKET}/keras"
    child = run_child(f"""
        import os
        os.environ["KERAS_BACKEND"] = "tensorflow"
        import numpy as np
        import keras
        from tensorboard_gradients.keras import GradientMonitor
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        x, y = np.random.rand(64, 4), np.random.rand(64, 1)
        model.fit(x, y, batch_size=16, epochs=3, verbose=0,
                  callbacks=[GradientMonitor({url!r}, histograms_every_n_steps=4)])
        """, stores, TF_CPP_MIN_LOG_LEVEL="3")
    assert child.returncode == 0, child.stderr
    series = reader.read_logdir(url)["train"]["gradients"]
    assert list(series.steps) == list(range(1, 13))  # 3 epochs of 4 batches
    assert len(series.variables) == 4 and np.isfinite(series.values).any()
    assert len(series.histograms.steps) > 0


def test_a_restarted_job_with_other_variables_writes_another_tag_in_the_bucket(stores):
    """A second writer joining a bucket run reads the tags the first left there: another
    variable set goes under ``<name>_varset2``, never under the first's names."""
    url = f"s3://{BUCKET}/restarted"
    with tg.GradientWriter(url) as first:
        for step in range(3):
            first.write(step, {"a/w": np.ones(4), "b/w": np.ones(4)})
    with tg.GradientWriter(url) as restarted:
        for step in range(3, 6):
            restarted.write(step, {"c/w": np.ones(4)})
    run = reader.read_logdir(url)["."]
    assert {tag: series.variables for tag, series in run.items()} == {
        "gradients": ("a/w", "b/w"), "gradients_varset2": ("c/w",)}
