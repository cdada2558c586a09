"""Writing off the training thread: a `GradientWriter`'s events are built and written in order on
its background thread (`format.write_queue`); a disk that stalls makes it drop and count steps
instead of holding up the loop, and a fast loop is slowed to the writes' pace, never dropped."""

import logging
import threading

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format import event_files, write_queue, writer as writer_module

GRADIENTS = {"dense/kernel": np.ones((4, 4), np.float32), "dense/bias": np.ones(4, np.float32)}


def _logged_steps(logdir):
    return tg.read_logdir(str(logdir))["."]["gradients"].steps.tolist()


def _record_writing_threads(monkeypatch):
    """The threads that write events, in order, from now on."""
    threads = []
    original = event_files.EventFileWriter.write

    def recording(self, *events):
        threads.append(threading.current_thread())
        return original(self, *events)

    monkeypatch.setattr(event_files.EventFileWriter, "write", recording)
    return threads


def test_events_are_written_on_the_writers_thread_in_order(tmp_path, monkeypatch):
    threads = _record_writing_threads(monkeypatch)
    with tg.GradientWriter(str(tmp_path)) as writer:
        for step in range(50):
            writer.write(step, GRADIENTS, loss=1.0 / (step + 1))
            writer.write_scalars(step, {"lr": 0.1})
    assert threads and threading.main_thread() not in threads
    assert _logged_steps(tmp_path) == list(range(50))


def test_a_loop_faster_than_its_writes_is_slowed_to_their_pace_and_loses_nothing(tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(writer_module, "QUEUE_LENGTH", 3)
    original = event_files.EventFileWriter.write

    def slow(self, *events):  # each write 5 ms: the loop below outruns a queue of 3 at once
        threading.Event().wait(0.005)
        return original(self, *events)

    monkeypatch.setattr(event_files.EventFileWriter, "write", slow)
    with tg.GradientWriter(str(tmp_path)) as writer:
        for step in range(40):
            writer.write(step, GRADIENTS)
    assert writer.dropped_steps == 0
    assert _logged_steps(tmp_path) == list(range(40))


def test_a_stalled_disk_drops_and_counts_steps_instead_of_stopping_the_loop(tmp_path, monkeypatch,
                                                                           caplog):
    monkeypatch.setattr(writer_module, "QUEUE_LENGTH", 4)
    stalled, released = threading.Event(), threading.Event()
    original = event_files.EventFileWriter.write

    def stalling(self, *events):  # the first write hangs until released: a stalled mount
        if not stalled.is_set():
            stalled.set()
            released.wait()
        return original(self, *events)

    monkeypatch.setattr(event_files.EventFileWriter, "write", stalling)
    writer = tg.GradientWriter(str(tmp_path))

    def loop():
        for step in range(20):
            writer.write(step, GRADIENTS)

    with caplog.at_level(logging.ERROR, logger="tensorboard_gradients"):
        training = threading.Thread(target=loop)
        training.start()
        training.join(timeout=60)  # a hang guard: the loop must end while the disk is stalled
        assert not training.is_alive(), "the training loop waited for a stalled disk"
    # Step 0 is being written and steps 1-3 wait (the queue's 4 slots), steps 4-19 were dropped.
    assert writer.dropped_steps == 16
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "stuck waiting for the disk" in errors[0]
    assert "from step 4 on" in errors[0]
    released.set()
    writer.flush()  # the stall is over: the queue drains
    writer.write(20, GRADIENTS)  # the first write after the stall says how much was lost
    writer.close()
    assert _logged_steps(tmp_path) == [0, 1, 2, 3, 20]
    events = [e for name in sorted(tmp_path.iterdir())
              for e in event_files.read_events(str(name))]
    reported = [(e.step, v.tensor.float_val[0]) for e in events for v in e.summary.value
                if v.tag == "gradients/dropped_steps"]
    assert reported == [(20, 16)]


def test_strict_writes_on_the_calling_thread(tmp_path, monkeypatch):
    threads = _record_writing_threads(monkeypatch)
    with tg.GradientWriter(str(tmp_path), strict=True) as writer:
        writer.write(0, GRADIENTS)
    assert threads and set(threads) == {threading.main_thread()}


def test_the_thread_runs_jobs_in_batches_and_at_once_for_a_caller_that_waits():
    """Not a thread switch per job (per training step): the thread runs the queued jobs every
    `BATCH_SECONDS`, at once when a caller waits for them or the queue is half full."""
    # Its own name: the other tests look for idle writers' threads, and this one sleeps a minute.
    queue = write_queue.WriteQueue(limit=10, name="batches test", batch_seconds=60.0)
    done = []
    for index in range(3):
        queue.submit(lambda index=index: done.append(index))
    threading.Event().wait(0.2)
    assert done == []  # the next batch is a minute away
    waiting = threading.Thread(target=queue.wait)
    waiting.start()
    waiting.join(timeout=30)  # a hang guard: a waiting caller must not wait for the batch
    assert not waiting.is_alive() and done == [0, 1, 2]
    half_full = threading.Event()
    for index in range(3, 8):
        queue.submit(lambda index=index: done.append(index) or (index == 7 and half_full.set()))
    assert half_full.wait(timeout=30) and done == list(range(8))


def test_the_queue_runs_jobs_in_order_survives_a_failing_one_and_frees_its_thread(monkeypatch,
                                                                                 caplog):
    monkeypatch.setattr(write_queue, "IDLE_SECONDS", 0.01)
    queue = write_queue.WriteQueue(limit=10)
    done = []

    def failing():
        raise RuntimeError("a bug in a job")

    with caplog.at_level(logging.ERROR, logger="tensorboard_gradients"):
        tickets = [queue.submit(lambda: done.append(1)), queue.submit(failing),
                   queue.submit(lambda: done.append(2))]
        queue.wait()
    assert tickets == [1, 2, 3] and done == [1, 2] and queue.waiting == 0
    assert "a write failed" in caplog.text and "a bug in a job" in caplog.text
    # Idle, the thread ends; the next job starts another.
    for _ in range(500):
        if not any(t.name == "tensorboard-gradients writer" and t.is_alive()
                   for t in threading.enumerate()):
            break
        threading.Event().wait(0.01)
    else:
        pytest.fail("an idle queue kept its thread")
    queue.wait(queue.submit(lambda: done.append(3)))
    assert done == [1, 2, 3]
    with pytest.raises(ValueError):
        write_queue.WriteQueue(limit=0)


def test_a_steps_scalars_go_in_its_statistics_event(tmp_path):
    """`write_statistics(scalars=...)`: the monitors' per-step scalars share the step's event
    (one write instead of two), and TensorBoard reads them as `write_scalars`' own."""
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.util import tensor_util

    from tensorboard_gradients.format.layout import Layout

    layout = Layout.create(["w"], [(2,)], with_weights=False)
    with tg.GradientWriter(str(tmp_path)) as writer:
        for step in range(3):
            writer.write_statistics(step, layout, np.ones((1, len(layout.stats)), np.float32),
                                    scalars={"global_norm": 2.0 * step})
    events = [event for path in sorted(tmp_path.glob("events.*"))
              for event in event_file_loader.EventFileLoader(str(path)).Load()
              if event.summary.value]
    assert [(e.step, sorted(v.tag for v in e.summary.value)) for e in events] == [
        (step, ["gradients", "gradients/global_norm"]) for step in range(3)]
    loaded = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    read = loaded.Reload().Tensors("gradients/global_norm")
    assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in read] == [
        (0, 0.0), (1, 2.0), (2, 4.0)]


