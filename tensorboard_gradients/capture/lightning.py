"""`GradientMonitor` for PyTorch Lightning: a callback that logs the gradients of every optimizer
step into the run of the trainer's `TensorBoardLogger`.

```python
import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.precision import Precision
from tensorboard_gradients.lightning import GradientMonitor

trainer = L.Trainer(logger=TensorBoardLogger("logs"), callbacks=[GradientMonitor()])
trainer.fit(model, train_dataloaders)
# tensorboard --logdir logs   ->  Gradients tab, run "lightning_logs/version_0",
#                                 the same run as the loss you log with self.log(...)
```

The callback drives the PyTorch monitor (`tensorboard_gradients.torch.GradientMonitor`, whose
docstring says what is computed and how) from Lightning's ``on_before_optimizer_step`` hook,
which runs once per optimizer step, after the last ``backward`` of a gradient accumulation and
after AMP's unscaling, before gradient clipping and ``optimizer.step()``. So it logs the
gradients the model produced: with ``accumulate_grad_batches=k`` once per k batches (the
accumulated gradients), under ``precision="16-mixed"`` the unscaled ones.

Where: the run directory of the trainer's `TensorBoardLogger` (``trainer.logger.log_dir``, the
first TensorBoardLogger of ``trainer.loggers``), the directory of the logger's own
SummaryWriter, so TensorBoard shows the Gradients tab and the scalars you log of one run (in an
event file of their own). Lightning's default logger is a TensorBoardLogger under
``default_root_dir``; without one (``logger=False``, only a CSV or W&B logger) ``fit`` stops at
its start with a ValueError that says to add one: the gradients are not written anywhere else.

Steps: the step at which Lightning logs what ``training_step`` logs for the same optimizer step
(``self.log("train_loss", loss)``): 0 for the first optimizer step, counted across epochs, one
per optimizer step under gradient accumulation, continued after resuming from a checkpoint. The
loss and the gradients of an optimizer step share its step number in TensorBoard.
``every_n_steps=N`` logs every N-th optimizer step, the steps s with (s + 1) % N == 0 (N - 1,
2N - 1, ...): where Lightning logs your scalars with ``log_every_n_steps=N``, so with the two
equal every gradient column has its loss point (Lightning's default ``log_every_n_steps`` is
50: set it to N). The start of each epoch is marked (``<name>_epochs``) for the UI.

The loss ``training_step`` returns for the batch that completes a logged optimizer step (a
tensor, or a dict's ``"loss"``) is logged beside its gradients (``<name>_loss``), for the
loss-spike rule.

Besides the ``<name>`` statistics (and ``<name>_histograms``), the run gets the scalars
``<name>/global_norm`` (the watched parameters, before clipping), ``<name>/loss_scale`` under
``16-mixed`` (the GradScaler of Lightning's precision plugin), and, when the trainer clips
(``gradient_clip_val``, by norm or value, or a ``configure_gradient_clipping`` of your own),
``<name>/global_norm_clipped``: the norm of the same parameters' gradients after the clipping.
Lightning's own clipping by norm (its precision plugin's ``clip_grad_by_norm``) is done by the
monitor in its logging pass (`torch.GradientMonitor.clip_and_log`: one pass over the gradients,
the same bits), and the clipped norm is ``global_norm`` x ``<name>/clip_coefficient`` (NaN at a
step the GradScaler skips: Inf gradients times 0); otherwise it is measured when
``optimizer.step()`` has used the gradients (a skipped step has none).

Strategies: single device, DDP (the model's gradients are all-reduced, rank 0 writes) and FSDP
(``FSDPStrategy``, which Lightning creates with ``use_orig_params=True``): the monitor is made at
the first optimizer step, on the model the strategy wrapped, so it sees the sharded parameters;
every rank reduces its shards and rank 0 combines and writes (see the PyTorch monitor). Every
rank runs the callback, as Lightning runs every callback on every rank: nothing to do. The
FSDP strategy clips by value only (Lightning refuses ``gradient_clip_algorithm="norm"`` there);
the clipped norm is then measured on the shards and combined the same way. Under DeepSpeed
(CUDA only in Lightning) the engine is monitored at its accumulation boundaries, and the clipped
norm is not logged (DeepSpeed clips inside ``engine.step()``).

Manual optimization: ``on_before_optimizer_step`` runs inside each ``optimizer.step()``, so the
gradients are logged there, after any ``self.clip_gradients`` you call before it. Lightning logs
one step per batch: with several optimizers, only the first optimizer step of each batch is
logged (watch the parameters that optimizer updates with ``include``/``exclude``).

Mixed precision: with an optimizer that unscales the gradients itself (``fused=True``), they are
still multiplied by the loss scale at the hook; the callback warns once.

The callback is a ``lightning.pytorch.Callback`` (the ``lightning`` package, 2.x); the
standalone ``pytorch_lightning`` package is not supported (its Trainer refuses callbacks of the
other package).
"""

