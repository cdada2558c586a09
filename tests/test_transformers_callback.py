"""`tensorboard_gradients.transformers.GradientMonitorCallback` in real Hugging Face `Trainer` runs
on CPU: a tiny GPT-2 built from its config (nothing downloaded), token ids given directly.

What is checked against the event files: a row per optimizer step at the step the Trainer logs
that step's loss (``state.global_step``), in the run of the Trainer's `TensorBoardCallback`; the
statistics are those of the gradients the model produced (the Trainer's clipping is done by the
monitor in its pass, with the same bits); ``<name>/global_norm_before_clipping`` is the Trainer's
``grad_norm``; the plugin serves the run. With
gradient accumulation, bf16 and fp16 on CPU, accelerate's GradScaler wrapper (loss scale,
skipped steps), a resumed run, and 2 processes (the Trainer's FSDP request, which accelerate
runs as DDP on CPU, and an FSDP2-sharded model driven through the callback handler as the
Trainer drives it).
"""

import json
import logging
import math
import os
import pathlib
import sys
import urllib.parse

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from accelerate import Accelerator  # noqa: E402
from accelerate.optimizer import AcceleratedOptimizer  # noqa: E402

from tensorboard.backend.event_processing import event_accumulator  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback  # noqa: E402
from transformers import TrainingArguments  # noqa: E402
from transformers.integrations.integration_utils import TensorBoardCallback  # noqa: E402
from transformers.trainer_callback import (  # noqa: E402
    CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState,
)

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.capture.transformers import _calling_trainer  # noqa: E402
from tensorboard_gradients.transformers import GradientMonitorCallback  # noqa: E402

from conftest import (  # noqa: E402
    assert_row_matches, norm_rtol, reference_histogram, reference_stats,
)
from processes import assert_succeeded, free_ports, run_processes  # noqa: E402

SCRIPT = pathlib.Path(__file__).with_name("transformers_training.py")


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def norms_rtol():
    """How far two float32 computations of one global norm may differ: each is within
    `norm_rtol` of the exact norm per tensor (the largest tensor's bound) and again where the
    tensors' norms are combined; both are then stored as float32 scalars."""
    sizes = [p.numel() for p in tiny_gpt2().parameters()]
    return 2 * (norm_rtol(max(sizes)) + norm_rtol(len(sizes))) + np.finfo(np.float32).eps


def token_dataset(count=32):
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 64, (8,), generator=generator) for _ in range(count)]
    return [{"input_ids": ids, "labels": ids} for ids in rows]


def _copies(model):
    return {name: (p.grad.detach().numpy().copy(), p.detach().numpy().copy())
            for name, p in model.named_parameters()}


class GradientRecorder(TrainerCallback):
    """Keeps a copy of every gradient and weight as the monitor reads them, by the step the
    monitor logs them at (``steps``): the gradients the model produced, before the Trainer's
    clipping (recorded as its clip is called: the recorder wraps the clip the monitor's
    callback, earlier in the list, has made its own), or, without clipping, at
    ``on_pre_optimizer_step``; and the gradients ``optimizer.step()`` gets (``clipped``)."""

    def __init__(self):
        self.steps, self.clipped = {}, {}

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = _calling_trainer()
        clip = trainer._clip_grad_norm

        def recording_clip(model):
            self.steps[trainer.state.global_step + 1] = _copies(trainer.model)
            return clip(model)
        trainer._clip_grad_norm = recording_clip

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.clipped[state.global_step + 1] = _copies(model)
        self.steps.setdefault(state.global_step + 1, self.clipped[state.global_step + 1])


