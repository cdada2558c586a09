"""JAX gradients sharded over a device mesh: `log_gradients` logs the same statistics as for the
unsharded gradients, histogram counts included, and XLA gathers no parameter to compute them,
with or without the histograms (only the small matrices reach the host). Runs in a fresh process
with 8 host CPU devices, under a hard timeout."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import tensorboard_gradients as tg

pytest.importorskip("jax")
SCRIPT = pathlib.Path(__file__).with_name("jax_mesh_training.py")


def test_mesh_sharded_gradients_log_the_unsharded_statistics_without_gathering(tmp_path):
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True,
                              text=True, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the JAX mesh run did not finish in 240 s (a hang)")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["all_gathers"] == 0
    # The histogram counts too: per-shard partial counts added by an all-reduce, no gather.
    assert result["all_gathers_with_histograms"] == 0
    runs = tg.read_logdir(str(tmp_path))
    sharded, reference = runs["sharded"]["gradients"], runs["reference"]["gradients"]
    assert sharded.variables == reference.variables == (
        "dense_0/bias", "dense_0/kernel", "dense_1/bias", "dense_1/kernel")
    # Sharded reductions add partial sums in another order: float32 rounding, far below 1e-5.
    np.testing.assert_allclose(sharded.values, reference.values, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(sharded.histograms.counts, reference.histograms.counts)
    # Called inside a jitted train step: the same statistics, written by the step's callback
    # (histograms on the even steps, a traced condition), and the step gathers no more than
    # the same step without logging.
    inside = runs["inside_jit"]["gradients"]
    assert inside.variables == reference.variables and list(inside.steps) == [0, 1, 2]
    np.testing.assert_allclose(inside.values, reference.values, rtol=1e-5, atol=1e-7)
    assert list(inside.histograms.steps) == [0, 2]
    np.testing.assert_array_equal(inside.histograms.counts, reference.histograms.counts[[0, 2]])
    assert result["step_all_gathers_logging"] == result["step_all_gathers_not_logging"]
