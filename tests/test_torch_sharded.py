"""PyTorch sharded training (FSDP2, HSDP, tensor parallel, FSDP + TP, FSDP1 full and hybrid
sharding, gradient accumulation) on CPU ranks over gloo: the monitor logs exactly the statistics
of the unsharded model on the same global batches, under the user's parameter names, written by
rank 0 alone, and never hangs (each run under a hard timeout); a rank that breaks step with the
others makes the job fail, not hang or log mixed steps."""

import json
import os
import pathlib
import sys

import numpy as np
import pytest

import tensorboard_gradients as tg
from processes import assert_succeeded, free_ports, run_processes

pytest.importorskip("torch.distributed.fsdp")
SCRIPT = pathlib.Path(__file__).with_name("sharded_torch_training.py")


def _run(engine, world, logdir, group_timeout_s=60, script=SCRIPT.name):
    """Runs every rank of `script` (in tests/); returns [(returncode, stdout, stderr)]."""
    port = free_ports()[0]
    environment = dict(os.environ, GROUP_TIMEOUT_S=str(group_timeout_s))
    return run_processes(
        [[sys.executable, str(SCRIPT.with_name(script)), engine, str(rank), str(world), port,
          str(logdir)] for rank in range(world)],
        f"{engine} on {world} ranks", env=environment)