def train(tmp_path, *callbacks, **arguments):
    """A Trainer run with `callbacks`; returns the trainer."""
    settings = dict(output_dir=str(tmp_path / "out"), report_to=["tensorboard"],
                    save_strategy="no", disable_tqdm=True, use_cpu=True, logging_steps=1,
                    per_device_train_batch_size=4, max_steps=4, seed=0)
    settings.update(arguments)
    resume = settings.pop("resume", None)
    trainer = Trainer(model=tiny_gpt2(), args=TrainingArguments(**settings),
                      train_dataset=token_dataset(), callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def tensorboard_run(trainer):
    """The directory the Trainer's TensorBoardCallback wrote its scalars to."""
    [callback] = [c for c in trainer.callback_handler.callbacks
                  if isinstance(c, TensorBoardCallback)]
    return pathlib.Path(callback.logging_dir)


def scalars(run_dir):
    """``{tag: {step: value}}`` of every scalar in a run: the Trainer's (``train/...``) and ours
    (``gradients/...``, written as scalar tensors)."""
    events = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    found = {tag: {e.step: e.value for e in events.Scalars(tag)}
             for tag in events.Tags()["scalars"]}
    for tag in events.Tags()["tensors"]:
        if tag.startswith("gradients/"):
            found[tag] = {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
                          for e in events.Tensors(tag)}
    return found


def the_series(output_dir, run_dir):
    """The gradients of the one run under `output_dir`, which must be `run_dir`."""
    runs = tg.read_logdir(str(output_dir))
    assert list(runs) == [os.path.relpath(run_dir, output_dir)]
    return runs[os.path.relpath(run_dir, output_dir)]["gradients"]


def values(points, steps):
    return np.array([points[step] for step in steps])


def test_a_row_per_optimizer_step_at_its_loss_step_in_the_trainers_run(tmp_path, plugin_client):
    recorder = GradientRecorder()
    trainer = train(tmp_path, GradientMonitorCallback(histograms_every_n_steps=2), recorder,
                    gradient_accumulation_steps=2)
    run_dir = tensorboard_run(trainer)
    series = the_series(tmp_path / "out", run_dir)
    logged = scalars(run_dir)
    # The ONE STEP RULE: the loss of the k-th update and its gradients are both at step k; 8
    # micro-batches in 4 accumulations make 4 rows.
    assert sorted(logged["train/loss"]) == series.steps.tolist() == [1, 2, 3, 4]
    assert series.variables == tuple(n for n, _ in trainer.model.named_parameters())
    assert series.variables[0] == "transformer.wte.weight"  # lm_head.weight is tied to it
    for index, step in enumerate(series.steps):
        for name, (gradient, weight) in recorder.steps[step].items():
            assert_row_matches(series, index, name, reference_stats(gradient, weight))
    assert series.histograms.steps.tolist() == [2, 4]
    gradient = recorder.steps[4]["transformer.h.1.mlp.c_fc.weight"][0]
    np.testing.assert_array_equal(
        series.histograms.counts[1, series.variables.index("transformer.h.1.mlp.c_fc.weight")],
        reference_histogram(gradient))
    # Clipping on (max_grad_norm=1.0, the default), done by the monitor in its pass: the rows
    # are the gradients before clipping, the Trainer's pre-clip norm (the very tensor its clip
    # returned) is <name>/global_norm_before_clipping, the watched ones' (all here) global_norm.
    steps = [1, 2, 3, 4]
    grad_norm = values(logged["train/grad_norm"], steps)
    assert (grad_norm > 1).all()  # so the gradients were clipped
    assert (values(logged["gradients/global_norm_before_clipping"], steps) == grad_norm).all()
    np.testing.assert_allclose(values(logged["gradients/global_norm"], steps), grad_norm,
                               rtol=norms_rtol())
    coefficients = values(logged["gradients/clip_coefficient"], steps)
    np.testing.assert_allclose(coefficients, 1.0 / (grad_norm + 1e-6), rtol=2**-23)
    clipped = np.sqrt([sum(np.sum(g.astype(np.float64) ** 2)
                           for g, _ in recorder.clipped[step].values()) for step in steps])
    np.testing.assert_allclose(values(logged["gradients/global_norm_clipped"], steps), clipped,
                               rtol=norms_rtol())
    # clip_grad_norm_ scales by max_norm / (norm + 1e-6), in float32 (one rounding per entry).
    np.testing.assert_allclose(clipped, np.minimum(grad_norm, 1.0),
                               rtol=norms_rtol() + 1e-6 / grad_norm.min())
    assert "gradients/loss_scale" not in logged
    # The Trainer's logged loss beside each step's gradients (its train/loss: logging_steps=1):
    # ours keeps the float the Trainer logged, train/loss is stored in float32 (one rounding,
    # at most 2**-24 of the value, apart).
    assert series.loss_source == "gradients_loss" and series.loss_logged.all()
    np.testing.assert_allclose(series.loss, values(logged["train/loss"], steps), rtol=2**-24)
    # The plugin serves the run under the name TensorBoard gives the Trainer's run.
    client = plugin_client(str(tmp_path / "out"))
    run = os.path.relpath(run_dir, tmp_path / "out")
    runs = json.loads(client.get("/data/plugin/gradients/runs").get_data())
    assert runs[run]["gradients"]["steps"] == 4 and runs[run]["gradients"]["histograms"]
    heatmap = json.loads(client.get("/data/plugin/gradients/heatmap?" + urllib.parse.urlencode(
        {"run": run, "tag": "gradients", "stat": "l2_norm"})).get_data())
    assert heatmap["steps"] == [1, 2, 3, 4] and tuple(heatmap["variables"]) == series.variables
    np.testing.assert_array_equal(np.array(heatmap["values"], dtype=np.float32),
                                  series.stat("l2_norm").T)


def test_the_trainers_clip_is_done_in_the_monitors_pass_with_the_same_bits(tmp_path,
                                                                          monkeypatch):
    """The Trainer's clipping (max_grad_norm) is the monitor's: a norms-only step takes ONE
    multi-tensor norm, the clip's, and training ends with the very weights the Trainer's own
    clip gives."""
    norms_per_step = []
    foreach_norm = torch._foreach_norm

    class Count(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            norms_per_step.append(0)

    def counted(tensors, *args):
        norms_per_step[-1] += 1
        return foreach_norm(tensors, *args)

    monkeypatch.setattr(torch, "_foreach_norm", counted)
    monitored = train(tmp_path / "monitored", GradientMonitorCallback(
        stats=("l2_norm",), stats_every_n_steps=3, histograms_every_n_steps=None), Count(),
        max_steps=6)
    assert norms_per_step[1:3] == norms_per_step[4:6] == [1, 1], norms_per_step
    plain = train(tmp_path / "plain", Count(), max_steps=6)
    assert all(torch.equal(p, q) for p, q in zip(monitored.model.parameters(),
                                                  plain.model.parameters()))
    series = the_series(tmp_path / "monitored" / "out", tensorboard_run(monitored))
    assert series.full_rows.tolist() == [True, False, False] * 2
    assert "_clip_grad_norm" not in vars(monitored)  # the Trainer's own method again


def test_every_n_steps_counts_like_logging_steps_and_without_clipping(tmp_path):
    trainer = train(tmp_path, GradientMonitorCallback(every_n_steps=2, histograms_every_n_steps=3),
                    max_steps=6, logging_steps=2, max_grad_norm=0.0)
    run_dir = tensorboard_run(trainer)
    series = the_series(tmp_path / "out", run_dir)
    logged = scalars(run_dir)
    assert series.steps.tolist() == sorted(logged["train/loss"]) == [2, 4, 6]
    assert series.histograms.steps.tolist() == [3, 6]
    # No clipping: <name>/global_norm is the norm of the logged gradients, the Trainer's grad_norm.
    assert "gradients/global_norm_clipped" not in logged
    assert sorted(logged["gradients/global_norm"]) == [2, 4, 6]
    np.testing.assert_allclose(values(logged["gradients/global_norm"], [2, 4, 6]),
                               values(logged["train/grad_norm"], [2, 4, 6]), rtol=norms_rtol())
    np.testing.assert_allclose(
        np.sqrt(np.sum(series.stat("l2_norm").astype(np.float64) ** 2, axis=1)),
        values(logged["train/grad_norm"], [2, 4, 6]), rtol=norms_rtol())


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cpu(tmp_path, precision):
    recorder = GradientRecorder()
    trainer = train(tmp_path, GradientMonitorCallback(), recorder, max_steps=3,
                    **{precision: True})
    run_dir = tensorboard_run(trainer)
    series = the_series(tmp_path / "out", run_dir)
    logged = scalars(run_dir)
    assert series.steps.tolist() == sorted(logged["train/loss"]) == [1, 2, 3]
    for index, step in enumerate(series.steps):
        for name, (gradient, weight) in recorder.steps[step].items():
            assert gradient.dtype == np.float32  # autocast keeps float32 parameters and gradients
            assert_row_matches(series, index, name, reference_stats(gradient, weight))
    if precision == "bf16":
        assert trainer.accelerator.native_amp  # bf16 autocast on the CPU
    else:
        # The Trainer accepts fp16 on CPU without a word; accelerate 1.15 enables fp16 only off
        # the CPU (Accelerator.__init__): no autocast, no GradScaler, float32 training.
        assert not trainer.accelerator.native_amp and trainer.accelerator.scaler is None
    assert "gradients/loss_scale" not in logged


def test_loss_scale_and_skipped_steps_of_accelerates_grad_scaler(tmp_path, monkeypatch):
    """fp16 loss scaling needs an accelerator in the Trainer (see `test_mixed_precision_on_cpu`):
    here accelerate's optimizer wrapper with a CPU GradScaler goes through the Trainer's order
    by hand, through a real CallbackHandler: scaled backward, unscale (which accelerate's
    clip_grad_norm_ does first), on_pre_optimizer_step, step (the scaler skips the second, whose
    loss overflowed), on_optimizer_step."""
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "run"))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, max_grad_norm=0.0)
    Accelerator(cpu=True)  # the state accelerate's optimizer wrapper reads
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     device_placement=False,
                                     scaler=torch.amp.GradScaler("cpu", init_scale=256.0))
    state, control = TrainerState(), TrainerControl()
    handler = CallbackHandler([DefaultFlowCallback(), TensorBoardCallback(),
                               GradientMonitorCallback()], model, None, optimizer, None)
    handler.on_train_begin(args, state, control)
    seen = []
    for factor in (1.0, math.inf):
        optimizer.scaler.scale(model(torch.ones(4, 3)).sum() * factor).backward()
        optimizer.scaler.unscale_(optimizer.optimizer)
        seen.append({name: (p.grad.numpy().copy(), p.detach().numpy().copy())
                     for name, p in model.named_parameters()})
        handler.on_pre_optimizer_step(args, state, control)
        optimizer.step()
        handler.on_optimizer_step(args, state, control)
        optimizer.zero_grad()
        state.global_step += 1
    handler.on_train_end(args, state, control)
    logged = scalars(tmp_path / "run")
    assert logged["gradients/loss_scale"] == {1: 256.0, 2: 256.0}  # the scale of the step
    assert logged["gradients/skipped_step"] == {1: 0.0, 2: 1.0}
    series = tg.read_logdir(str(tmp_path / "run"))["."]["gradients"]
    for index, step in enumerate(seen):  # unscaled; the skipped step's Inf gradients as they are
        for name, (gradient, weight) in step.items():
            assert_row_matches(series, index, name, reference_stats(gradient, weight))
    assert series.stat("inf_count")[1].sum() > 0


