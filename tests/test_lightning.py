"""`tensorboard_gradients.lightning.GradientMonitor` in real Lightning training on CPU: the logged
statistics are the gradients the LightningModule sees at each optimizer step (measured in the
module, tests/lightning_training.py), at the step where Lightning logs that step's loss, in the
TensorBoardLogger's run; gradient accumulation, bf16 and float16 mixed precision (the loss
scale, a step the GradScaler skips), clipping by norm (in the monitor's pass) and by value (the
clipped norm measured),
the schedules, manual optimization with two optimizers; DDP and FSDP on 2 CPU ranks over gloo
(each under a hard timeout) log what one process logs on the same global batches."""

import json
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("lightning")
pytest.importorskip("torch.distributed.fsdp")

import tensorboard_gradients as tg  # noqa: E402
import lightning_training as training  # noqa: E402
from processes import assert_succeeded, free_ports, run_processes  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

SCRIPT = pathlib.Path(training.__file__)
NAMES = ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net.4.weight", "net.4.bias")
RTOL = 1e-5


def _scalars(run_dir):
    """{tag: {step: value}} of every scalar in the run: the logger's (``train_loss``) and the
    monitor's (``gradients/global_norm``, ...), read by TensorBoard's own loader."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    loaded = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    found = {tag: {e.step: e.value for e in loaded.Scalars(tag)}
             for tag in loaded.Tags()["scalars"]}
    for tag in loaded.Tags()["tensors"]:
        events = loaded.Tensors(tag)
        if events and not tensor_util.make_ndarray(events[0].tensor_proto).shape:
            found[tag] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events}
    return found


def _fit(tmp_path, **config):
    rows, trainer, callback = training.train(str(tmp_path), **config)
    return rows, tg.read_logdir(str(tmp_path)), _scalars(tmp_path / "run")


def _check_logged_as_measured(rows, series, scalars, clipped):
    """The statistics, steps, epochs and norms logged equal what the module measured (where its
    gradients are finite: the logged norms are those of the finite entries)."""
    steps = [row["step"] for row in rows]
    assert series.variables == NAMES
    assert list(series.steps) == steps == sorted(scalars["train_loss"])  # the loss's steps
    finite = [i for i, row in enumerate(rows) if np.isfinite(row["norm"])]
    np.testing.assert_allclose(series.stat("l2_norm")[finite],
                               [rows[i]["norms"] for i in finite], rtol=RTOL)
    np.testing.assert_allclose([scalars["gradients/global_norm"][steps[i]] for i in finite],
                               [rows[i]["norm"] for i in finite], rtol=RTOL)
    first_steps = {}
    for row in rows:
        first_steps.setdefault(row["epoch"], row["step"])
    assert list(series.epoch_starts) == list(first_steps.values())
    assert list(series.epoch_indices) == list(first_steps)
    if clipped:
        logged = scalars["gradients/global_norm_clipped"]
        measured = {row["step"]: row["clipped"] for row in rows if row["clipped"] is not None}
        # Lightning's clip by norm is the monitor's: its clipped norm is global_norm x the clip
        # coefficient, the measured one a float32 norm of the clipped gradients (each entry
        # multiplied by the coefficient, one rounding): equal to within RTOL. A step the
        # GradScaler skips has none measured, and logs NaN (its Inf gradients times 0).
        assert {step: logged[step] for step in measured} == pytest.approx(measured, rel=RTOL)
        assert all(np.isnan(logged[step]) for step in set(logged) - set(measured))
    else:
        assert "gradients/global_norm_clipped" not in scalars


@pytest.mark.parametrize("config", [
    {},
    {"precision": "bf16-mixed", "accumulate": 2, "clip": 0.05},
    {"accumulate": 2, "clip": 0.01, "clip_algorithm": "value"},
], ids=["plain", "bf16_accumulate_clip_norm", "accumulate_clip_value"])
def test_the_gradients_of_each_optimizer_step_are_logged_at_its_loss_step(tmp_path, config):
    rows, runs, scalars = _fit(tmp_path, **config)
    # One optimizer step per global batch, or per 2 under accumulation (the epoch's last batch
    # steps alone: 3 batches per epoch), numbered as Lightning numbers the logged loss.
    optimizer_steps = 6 if config.get("accumulate", 1) == 1 else 4
    assert [row["step"] for row in rows] == list(range(optimizer_steps))
    # In automatic optimization that is also trainer.global_step at on_before_optimizer_step.
    assert [row["global_step"] for row in rows] == [row["step"] for row in rows]
    assert list(runs) == ["run"]  # the TensorBoardLogger's run: the loss's
    series = runs["run"]["gradients"]
    _check_logged_as_measured(rows, series, scalars, clipped="clip" in config)
    # The loss training_step returned for the batch completing each step, beside its gradients:
    # without accumulation the loss Lightning logs at that step (the same float32 tensor).
    assert series.loss_logged.all()
    if "accumulate" not in config:
        assert series.loss.tolist() == [scalars["train_loss"][step] for step in series.steps]
    if config.get("clip_algorithm", "norm") == "norm" and "clip" in config:
        assert all(row["norm"] > 0.05 for row in rows)  # so every step was clipped
        assert max(scalars["gradients/global_norm_clipped"].values()) <= 0.05 * (1 + RTOL)
    assert "gradients/loss_scale" not in scalars


def test_float16_mixed_precision_logs_the_loss_scale_and_a_nan_clipped_norm_at_a_skipped_step(
        tmp_path):
    # On CPU Lightning turns precision="16-mixed" into bf16; its MixedPrecision("16-mixed", "cpu")
    # plugin keeps float16 with a GradScaler. The loss is made to overflow at step 2.
    rows, runs, scalars = _fit(tmp_path, precision="16-mixed", clip=0.05, overflow_step=2)
    series = runs["run"]["gradients"]
    assert [row["step"] for row in rows] == list(range(6))
    skipped = [row["step"] for row in rows if row["clipped"] is None]
    assert skipped == [2]
    _check_logged_as_measured(rows, series, scalars, clipped=True)
    assert np.isnan(scalars["gradients/global_norm_clipped"][2])
    assert scalars["gradients/loss_scale"] == {row["step"]: row["scale"] for row in rows}
    assert scalars["gradients/loss_scale"][3] == scalars["gradients/loss_scale"][2] / 2
    # The overflowing step is logged (unscaled: Inf where float16 overflowed), not hidden.
    assert series.stat("inf_count")[2].sum() + series.stat("nan_count")[2].sum() > 0
    assert np.all(series.stat("inf_count")[[0, 1, 3, 4, 5]] == 0)


def test_schedules_and_the_tensorboard_logger_among_others(tmp_path):
    # Every 2nd step, as Lightning logs the loss with log_every_n_steps=2: each gradient column
    # has its loss point.
    rows, runs, scalars = _fit(tmp_path, clip=0.05, logger="csv+tensorboard", log_every_n_steps=2,
                               monitor={"every_n_steps": 2, "histograms_every_n_steps": 3})
    assert list(runs) == ["run"]  # not the CSVLogger's directory
    series = runs["run"]["gradients"]
    assert list(series.steps) == sorted(scalars["train_loss"]) == [1, 3, 5]
    assert list(series.histograms.steps) == [2, 5]
    assert sorted(scalars["gradients/global_norm"]) == sorted(
        scalars["gradients/global_norm_clipped"]) == [1, 3, 5]
    np.testing.assert_allclose(series.stat("l2_norm"), [rows[s]["norms"] for s in (1, 3, 5)],
                               rtol=RTOL)


def test_lightnings_clip_by_norm_is_done_in_the_monitors_pass_with_the_same_bits(
        tmp_path, monkeypatch):
    """With ``gradient_clip_val`` (by norm) the callback clips in its logging pass: a norms-only
    step takes ONE multi-tensor norm (the clip's), and training ends with the very parameters
    Lightning's own clip gives."""
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard_gradients.lightning import GradientMonitor

    norms_per_step = []
    foreach_norm = torch._foreach_norm

    class Count(pl.Callback):  # after the GradientMonitor: what each optimizer step took
        def on_train_batch_start(self, *args):
            norms_per_step.append(0)

    def counted(tensors, *args):
        norms_per_step[-1] += 1
        return foreach_norm(tensors, *args)

    def fit(callback, version):
        module = training.make_module(training.Records(), measure=False)
        trainer = training.make_trainer(
            str(tmp_path), TensorBoardLogger(str(tmp_path), name="", version=version), callback,
            max_epochs=2, gradient_clip_val=0.05)
        trainer.callbacks.append(Count())
        trainer.fit(module, training.dataloader())
        return [p.detach().clone() for p in module.parameters()]

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    shared = fit(GradientMonitor(stats=("l2_norm",), stats_every_n_steps=3), "monitored")
    assert norms_per_step[1:3] == norms_per_step[4:6] == [1, 1], norms_per_step
    own = fit(pl.Callback(), "plain")
    assert all(torch.equal(p, q) for p, q in zip(shared, own))
    series = tg.read_logdir(str(tmp_path))["monitored"]["gradients"]
    assert series.full_rows.tolist() == [True, False, False] * 2
    scalars = _scalars(tmp_path / "monitored")
    assert min(scalars["gradients/clip_coefficient"].values()) < 1, "it clipped"
    np.testing.assert_allclose(  # float64 products of float32 values: to a few float32 ulps
        list(scalars["gradients/global_norm_clipped"].values()),
        [scalars["gradients/global_norm"][s] * scalars["gradients/clip_coefficient"][s]
         for s in scalars["gradients/global_norm_clipped"]], rtol=1e-6)


def test_manual_optimization_with_two_optimizers_logs_once_per_batch(tmp_path):
    rows, runs, scalars = _fit(tmp_path, manual=True)
    series = runs["run"]["gradients"]
    assert list(series.steps) == sorted(scalars["train_loss"]) == list(range(6))
    # Logged at the first optimizer's step: one backward made every gradient, none updated yet.
    np.testing.assert_allclose(series.stat("l2_norm"), [row["norms"] for row in rows[::2]],
                               rtol=RTOL)
    assert "gradients/global_norm_clipped" not in scalars


def test_a_fused_optimizer_under_float16_is_logged_as_it_sees_the_gradients_with_a_warning(
        tmp_path, caplog):
    # A fused optimizer unscales in its own step: at the hook the gradients are still scaled.
    rows, runs, scalars = _fit(tmp_path, precision="16-mixed", fused=True)
    _check_logged_as_measured(rows, runs["run"]["gradients"], scalars, clipped=False)
    assert [r.message for r in caplog.records if "fused" in r.message] == [
        "SGD unscales the gradients in its own step (fused): at on_before_optimizer_step they "
        "are still multiplied by the loss scale, and are logged so"]


def test_a_fit_resumed_from_a_checkpoint_continues_the_steps_and_the_callback_is_reused(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    from tensorboard_gradients.lightning import GradientMonitor

    callback = GradientMonitor()

    def fit(epochs, records, **options):
        logger = TensorBoardLogger(str(tmp_path), name="", version="run")
        trainer = training.make_trainer(str(tmp_path), logger, callback, max_epochs=epochs)
        trainer.fit(training.make_module(records), training.dataloader(), **options)
        return trainer

    fit(1, training.Records()).save_checkpoint(tmp_path / "epoch0.ckpt")
    resumed = training.Records()
    fit(2, resumed, ckpt_path=tmp_path / "epoch0.ckpt")
    assert [row["step"] for row in resumed.rows] == [3, 4, 5]
    series = tg.read_logdir(str(tmp_path))["run"]["gradients"]
    assert list(series.steps) == sorted(_scalars(tmp_path / "run")["train_loss"]) == list(range(6))
    assert list(series.epoch_starts) == [0, 3]
    np.testing.assert_allclose(series.stat("l2_norm")[3:], [row["norms"] for row in resumed.rows],
                               rtol=RTOL)


@pytest.mark.parametrize("logger", ["csv", "none"])
def test_without_a_tensorboard_logger_fit_stops_and_says_what_to_add(tmp_path, logger):
    with pytest.raises(ValueError, match="TensorBoardLogger") as raised:
        training.train(str(tmp_path), logger=logger)
    assert ("CSVLogger" if logger == "csv" else "logger=False") in str(raised.value)
    assert not tg.read_logdir(str(tmp_path))


def test_bad_arguments_are_refused_when_the_callback_is_made():
    from tensorboard_gradients.lightning import GradientMonitor

    for arguments in ({"every_n_steps": 0}, {"histograms_every_n_steps": 1.5}, {"name": ""},
                      {"include": "("}):
        with pytest.raises(ValueError):
            GradientMonitor(**arguments)


def _run_ranks(tmp_path, config, world=2):
    port = free_ports()[0]
    results = run_processes(
        [[sys.executable, str(SCRIPT), json.dumps(config), str(tmp_path), str(rank), str(world),
          port] for rank in range(world)],
        f"Lightning {config['strategy']} on {world} CPU ranks")
    assert_succeeded(results, [f"rank {rank}" for rank in range(world)])
    return [json.loads(line) for line in results[0][1].splitlines() if line.startswith("{")]


def test_ddp_on_two_cpu_ranks_logs_the_all_reduced_gradients_once(tmp_path):
    rows = _run_ranks(tmp_path, {"strategy": "ddp", "accumulate": 2, "clip": 0.05})
    runs, scalars = tg.read_logdir(str(tmp_path)), _scalars(tmp_path / "run")
    assert list(runs) == ["run"]
    _check_logged_as_measured(rows, runs["run"]["gradients"], scalars, clipped=True)
    # Rank 0 alone wrote: the logger's event file and the monitor's.
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 2


def test_fsdp_on_two_cpu_ranks_logs_what_one_process_logs(tmp_path):
    # Lightning refuses FSDPStrategy on CPU; tests/lightning_training.py says how it is run there.
    config = {"accumulate": 2, "clip": 0.01, "clip_algorithm": "value"}
    _run_ranks(tmp_path / "fsdp", dict(config, strategy="fsdp"))
    sharded = tg.read_logdir(str(tmp_path / "fsdp"))["run"]["gradients"]
    rows, runs, reference_scalars = _fit(tmp_path / "one", **config)
    reference = runs["run"]["gradients"]
    assert sharded.variables == reference.variables == NAMES  # without FSDP's prefixes
    assert list(sharded.steps) == list(reference.steps) == [row["step"] for row in rows]
    # The optimizer of sharded parameters holds pieces: its updates are not read (NaN).
    read = [i for i, stat in enumerate(sharded.stat_names) if stat not in ("update_l2_norm",)]
    assert np.isnan(sharded.stat("update_l2_norm")).all()
    assert np.isfinite(reference.stat("update_l2_norm")).all()
    np.testing.assert_allclose(sharded.values[:, :, read], reference.values[:, :, read],
                               rtol=RTOL, atol=1e-7)
    assert list(sharded.epoch_starts) == list(reference.epoch_starts)
    scalars = _scalars(tmp_path / "fsdp" / "run")
    assert sorted(scalars["train_loss"]) == list(sharded.steps)
    for tag in ("gradients/global_norm", "gradients/global_norm_clipped"):
        assert scalars[tag] == pytest.approx(reference_scalars[tag], rel=RTOL)
    assert len(list((tmp_path / "fsdp" / "run").glob("events.out.tfevents.*"))) == 2