@pytest.mark.parametrize("strict", [False, True])
def test_a_matrix_left_to_finish_is_finished_on_the_writing_thread_and_written_with_its_scalars(
        tmp_path, strict):
    """`write_statistics_later`: the PyTorch monitor leaves a step's numpy finishing (and its
    global norm) to the writer's thread; what ``finish`` returns is what is written, its
    scalars beside the caller's, in the step's one event (on the caller's thread when
    ``strict``)."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    from tensorboard_gradients.format.layout import Layout

    layout = Layout.create(["w", "b"], [(2, 2), (2,)], with_weights=False)
    finished_on = []

    def finisher(step):
        def finish():
            finished_on.append(threading.current_thread())
            return np.full((2, len(layout.stats)), step, np.float32), {"global_norm": 3.0 * step}
        return finish

    with tg.GradientWriter(str(tmp_path), strict=strict) as writer:
        for step in range(1, 4):
            writer.write_statistics_later(step, layout, finisher(step), loss=0.5,
                                          scalars={"clip_coefficient": 1.0 / step})
    assert (threading.main_thread() in finished_on) is strict and len(finished_on) == 3
    series = tg.read_logdir(str(tmp_path))["."]["gradients"]
    assert series.steps.tolist() == [1, 2, 3]
    np.testing.assert_array_equal(series.stat("l2_norm"), [[1, 1], [2, 2], [3, 3]])
    loaded = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    loaded.Reload()
    scalars = {tag: [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                     for e in loaded.Tensors(tag)]
               for tag in ("gradients/global_norm", "gradients/clip_coefficient")}
    # float32 scalars: 1/3 as float32, compared exactly after the same rounding
    assert scalars == {
        "gradients/global_norm": [(1, 3.0), (2, 6.0), (3, 9.0)],
        "gradients/clip_coefficient": [(s, float(np.float32(1.0 / s))) for s in (1, 2, 3)]}


def test_a_finished_matrix_of_the_wrong_shape_is_not_written_and_says_why(tmp_path, caplog):
    """A ``finish`` that returns a matrix its layout does not describe: that step is left out
    (readers would misread it), the writer's thread says why, and the next step is written."""
    from tensorboard_gradients.format.layout import Layout

    layout = Layout.create(["w"], [(2,)], with_weights=False)
    width = len(layout.stats)
    with caplog.at_level(logging.ERROR, logger="tensorboard_gradients"):
        with tg.GradientWriter(str(tmp_path)) as writer:
            for step, rows in ((0, 1), (1, 2), (2, 1)):
                writer.write_statistics_later(
                    step, layout, lambda rows=rows: (np.ones((rows, width), np.float32), {}))
    assert "stats matrix has shape (2, " in caplog.text
    assert _logged_steps(tmp_path) == [0, 2]
    with pytest.raises(ValueError, match="stats matrix has shape"):  # the caller's own thread
        tg.GradientWriter(str(tmp_path), strict=True).write_statistics_later(
            3, layout, lambda: (np.ones((2, width), np.float32), {}))