def test_a_resumed_run_goes_on_from_its_checkpoints_step(tmp_path):
    train(tmp_path, max_steps=2, save_strategy="steps", save_steps=2)
    trainer = train(tmp_path, GradientMonitorCallback(every_n_steps=2), max_steps=6,
                    output_dir=str(tmp_path / "resumed"),
                    resume=str(tmp_path / "out" / "checkpoint-2"))
    run_dir = tensorboard_run(trainer)
    series = tg.read_logdir(str(run_dir))["."]["gradients"]
    assert series.steps.tolist() == [4, 6]
    assert sorted(scalars(run_dir)["train/loss"]) == [3, 4, 5, 6]


@pytest.mark.parametrize("report_to", [["tensorboard"], []])
def test_tensorboard_logging_dir_and_no_tensorboard_callback(tmp_path, monkeypatch, caplog,
                                                               report_to):
    """``TENSORBOARD_LOGGING_DIR`` moves the Trainer's run and the gradients with it; without a
    TensorBoardCallback the gradients go where it would write, with a warning."""
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "shared_run"))
    with caplog.at_level(logging.WARNING, "tensorboard_gradients"):
        train(tmp_path, GradientMonitorCallback(), max_steps=2, report_to=report_to)
    assert tg.read_logdir(str(tmp_path / "shared_run"))["."]["gradients"].steps.tolist() == [1, 2]
    warned = [r.message for r in caplog.records if "no TensorBoardCallback" in r.message]
    if report_to:
        assert "train/loss" in scalars(tmp_path / "shared_run") and not warned
    else:
        assert len(warned) == 1 and str(tmp_path / "shared_run") in warned[0]