import logging

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.utilities.model_helpers import is_overridden

from tensorboard_gradients.capture import options
from tensorboard_gradients.capture import torch as torch_capture
from tensorboard_gradients.capture.torch_models import deepspeed_engine
from tensorboard_gradients.format import columns, metadata

logger = logging.getLogger(__name__)

__all__ = ["GradientMonitor"]

SCALAR_GLOBAL_NORM_CLIPPED = "global_norm_clipped"  # the Keras monitor's name for it


def tensorboard_log_dir(trainer) -> str:
    """The run directory of the trainer's (first) TensorBoardLogger.

    Raises:
      ValueError: the trainer has no TensorBoardLogger.
    """
    for candidate in trainer.loggers:
        if isinstance(candidate, TensorBoardLogger):
            return candidate.log_dir
    found = ", ".join(type(c).__name__ for c in trainer.loggers) or "no logger (logger=False)"
    raise ValueError(
        "tensorboard_gradients' GradientMonitor writes into the run of the trainer's "
        "TensorBoardLogger, so the Gradients tab shows the same run as your loss, but the "
        f"trainer has {found}: add one, e.g. Trainer(logger=TensorBoardLogger('logs')) or "
        "Trainer(logger=[your_logger, TensorBoardLogger('logs')])")


def _only_optimizer(trainer):
    """The trainer's torch optimizer when it has one (its updates are logged), else None."""
    optimizers = trainer.optimizers
    if len(optimizers) == 1 and isinstance(optimizers[0], torch.optim.Optimizer):
        return optimizers[0]
    return None


def logger_step(trainer) -> int:
    """The step at which Lightning logs what the current batch logs (``self.log`` in
    ``training_step``): its count of batches that stepped an optimizer, which Lightning's own
    LearningRateMonitor logs at too (``trainer.global_step`` counts each optimizer of a manual
    optimization, and is the same number in automatic optimization)."""
    loop = getattr(trainer.fit_loop, "epoch_loop", None)
    step = getattr(loop, "_batches_that_stepped", None)
    return int(trainer.global_step if step is None else step)


