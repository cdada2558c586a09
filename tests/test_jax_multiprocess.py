"""Multi-process JAX (2 CPU processes x 4 host devices, one global data x model mesh, gloo
collectives): `log_gradients` called by the same code on every process logs exactly the
statistics of the unsharded model on the same global batch and weights, histogram counts
included, written by process 0 alone; never hangs (every process under a hard timeout)."""

import json
import os
import pathlib
import socket
import sys

import numpy as np
import pytest

import tensorboard_gradients as tg
from processes import assert_succeeded, free_ports, run_processes

pytest.importorskip("jax")
SCRIPT = pathlib.Path(__file__).with_name("jax_multiprocess_training.py")
PROCESSES = 2


def _run_all(logdir):
    """Runs the 2 processes and the single-process reference; returns their printed JSON
    results, in that order."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the scripts set their own device counts
    env.pop("JAX_PLATFORMS", None)
    port = free_ports()[0]
    commands = [[sys.executable, str(SCRIPT), str(process), port, str(logdir)]
                for process in range(PROCESSES)]
    commands.append([sys.executable, str(SCRIPT), "reference", str(logdir)])
    results = run_processes(commands, "the multi-process JAX run", env=env)
    assert_succeeded(results, [f"process {i}" for i in range(PROCESSES)] + ["reference"])
    return [json.loads(stdout.strip().splitlines()[-1]) for _, stdout, _ in results]


def test_multiprocess_gradients_log_the_unsharded_statistics_from_process_0_only(tmp_path):
    results = _run_all(tmp_path)
    first, second, reference_run = results
    for index, result in enumerate(results[:PROCESSES]):
        assert (result["process"], result["processes"]) == (index, PROCESSES)
        assert (result["devices"], result["local_devices"]) == (8, 4)
        # The small result matrices come out fully replicated: read locally, no gather.
        assert result["matrices_replicated"] and result["gather_ok"]
        # Statistics and histograms of the global gradients: partial results all-reduced
        # within and across the processes, no gradient gathered.
        assert result["all_gathers"] == 0
    assert reference_run["devices"] == 1
    # Process 0 returns the tag it wrote to; the other process computed, wrote nothing: None.
    assert first["returned"] == reference_run["returned"] == ["gradients"] * 3
    assert second["returned"] == [None] * 3

    # One event file in all, process 0's (the pid is in its name), in the shared run directory;
    # process 1's writer created no file and no directory (process_1 does not exist).
    events = sorted(tmp_path.rglob("*tfevents*"))
    assert sorted(path.parent.name for path in events) == ["process_0", "reference", "sharded"]
    sharded_events = [path for path in events if path.parent.name == "sharded"]
    assert f".{socket.gethostname()}.{first['pid']}." in sharded_events[0].name
    assert sorted(path.name for path in tmp_path.iterdir()) == ["process_0", "reference", "sharded"]

    runs = tg.read_logdir(str(tmp_path))
    sharded, reference = runs["sharded"]["gradients"], runs["reference"]["gradients"]
    assert sharded.variables == reference.variables == (
        "dense_0/bias", "dense_0/kernel", "dense_1/bias", "dense_1/kernel")
    assert list(sharded.steps) == list(reference.steps) == [0, 1, 2]
    assert sharded.stat_names == reference.stat_names
    # rtol 1e-5: the sharded gradients and statistics are the same float32 sums added in
    # another order (per-device partial sums joined by all-reduces within and across the
    # processes, vs. one device's loop), i.e. a few float32 roundings (~1e-7 relative) apart;
    # counts (sizes, zeros, NaN/Inf) are exact.
    np.testing.assert_allclose(sharded.values, reference.values, rtol=1e-5, atol=1e-7)
    # Histogram counts are integers: exactly equal (bins of |g| in whole half-decades).
    assert sharded.histograms.steps.tolist() == reference.histograms.steps.tolist() == [0, 2]
    np.testing.assert_array_equal(sharded.histograms.counts, reference.histograms.counts)
