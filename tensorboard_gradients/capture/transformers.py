"""`GradientMonitorCallback`: the Hugging Face `transformers.Trainer` logs its gradients.

```python
from transformers import Trainer, TrainingArguments
from tensorboard_gradients.transformers import GradientMonitorCallback

args = TrainingArguments(output_dir="out", report_to=["tensorboard"], logging_steps=10)
trainer = Trainer(model=model, args=args, train_dataset=train,
                  callbacks=[GradientMonitorCallback(every_n_steps=10)])
trainer.train()
# tensorboard --logdir out/runs   ->  Gradients tab, the same run as train/loss
```

The callback drives the PyTorch monitor (`tensorboard_gradients.torch.GradientMonitor`, which it
creates at the first logged step from the model the Trainer hands its callbacks) once per
optimizer step, after the last ``backward`` of a gradient accumulation: in the Trainer's
gradient clipping when it clips (below), else at ``on_pre_optimizer_step``, before
``optimizer.step()``.

Where it writes: into the run of the Trainer's own `TensorBoardCallback` (``report_to`` with
``"tensorboard"``), the directory it writes ``train/loss`` to: in transformers 5 that is
``$TENSORBOARD_LOGGING_DIR`` or ``<output_dir>/runs/<date>_<host>`` (``TrainingArguments`` has
no ``logging_dir`` any more), so TensorBoard shows the loss and the Gradients tab of one run.
The Trainer gives callbacks no reference to each other, so the callback finds that
`TensorBoardCallback` in the `CallbackHandler` that calls it. Without one it writes where one
would (the same rule) and says so in a warning.

Steps: a row's step is the Trainer's ``state.global_step`` after that update, the step the Trainer
logs its loss at (``train/loss``, ``train/grad_norm``), so gradients and loss line up step for
step; a resumed run continues the numbering. ``every_n_steps`` counts like ``logging_steps``:
steps N, 2N, 3N, ... (every step with 1), so with ``every_n_steps == logging_steps`` every gradient
column has its loss point. (The other monitors log steps 1, N+1, 2N+1, ...)

What is logged, and how it relates to clipping (``max_grad_norm``, 1.0 by default):

* With clipping on, the monitor does the Trainer's clipping: the callback puts its own method in
  place of the Trainer's ``_clip_grad_norm`` for the ``train()`` (found up the call stack: a
  Trainer hands callbacks no reference to itself), which logs the step and clips as accelerate's
  ``clip_grad_norm_`` does (the GradScaler's gradients unscaled, then ``torch.nn.utils
  .clip_grad_norm_`` of the model's parameters) in one pass, the same bits
  (`torch.GradientMonitor.clip_and_log`). The statistics are of the gradients the model
  produced, before clipping; ``<name>/global_norm`` is their (watched) global norm,
  ``<name>/global_norm_before_clipping`` the Trainer's ``grad_norm`` (all parameters),
  ``<name>/clip_coefficient`` what the gradients were multiplied by and
  ``<name>/global_norm_clipped`` the watched gradients' norm after clipping. Where accelerate
  clips by other means (FSDP, DeepSpeed, XLA, Megatron, SageMaker model parallelism, gradients
  on several device meshes) the Trainer clips, and the callback logs at
  ``on_pre_optimizer_step`` what ``optimizer.step()`` applies: AFTER the clipping, with
  ``<name>/global_norm`` the Trainer's pre-clip ``grad_norm`` (handed out only when it logs,
  ``on_log``: at the logged steps the Trainer also logs at) and ``<name>/global_norm_clipped``
  the norm of the logged gradients.
* With ``max_grad_norm=0`` (no clipping) ``<name>/global_norm`` is the norm of the logged
  gradients, at every logged step.
* ``<name>_loss``: the Trainer's logged loss (the mean over its ``logging_steps``) at the logged
  steps it also logs at, for the loss-spike rule (the rules read ``train/loss`` otherwise).
* ``<name>/loss_scale`` and ``<name>/skipped_step`` (1 where the update was skipped) when the
  Trainer's optimizer has an enabled ``GradScaler`` (fp16 on a GPU); the gradients are already
  unscaled by the Trainer's norm computation when the callback reads them.

Mixed precision: ``bf16=True`` keeps float32 parameters and gradients (autocast): nothing changes.
``fp16=True`` on the CPU is accepted by the Trainer (transformers 5.18) without a word, but
accelerate 1.15 enables fp16 only off the CPU: no autocast, no ``GradScaler``, training in float32.

Distributed: every process runs the callback, which calls the monitor at the same steps on all
of them (the schedule is the Trainer's step). Under DDP (``torchrun``: ``MULTI_GPU``,
``MULTI_CPU``) the gradients are all-reduced and process 0 alone computes and writes. Under FSDP
the Trainer hands callbacks the wrapped model, the one the monitor must be created on (see
`tensorboard_gradients.capture.torch`: every rank reduces its shards, rank 0 combines them and
writes, no parameter is gathered whole). accelerate 1.15 makes FSDP only on accelerators: asked
for on CPU processes, the Trainer trains with DDP and says nothing. DeepSpeed is refused:
accelerate runs ``engine.step()`` (clipping, optimizer step, zeroing the gradients) inside
``backward``, before any callback.
"""