class GradientMonitor(pl.Callback):
    """Logs per-parameter gradient statistics of a LightningModule at every optimizer step, into
    the run of the trainer's TensorBoardLogger (see the module).

    Args:
      every_n_steps: log every N-th optimizer step: the steps s with (s + 1) % N == 0, where
        Lightning logs your scalars with ``log_every_n_steps=N`` (1 = every step).
      histograms_every_n_steps: also log the log10|g| histograms on their own schedule (None:
        never; they cost a pass per parameter).
      stats_every_n_steps: every statistic at every N-th logged step (the first, then every
        N-th), the norms and NaN/Inf counts only at the logged steps between (the PyTorch
        monitor's; 1: every statistic at every logged step).
      name: the summary name = the tag in the Gradients tab.
      include: regular expressions (or a list of them) searched in parameter names (the
        LightningModule's, ``net.0.weight``): only the parameters they match are watched
        (None: all).
      exclude: the same, for parameters not to watch.
      strict: raise when the event files cannot be written (a full disk, no permission). By
        default training goes on: the step is dropped, counted and reported.
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm, update_l2_norm and adam_rms only when named. With one
        optimizer its updates are logged (the PyTorch monitor's ``optimizer``).
      on_alert: called with each new `tensorboard_gradients.analysis.Alert` during ``fit``
        (the PyTorch monitor's ``on_alert``); `alerts` returns them too.

    Raises:
      ValueError: a bad argument; at the start of ``fit``, a trainer without TensorBoardLogger;
        at the first optimizer step, no parameter left to watch.
    """

    def __init__(self, every_n_steps=1, histograms_every_n_steps=100,
                 name=metadata.DEFAULT_NAME, include=None, exclude=None, strict=False,
                 stats=None, on_alert=None, stats_every_n_steps=10):
        super().__init__()
        self.stats_every_n_steps = options.stats_every(stats_every_n_steps)
        self.on_alert = on_alert
        self.stats = columns.selected_stats(stats)
        self.every_n_steps = options.positive_int("every_n_steps", every_n_steps)
        self.histograms_every_n_steps = options.optional_positive_int(
            "histograms_every_n_steps", histograms_every_n_steps)
        self.name = options.non_empty_name(name)
        options.patterns("include", include)  # checked now; the PyTorch monitor compiles them
        options.patterns("exclude", exclude)
        self.include, self.exclude = include, exclude
        self.strict = bool(strict)
        self.log_dir = None  # the logger's run, known at the start of fit
        self._reset()

    def alerts(self, wait: bool = False):
        """The alerts judged since the last call (the PyTorch monitor's `alerts`)."""
        return self.monitor.alerts(wait=wait) if self.monitor is not None else []

    def _reset(self):
        self.monitor = None  # the PyTorch monitor, made at the first optimizer step of a fit
        self._last_step = None
        self._clipping = False
        self._clipped_step = None  # a logged step whose clipped norm is still to be measured
        self._shared_clip = None  # the precision plugin whose clipping by norm the monitor does
        self._pending_log = None  # the step's logging, which that clip does
        self._hooked = {}  # id(optimizer) -> its step post-hook's handle
        self._epoch_mark = None  # (step, epoch) to write
        self._warned_fused = False
        self._loss_step = None  # the step whose statistics this batch logged: its loss is due

    # Lightning hooks ----------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            self._close()
            self._reset()
            self.log_dir = tensorboard_log_dir(trainer)

    def on_train_epoch_start(self, trainer, pl_module):
        self._epoch_mark = (logger_step(trainer), trainer.current_epoch)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        engine = deepspeed_engine(trainer.model)
        if engine is not None and not engine.is_gradient_accumulation_boundary():
            return  # a DeepSpeed micro-batch: the engine steps at the boundary
        step = logger_step(trainer)
        if step == self._last_step:
            return  # another optimizer (or closure call) of the same batch: logged once
        self._last_step = step
        if self.monitor is None:
            self._start(trainer, pl_module)
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None and scaler.is_enabled():
            self._warn_if_fused(optimizer)
        self._hook(optimizer)
        # Lightning logs scalars at the steps s with (s + 1) % log_every_n_steps == 0: the
        # same rule puts each logged gradient step on a loss point when the two are equal.
        stats_due = (step + 1) % self.every_n_steps == 0
        histograms_due = bool(self.histograms_every_n_steps
                              and (step + 1) % self.histograms_every_n_steps == 0)
        statistics = stats_due and self.monitor.next_statistics()
        self._loss_step = step if stats_due else None
        if self._shared_clip is not None:  # logged by the clip, in its pass (`_clip_by_norm`)
            self._pending_log = lambda: self._log(step, statistics, histograms_due, scaler)
            return
        self._clipped_step = step if (stats_due and self._clipping) else None
        self._log(step, statistics, histograms_due, scaler)

    def _log(self, step, statistics, histograms, scaler):
        logged = self.monitor.log(step, statistics=statistics, histograms=histograms,
                                  scaler=scaler)
        if logged and self._epoch_mark is not None:
            self.monitor.write_epoch(*self._epoch_mark)
            self._epoch_mark = None
        return step, logged

    def _clip_by_norm(self, optimizer, clip_val):
        """The precision plugin's ``clip_grad_by_norm`` while the callback shares the clip: the
        pending step is logged and the gradients clipped in one pass
        (`torch.GradientMonitor.clip_and_log`), exactly as the plugin's own method clips
        (``torch.nn.utils.clip_grad_norm_`` of the optimizer's parameters)."""
        log, self._pending_log = self._pending_log, None
        plugin = self._shared_clip
        if log is None:  # an optimizer step whose gradients this callback does not log
            type(plugin).clip_grad_by_norm(plugin, optimizer, clip_val)
        else:
            self.monitor.clip_and_log(list(plugin.main_params(optimizer)), clip_val, 2.0, False,
                                      None, log=log, clipped_norm=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """Writes the loss ``training_step`` returned for the batch that completed the logged
        optimizer step (a tensor, or a dict's ``"loss"``), at that step."""
        step, self._loss_step = self._loss_step, None
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if step is not None and self.monitor is not None and loss is not None:
            self.monitor.write_loss(step, loss)

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit":
            self._close()

    def on_exception(self, trainer, pl_module, exception):
        self._close()

    # ---------------------------------------------------------------------------------------

    def _start(self, trainer, pl_module):
        """Makes the PyTorch monitor on the model the strategy wrapped (DDP, FSDP, DeepSpeed)."""
        if self.log_dir is None:  # fit started without `setup` (a hand-driven loop)
            self.log_dir = tensorboard_log_dir(trainer)
        self.monitor = torch_capture.GradientMonitor(
            trainer.model, self.log_dir, every_n_steps=self.every_n_steps,
            histograms_every_n_steps=self.histograms_every_n_steps,
            stats_every_n_steps=self.stats_every_n_steps, name=self.name,
            include=self.include, exclude=self.exclude, strict=self.strict, stats=self.stats,
            optimizer=_only_optimizer(trainer),
            on_alert=self.on_alert)
        custom = is_overridden("configure_gradient_clipping", pl_module)
        clips = (trainer.gradient_clip_val or 0) > 0 or custom
        self._clipping = bool(clips and pl_module.automatic_optimization
                              and self.monitor.deepspeed is None)
        plugin = trainer.precision_plugin
        # Lightning's own clipping by norm (the plugin's method, which FSDP's and DeepSpeed's
        # plugins replace): the monitor clips in its logging pass instead.
        if (self._clipping and not custom and trainer.gradient_clip_algorithm in (None, "norm")
                and type(plugin).clip_grad_by_norm is Precision.clip_grad_by_norm):
            self._shared_clip = plugin
            plugin.clip_grad_by_norm = self._clip_by_norm

    def _hook(self, optimizer):
        """Measures the clipped norm when ``optimizer.step()`` has used the gradients."""
        if not self._clipping or id(optimizer) in self._hooked:
            return
        register = getattr(optimizer, "register_step_post_hook", None)
        if register is None:
            logger.warning("%s has no step post-hook: %s/%s is not logged",
                           type(optimizer).__name__, self.name, SCALAR_GLOBAL_NORM_CLIPPED)
            self._hooked[id(optimizer)] = None
            return
        self._hooked[id(optimizer)] = register(self._after_optimizer_step)

    def _after_optimizer_step(self, optimizer, args, kwargs):
        step, self._clipped_step = self._clipped_step, None
        if step is None or self.monitor is None:
            return
        norm = self.monitor.global_norm()  # every rank: one gather under sharding
        if norm is not None:
            self.monitor.write_scalars(step, {SCALAR_GLOBAL_NORM_CLIPPED: norm})

    def _warn_if_fused(self, optimizer):
        if not self._warned_fused and getattr(optimizer, "_step_supports_amp_scaling", False):
            self._warned_fused = True
            logger.warning(
                "%s unscales the gradients in its own step (fused): at on_before_optimizer_step "
                "they are still multiplied by the loss scale, and are logged so",
                type(optimizer).__name__)

    def _close(self):
        if self._shared_clip is not None:  # the plugin's own method again
            del self._shared_clip.clip_grad_by_norm
            self._shared_clip = None
        for handle in self._hooked.values():
            if handle is not None:
                handle.remove()
        self._hooked = {}
        if self.monitor is not None:
            self.monitor.close()