def test_name_include_and_exclude_choose_the_tag_and_the_rows(tmp_path):
    trainer = train(tmp_path, GradientMonitorCallback(name="blocks", include=r"^transformer\.h\.",
                                                      exclude=r"\.bias$"), max_steps=1)
    series = tg.read_logdir(str(tensorboard_run(trainer)))["."]["blocks"]
    assert series.variables == tuple(
        n for n, _ in trainer.model.named_parameters()
        if n.startswith("transformer.h.") and not n.endswith(".bias"))


@pytest.mark.parametrize("strict", [False, True])
def test_an_unwritable_run_drops_its_steps_or_raises_when_strict(tmp_path, monkeypatch, strict):
    (tmp_path / "file").write_text("not a directory")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "file" / "run"))
    callback = GradientMonitorCallback(strict=strict)
    if strict:
        with pytest.raises(OSError):
            train(tmp_path, callback, max_steps=2, report_to=[])
    else:  # training goes on; the steps are counted as dropped
        train(tmp_path, callback, max_steps=2, report_to=[])
        assert callback.dropped_steps == 2


def test_deepspeed_is_refused_at_the_start(tmp_path):
    pytest.importorskip("deepspeed")
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True,
                             deepspeed={"zero_optimization": {"stage": 0}})
    with pytest.raises(ValueError, match="DeepSpeed"):
        GradientMonitorCallback().on_train_begin(args, TrainerState(), TrainerControl())