import logging
import os
import sys

import transformers
from transformers.trainer_callback import CallbackHandler

from tensorboard_gradients.capture import options
from tensorboard_gradients.capture.torch import GradientMonitor
from tensorboard_gradients.format import columns, metadata
from tensorboard_gradients.format.writer import run_directory

logger = logging.getLogger(__name__)

__all__ = ["GradientMonitorCallback"]


class GradientMonitorCallback(transformers.TrainerCallback):
    """Logs the gradients of the Trainer's optimizer steps (see the module).

    Args:
      every_n_steps: log the statistics at the optimizer steps N, 2N, 3N, ... (1: every step).
      histograms_every_n_steps: also log the log10|g| histograms at the steps H, 2H, ... (None:
        never; they cost a pass per parameter).
      stats_every_n_steps: every statistic at every N-th logged step (the first, then every
        N-th), the norms and NaN/Inf counts only at the logged steps between (the PyTorch
        monitor's; 1: every statistic at every logged step).
      name: the summary name = the tag in the Gradients tab and the prefix of the scalars.
      include: regular expressions (or a list of them) searched in parameter names
        (``transformer.h.0.attn.c_attn.weight``): only the parameters they match are watched
        (None: all).
      exclude: the same, for parameters not to watch.
      strict: raise when the event files cannot be written; by default the step is dropped,
        counted and reported, and training goes on (see `tensorboard_gradients.format.writer`).
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm, update_l2_norm and adam_rms only when named. The
        Trainer's optimizer's updates are logged (the PyTorch monitor's ``optimizer``).
      on_alert: called with each new `tensorboard_gradients.analysis.Alert` during
        ``train()`` (the PyTorch monitor's ``on_alert``); `alerts` returns them too.

    Raises:
      ValueError: a bad argument; at ``on_train_begin``, a DeepSpeed run.
    """

    def __init__(self, every_n_steps=1, histograms_every_n_steps=100,
                 name=metadata.DEFAULT_NAME, include=None, exclude=None, strict=False, stats=None,
                 on_alert=None, stats_every_n_steps=10):
        if not hasattr(transformers.TrainerCallback, "on_pre_optimizer_step"):
            raise RuntimeError(
                f"transformers {transformers.__version__} has no on_pre_optimizer_step callback "
                "event, which GradientMonitorCallback logs from: upgrade transformers")
        self._options = dict(
            every_n_steps=options.positive_int("every_n_steps", every_n_steps),
            histograms_every_n_steps=options.optional_positive_int(
                "histograms_every_n_steps", histograms_every_n_steps),
            stats_every_n_steps=options.stats_every(stats_every_n_steps),
            name=options.non_empty_name(name),
            include=include, exclude=exclude, strict=bool(strict),
            stats=columns.selected_stats(stats), on_alert=on_alert)
        options.patterns("include", include)  # checked now; the monitor compiles them again
        options.patterns("exclude", exclude)
        self._monitor = None  # made at the first logged step of each train()
        self._clipping = False
        self._stats_step = None  # the last step whose statistics were logged
        self._trainer = None  # the Trainer whose clipping the monitor does, during train()
        self._clipped_step = None  # the last step logged by that clip
        self._dropped_steps = 0  # of the last train()'s monitor, once closed
        self._finished = None  # the last train()'s monitor, once closed

    def on_train_begin(self, args, state, control, **kwargs):
        if getattr(args, "deepspeed", None) or getattr(args, "deepspeed_plugin", None):
            raise ValueError(
                "GradientMonitorCallback cannot log DeepSpeed runs: accelerate runs DeepSpeed's "
                "engine.step() (clipping, optimizer step, zero_grad) inside backward, before any "
                "callback sees the gradients. Use tensorboard_gradients.torch.GradientMonitor("
                "engine, ...) in your own loop instead")
        self._close()
        self._dropped_steps = 0
        self._clipping = bool(args.max_grad_norm) and args.max_grad_norm > 0
        trainer = _calling_trainer()
        if self._clipping and trainer is not None and _clips_plainly(trainer):
            self._trainer = trainer  # its clip is done in the monitor's pass (`_clip_grad_norm`)
            trainer._clip_grad_norm = self._clip_grad_norm

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        # The Trainer counts this update (global_step += 1) after optimizer.step(), then logs its
        # loss at the new global_step: that is the step of these gradients.
        step = state.global_step + 1
        if self._clipped_step != step:  # not logged by the clip
            self._log(step, args, state, model, optimizer)

    def _clip_grad_norm(self, model):
        """The Trainer's ``_clip_grad_norm`` while the callback shares its pass: accelerate's
        ``clip_grad_norm_`` (unscale the GradScaler's gradients, ``torch.nn.utils
        .clip_grad_norm_`` of the model's parameters) with this step logged before the
        gradients are scaled, by `torch.GradientMonitor.clip_and_log`: one pass, the same
        bits. Gradients on several device meshes keep the Trainer's own."""
        trainer = self._trainer
        if getattr(trainer, "_has_mixed_mesh_grads", lambda model: False)(model):
            return type(trainer)._clip_grad_norm(trainer, model)
        trainer.accelerator.unscale_gradients()
        args, state = trainer.args, trainer.state
        step = state.global_step + 1
        monitor = self._monitor_of(args, state, trainer.model, trainer.optimizer)
        total, _ = monitor.clip_and_log(
            list(model.parameters()), args.max_grad_norm, 2.0, False, None, clipped_norm=True,
            log=lambda: (step, self._log(step, args, state, trainer.model, trainer.optimizer)))
        self._clipped_step = step
        return total

    def _log(self, step, args, state, model, optimizer):
        """Logs ``step`` if a schedule says so; whether it did."""
        every, histograms_every = (self._options["every_n_steps"],
                                   self._options["histograms_every_n_steps"])
        if step % every and not (histograms_every and step % histograms_every == 0):
            return False
        monitor = self._monitor_of(args, state, model, optimizer)
        logged = monitor.step(step, scaler=_enabled_scaler(optimizer))  # due at multiples of N
        if step % every == 0:
            self._stats_step = step
        return logged

    def _monitor_of(self, args, state, model, optimizer):
        """The monitor of this ``train()``, made at its first use."""
        if self._monitor is None:
            # In the Trainer's clip, no callback event is being called: its callbacks then.
            callbacks = (list(self._trainer.callback_handler.callbacks)
                         if self._trainer is not None else _trainer_callbacks())
            self._monitor = _TrainerMonitor(
                model, _tensorboard_run(args, state, callbacks),
                # The clipped gradients' norm under that name, where the clip is not ours.
                clipping=self._clipping and self._trainer is None,
                # accelerate wraps the optimizer; the hooks are the torch optimizer's
                optimizer=getattr(optimizer, "optimizer", optimizer), **self._options)
        return self._monitor

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        step = state.global_step + 1
        if self._stats_step == step and _enabled_scaler(optimizer) is not None:
            skipped = bool(getattr(optimizer, "step_was_skipped", False))
            self._monitor.write_scalars(step, {"skipped_step": float(skipped)})

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        grad_norm = logs.get("grad_norm")
        logged_here = self._stats_step == state.global_step
        # The Trainer's pre-clip norm, where the clip is not ours (ours writes it with the step).
        if self._clipping and self._trainer is None and grad_norm is not None and logged_here:
            self._monitor.write_scalars(state.global_step, {"global_norm": float(grad_norm)})
        # The Trainer's train/loss (the mean over its logging_steps) at the gradients' step.
        if logged_here and logs.get("loss") is not None:
            self._monitor.write_loss(state.global_step, logs["loss"])

    def on_train_end(self, args, state, control, **kwargs):
        self._close()

    def _close(self):
        if self._trainer is not None:  # the Trainer's own method again
            del self._trainer._clip_grad_norm
            self._trainer = None
        self._clipped_step = None
        if self._monitor is not None:
            self._monitor.close()
            self._dropped_steps = self._monitor.dropped_steps
            self._finished = self._monitor  # its last alerts are still to be taken
        self._monitor, self._stats_step = None, None

    def alerts(self, wait: bool = False):
        """The alerts judged since the last call (the PyTorch monitor's `alerts`)."""
        monitor = self._monitor or self._finished
        return monitor.alerts(wait=wait) if monitor is not None else []

    @property
    def dropped_steps(self):
        """Logged steps of the current (or last) ``train()`` that could not be written (see
        ``strict``)."""
        return self._monitor.dropped_steps if self._monitor is not None else self._dropped_steps