def _norms(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _train(engine, world, logdir):
    """Runs every rank, which must succeed; returns rank 0's printed norms."""
    results = _run(engine, world, logdir)
    assert_succeeded(results, [f"rank {rank}" for rank in range(world)])
    return _norms(results[0][1])


@pytest.mark.parametrize("engine,world", [
    ("fsdp2", 2), ("fsdp2", 4), ("hsdp", 4), ("tp", 2), ("fsdp_tp", 4),
    ("fsdp1", 2), ("fsdp1_hybrid", 4), ("fsdp2_accumulate", 2), ("fsdp1_accumulate", 2),
    ("fsdp2_clip", 2), ("fsdp1_clip", 2), ("hsdp_clip", 4), ("tp_clip", 2), ("fsdp_tp_clip", 4),
])
def test_sharded_statistics_equal_the_unsharded_model(tmp_path, engine, world):
    norms = _train(engine, world, tmp_path)
    runs = tg.read_logdir(str(tmp_path))
    sharded, reference = runs["sharded"]["gradients"], runs["reference"]["gradients"]
    assert sharded.variables == reference.variables == (
        "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias")
    assert list(sharded.steps) == list(reference.steps) == [0, 1, 2]
    assert sharded.stat_names == reference.stat_names
    # The gradients themselves differ by the order of the ranks' float32 reductions (a mean of
    # per-rank means, reduce-scatter sums): a few units of float32 rounding per entry, so the
    # issue's rtol 1e-5 holds with room; exact zeros and counts are equal.
    np.testing.assert_allclose(sharded.values, reference.values, rtol=1e-5, atol=1e-7)
    # Only rank 0 wrote: one event file in the sharded run.
    assert len(list((tmp_path / "sharded").glob("events.out.tfevents.*"))) == 1
    # The global norm of the logged per-layer norms is the engine's own clip_grad_norm_ total
    # (where PyTorch can compute it on these gradients) and the unsharded model's.
    global_norms = np.sqrt(np.sum(sharded.stat("l2_norm").astype(np.float64) ** 2, axis=1))
    for logged, printed in zip(global_norms, norms):
        assert logged == pytest.approx(printed["reference_norm"], rel=1e-5)
        if printed["clip_norm"] is not None:
            assert logged == pytest.approx(printed["clip_norm"], rel=1e-5)
    if engine.endswith("_clip"):  # trained clipped (the later steps' equality says alike)
        assert all(printed["reference_norm"] > 0.05 for printed in norms)
        # The clip and the logged step share ONE collective (the monitor's gather), where
        # PyTorch's own clip (or FSDP1's) alone takes at least one (the counter sees them);
        # the first step adds the monitor's one check that every rank watches alike.
        assert [printed["collectives"] for printed in norms] == [2] + [1] * (len(norms) - 1)
        if printed["pytorch_collectives"] is not None:
            assert all(printed["pytorch_collectives"] >= 1 for printed in norms)


def test_a_step_not_logged_is_clipped_by_pytorch_and_trains_alike(tmp_path):
    # Logged every 2nd step: step 1's clip is PyTorch's (its collective, no gather).
    norms = _train("fsdp2_clip_every2", 2, tmp_path)
    runs = tg.read_logdir(str(tmp_path))
    sharded, reference = runs["sharded"]["gradients"], runs["reference"]["gradients"]
    assert list(sharded.steps) == [0, 2]
    # Step 2's gradients follow the weights step 1's clip left: equal to the reference's, as
    # in `test_sharded_statistics_equal_the_unsharded_model`.
    np.testing.assert_allclose(sharded.values, reference.values[[0, 2]], rtol=1e-5, atol=1e-7)
    # Step 0: the gather and the monitor's first-step check; step 1: PyTorch's own clip.
    assert [printed["collectives"] >= 1 for printed in norms] == [True] * 3
    assert (norms[0]["collectives"], norms[2]["collectives"]) == (2, 1)
    for printed in norms:
        assert printed["clip_norm"] == pytest.approx(printed["reference_norm"], rel=1e-5)


def test_a_non_finite_total_raises_on_every_rank_after_logging_and_scales_nothing(tmp_path):
    # Rank 1 alone holds the NaN: the total every rank settles from the gather is NaN, so every
    # rank raises as PyTorch's error_if_nonfinite does (none is left waiting in a collective).
    results = _run("fsdp2_clip_nonfinite", 2, tmp_path)
    assert_succeeded(results, ["rank 0", "rank 1"])
    for _, stdout, _ in results:
        [printed] = [line for line in _norms(stdout) if "refused" in line]
        assert "is non-finite, so it cannot be clipped" in printed["refused"]
        assert printed["unchanged"]
    sharded = tg.read_logdir(str(tmp_path))["sharded"]["gradients"]
    assert list(sharded.steps) == [0, 1]  # the step is logged before the error
    assert sharded.stat("nan_count")[:, sharded.variables.index("0.weight")].tolist() == [0, 1]


def test_a_rank_that_skips_a_step_fails_the_job_at_the_group_timeout_instead_of_hanging(tmp_path):
    # Rank 1 leaves out monitor.step() at step 1: rank 0 waits in the monitor's gather, rank 1 in
    # FSDP's next collective; the process group's timeout (10 s here) turns that into an error.
    results = _run("fsdp2_skip", 2, tmp_path, group_timeout_s=10)
    # Every rank fails (none hangs, none carries on); the first to reach the timeout says so,
    # and the other may instead fail on its peer's exit (gloo: connection closed, or an abort).
    assert all(returncode != 0 for returncode, _, _ in results), results
    assert any("Timed out" in stderr for _, _, stderr in results), [e[-3000:] for *_, e in results]
    # What was logged before is intact: step 0, equal to the reference.
    runs = tg.read_logdir(str(tmp_path))
    sharded, reference = runs["sharded"]["gradients"], runs["reference"]["gradients"]
    assert list(sharded.steps) == [0]
    np.testing.assert_allclose(sharded.values, reference.values[:1], rtol=1e-5, atol=1e-7)


def test_ranks_logging_different_steps_are_refused_not_mixed(tmp_path):
    results = _run("fsdp2_misnumbered", 2, tmp_path)
    assert_succeeded(results, ["rank 0", "rank 1"])
    assert "step 1 not logged: the ranks sent the gradients of steps [1, 101]" in results[0][2]
    sharded = tg.read_logdir(str(tmp_path))["sharded"]["gradients"]
    assert list(sharded.steps) == [0, 2]


def test_fsdp1_without_original_parameters_is_refused_with_the_fix(tmp_path):
    script = tmp_path / "flat.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "from torch.distributed.fsdp import FullyShardedDataParallel\n"
        "from tensorboard_gradients.torch import GradientMonitor\n"
        f"os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='{free_ports()[0]}')\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "model = FullyShardedDataParallel(torch.nn.Linear(3, 2), device_id=torch.device('cpu'))\n"
        "try:\n"
        "    GradientMonitor(model, 'unused')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "dist.destroy_process_group()\n")
    [(returncode, stdout, stderr)] = run_processes([[sys.executable, str(script)]], "FSDP1 check")
    assert returncode == 0, stderr[-3000:]
    assert "wrap with use_orig_params=True" in stdout


def test_ranks_watching_different_parameters_all_fail_at_once_not_hang(tmp_path):
    results = _run("fsdp2_unequal", 2, tmp_path)
    for rank, (returncode, _, stderr) in enumerate(results):
        assert returncode != 0 and "every rank must watch the same parameters" in stderr, (
            rank, stderr[-3000:])
