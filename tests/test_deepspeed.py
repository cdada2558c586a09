"""DeepSpeed ZeRO stages 1-3 on two CPU ranks over gloo, with gradient accumulation: the monitor
logs, once per optimizer step, exactly the statistics of the unsharded model on the same global
batches, under the user's parameter names, written by rank 0 alone (each run under a hard
timeout)."""

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format import columns
from processes import assert_succeeded
from test_torch_sharded import _norms, _run

pytest.importorskip("deepspeed")


@pytest.mark.parametrize("stage", ["1", "2", "3", "1-bf16"])
def test_zero_statistics_equal_the_unsharded_model(tmp_path, stage):
    # 1-bf16: the BF16 optimizer hands out whole gradients, not this rank's fragment (the
    # reference there is DeepSpeed's own full float32 gradient of the same bfloat16 model).
    results = _run(stage, 2, tmp_path, script="deepspeed_training.py")
    assert_succeeded(results, ["rank 0", "rank 1"])
    printed = _norms(results[0][1])
    runs = tg.read_logdir(str(tmp_path))
    sharded, reference = runs["sharded"]["gradients"], runs["reference"]["gradients"]
    assert sharded.variables == reference.variables == (
        "0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias")
    # One logged step per optimizer step: the first micro-batch of each is not logged.
    assert list(sharded.steps) == list(reference.steps) == [0, 1, 2]
    assert [p["logged"] for p in printed] == [[False, True]] * 3
    # As for the PyTorch engines: float32 sums of the ranks' and micro-batches' gradients in
    # another order, a few units of rounding per entry; rtol 1e-5 holds with room.
    # Every statistic at the first logged step, the norms after it (the default cadence); the
    # bf16 reference is written whole (GradientWriter.write) at every step.
    assert sharded.full_rows.tolist() == [True, False, False]
    expected = reference.values.copy()
    every_step = columns.every_step_stats(sharded.stat_names)
    sparse = [i for i, name in enumerate(reference.stat_names) if name not in every_step]
    expected[np.ix_(~sharded.full_rows, np.arange(len(reference.variables)), sparse)] = np.nan
    np.testing.assert_allclose(sharded.values, expected, rtol=1e-5, atol=1e-7)
    assert len(list((tmp_path / "sharded").glob("events.out.tfevents.*"))) == 1
    global_norms = np.sqrt(np.sum(sharded.stat("l2_norm").astype(np.float64) ** 2, axis=1))
    np.testing.assert_allclose(global_norms, [p["engine_norm"] for p in printed], rtol=1e-5)


def test_parameters_also_split_by_tensor_parallelism_are_refused(tmp_path):
    results = _run("1-tp", 2, tmp_path, script="deepspeed_training.py")
    assert_succeeded(results, ["rank 0", "rank 1"])
    for _, stdout, _ in results:
        assert "split by tensor or expert parallelism" in _norms(stdout)[0]["refused"]