class _TrainerMonitor(GradientMonitor):
    """The PyTorch monitor on the Trainer's step numbers, with the scalars named for clipping."""

    def __init__(self, model, log_dir, clipping, **settings):
        super().__init__(model, log_dir, **settings)
        if clipping:  # the norm of clipped gradients; the one before comes from on_log
            self._global_norm_scalar = "global_norm_clipped"


def _enabled_scaler(optimizer):
    """The enabled ``GradScaler`` of accelerate's optimizer wrapper, or None."""
    scaler = getattr(optimizer, "scaler", None)
    return scaler if scaler is not None and scaler.is_enabled() else None


def _tensorboard_run(args, state, callbacks):
    """The run directory of the Trainer's `TensorBoardCallback` (its ``train/loss``), among
    the Trainer's ``callbacks``.

    Only process 0 writes: the others get the output directory, where nothing is written.
    """
    if not state.is_world_process_zero:
        return args.output_dir
    from transformers.integrations.integration_utils import TensorBoardCallback, default_logdir

    found = [c for c in callbacks if isinstance(c, TensorBoardCallback)]
    for callback in found[:1]:
        if callback.tb_writer is not None:
            try:
                return run_directory(callback.tb_writer)
            except ValueError:  # a writer of another kind: its callback's directory then
                pass
        if callback.logging_dir is not None:
            return callback.logging_dir
    # Where a TensorBoardCallback writes (its rule in transformers 5).
    directory = os.getenv("TENSORBOARD_LOGGING_DIR")
    directory = (os.path.expanduser(directory) if directory is not None
                 else os.path.join(args.output_dir, default_logdir()))
    if not found:
        logger.warning(
            "GradientMonitorCallback: this Trainer has no TensorBoardCallback (report_to does not "
            "include \"tensorboard\"); the gradients go to %s", directory)
    return directory