@pytest.mark.parametrize("arguments", [
    {"every_n_steps": 0}, {"histograms_every_n_steps": 0}, {"every_n_steps": 1.5}, {"name": ""},
    {"include": "("}, {"exclude": ["ok", "["]},
])
def test_bad_arguments_fail_at_construction(arguments):
    with pytest.raises(ValueError):
        GradientMonitorCallback(**arguments)


def test_two_processes_trainer_fsdp_request_and_an_fsdp2_sharded_model(tmp_path):
    """The Trainer asked for FSDP on 2 CPU processes (accelerate runs it as DDP there), then an
    FSDP2-sharded model through the callback handler (see tests/transformers_training.py)."""
    # What torchrun sets; one thread per process on a machine of two cores.
    environment = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=free_ports()[0],
                       WORLD_SIZE="2", OMP_NUM_THREADS="1")
    results = run_processes(
        [["env", f"RANK={rank}", f"LOCAL_RANK={rank}", sys.executable, str(SCRIPT), str(tmp_path)]
         for rank in range(2)],
        "the transformers callback on 2 processes", env=environment)
    assert_succeeded(results, ["rank 0", "rank 1"])
    printed = [json.loads(line.split(" ", 1)[1]) for line in results[0][1].splitlines()
               if line.startswith("result: ")]
    # accelerate 1.15 makes FSDP only on accelerators: on CPU processes the Trainer runs DDP
    # (no message), and hands callbacks the unwrapped model.
    assert printed[0] == {"distributed_type": "MULTI_CPU", "model": "GPT2LMHeadModel"}
    names = tuple(n for n, _ in tiny_gpt2().named_parameters())
    for training, norms in (("trainer", None), ("fsdp2", printed[1:])):
        [run_dir] = (tmp_path / training / "runs").iterdir()
        series = tg.read_logdir(str(run_dir))["."]["gradients"]
        logged = scalars(run_dir)
        assert series.steps.tolist() == sorted(logged["train/loss"]) == [1, 2, 3]
        assert series.variables == names  # the user's names, no FSDP prefixes
        # Only process 0 wrote gradients (the other file is the TensorBoardCallback's).
        assert len(list(run_dir.glob("*.gradients"))) == 1
        # No clipping: the logged norm is the Trainer's (or PyTorch's, over the shards).
        trainer_norm = values(logged["train/grad_norm"], [1, 2, 3])
        np.testing.assert_allclose(values(logged["gradients/global_norm"], [1, 2, 3]),
                                   trainer_norm, rtol=norms_rtol())
        if norms is not None:
            # The TensorBoardCallback stored the printed norm as float32.
            np.testing.assert_allclose([n["grad_norm"] for n in norms], trainer_norm,
                                       rtol=np.finfo(np.float32).eps)
