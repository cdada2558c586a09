"""TensorFlow multi-worker training (`MultiWorkerMirroredStrategy`, two worker processes on
loopback via TF_CONFIG) with a custom loop and `summary.gradients(..., writer=GradientWriter)`:
the statistics of the all-reduced gradients are written once, by the chief (worker 0), worker 1
writes nothing, and every logged value equals an unsharded single-process run on the same global
batches from the same initial weights. Each run is under a hard timeout, so a hang fails.

Keras ``model.fit`` is not covered: on TF 2.21 / Keras 3.15 it does not run under this strategy
with two workers, with or without the monitor. ``fit`` first calls
``strategy.reduce("MEAN", (x, y), axis=None)`` on a structure of ``PerReplica`` batches
(``keras/src/backend/tensorflow/trainer.py``, ``_maybe_symbolic_build``), which
``CollectiveAllReduceExtended._reduce_to`` cannot take with more than one worker: "ValueError:
Attempt to convert a value (PerReplica:{...}) with an unsupported type (<class
'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."; past that, its step's
``reduce_per_replica`` calls ``strategy.reduce("MEAN", loss, axis=0)`` on the scalar loss:
"Invalid reduction dimension 0 for input with 0 dimensions".
"""

import json
import os
import pathlib
import sys

import numpy as np
import pytest

import tensorboard_gradients as tg
from processes import assert_succeeded, free_ports, run_processes

pytest.importorskip("tensorflow")
SCRIPT = pathlib.Path(__file__).with_name("tf_multiworker_training.py")
WORKERS = 2
ENVIRONMENT = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
               "KERAS_BACKEND": "tensorflow"}


def _train(logdir):
    """Runs both workers; returns their printed JSON reports."""
    ports = ",".join(free_ports(WORKERS))
    results = run_processes(
        [[sys.executable, str(SCRIPT), str(task), ports, str(logdir)] for task in range(WORKERS)],
        f"MultiWorkerMirroredStrategy on {WORKERS} workers", env={**os.environ, **ENVIRONMENT})
    assert_succeeded(results, [f"worker {task}" for task in range(WORKERS)])
    reports = [[json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
               for _, stdout, _ in results]
    assert all(len(report) == 1 for report in reports), reports
    return [report[0] for report in reports]


def test_multiworker_statistics_are_written_once_by_the_chief(tmp_path):
    chief, worker = _train(tmp_path)
    runs = tg.read_logdir(str(tmp_path))
    assert sorted(runs) == ["multiworker", "reference", "returned"]
    logged, returned = runs["multiworker"]["gradients"], runs["returned"]["gradients"]
    reference = runs["reference"]["gradients"]

    # The op ran on both workers; only the chief's replica wrote, in and outside strategy.run.
    assert chief["written"] == chief["returned_written"] == [True] * 3
    assert worker["written"] == worker["returned_written"] == [False] * 3
    # Every file under the logdir is the chief's (event file names carry the writer's pid): one
    # event file per run, and worker 1 created no file and no directory.
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert [f.parent.name for f in files] == ["multiworker", "reference", "returned"], files
    assert all(f.name.startswith("events.out.tfevents.") and f".{chief['pid']}." in f.name
               for f in files), (files, chief["pid"])
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_dir()) == [
        pathlib.Path("multiworker"), pathlib.Path("reference"), pathlib.Path("returned")]

    names = ("mlp/hidden/kernel", "mlp/hidden/bias", "mlp/middle/kernel", "mlp/middle/bias",
             "mlp/out/kernel", "mlp/out/bias")
    for series in (logged, returned):
        assert series.variables == reference.variables == names
        assert list(series.steps) == list(reference.steps) == [1, 2, 3]
        assert series.stat_names == reference.stat_names
        assert "weight_l2_norm" in series.stat_names
        # Each worker's gradient is a float32 mean over its half of the batch, scaled by
        # 1/global batch, then summed across workers; the reference takes one float32 sum over
        # the whole batch. The two differ only by the order of float32 additions: a few units of
        # float32 rounding (eps = 1.2e-7) per entry, amplified at most by the number of terms
        # (4-8 rows, <= 10 products per matmul entry) and carried into steps 2 and 3 through the
        # weights, so rtol 1e-5 holds with room while any real error (a missing worker, a
        # gradient counted twice, a per-worker instead of a global batch) is off by >= 10%.
        # Exact zeros (ReLU) and counts are equal either way.
        np.testing.assert_allclose(series.values, reference.values, rtol=1e-5, atol=1e-7)
        np.testing.assert_array_equal(series.stat("size"), reference.stat("size"))
        np.testing.assert_array_equal(series.stat("zero_fraction"), reference.stat("zero_fraction"))
    # The histograms (logged at every step) count the same entries in every log10|g| bin.
    assert list(logged.histograms.steps) == list(reference.histograms.steps) == [1, 2, 3]
    np.testing.assert_array_equal(logged.histograms.counts, reference.histograms.counts)