def _trainer_callbacks():
    """The callbacks of the `CallbackHandler` that is calling the current callback event (the
    Trainer hands a callback neither the Trainer nor the other callbacks), or []."""
    handler = _caller(CallbackHandler)
    return [] if handler is None else list(handler.callbacks)


def _calling_trainer():
    """The `transformers.Trainer` whose training loop is calling the current callback event,
    or None (callbacks driven by hand)."""
    return _caller(transformers.Trainer)


def _caller(kind):
    """The nearest ``self`` of type ``kind`` up the call stack, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        found = frame.f_locals.get("self")
        if isinstance(found, kind):
            return found
        frame = frame.f_back
    return None


def _clips_plainly(trainer) -> bool:
    """Whether the Trainer clips by accelerate's ``clip_grad_norm_`` of plain (or one mesh's)
    tensors, through its ``_clip_grad_norm`` (transformers 5): not FSDP (the model's own
    method), DeepSpeed (inside its engine), XLA, Megatron or SageMaker model parallelism."""
    from accelerate.utils import DistributedType

    from transformers.utils import is_sagemaker_mp_enabled

    kind = trainer.accelerator.distributed_type
    return (callable(getattr(type(trainer), "_clip_grad_norm", None))
            and not is_sagemaker_mp_enabled()
            and kind not in (DistributedType.FSDP, DistributedType.DEEPSPEED,
                             DistributedType.XLA, DistributedType.MEGATRON_LM))
