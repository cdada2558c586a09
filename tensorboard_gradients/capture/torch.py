"""`GradientMonitor` for PyTorch: every parameter's gradient statistics, computed on its device.

```python
from tensorboard_gradients.torch import GradientMonitor

writer = SummaryWriter("logs/run1")              # torch.utils.tensorboard, or a path
with GradientMonitor(model, writer) as monitor:
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        writer.add_scalar("loss", loss.item(), step)
        monitor.step(step)    # after backward, before optimizer.step()
        optimizer.step()
# tensorboard --logdir logs   ->  Gradients tab, run "run1"
```

Steps: pass the number you log the same update's loss at, so the loss and the heatmap line up.
Without one, a step is the number of earlier `step` calls: 0, 1, 2, ..., the numbers of
``enumerate(loader)`` (the rule of every integration: docs/guide/steps.md).

Rows are ``model.named_parameters()`` in registration order (input side first for the usual
``nn.Sequential`` / ``__init__`` order); a row's layer is the owning module's path
(``layer1.0.conv1.weight`` -> ``layer1.0.conv1``). Parameters with ``requires_grad=False`` when
the monitor is created (frozen) are not logged; a watched parameter without a gradient at a step
is logged as missing and warned about once.

The statistics of all parameters are computed on their device (every statistic at every 10th
logged step by default: six passes per tensor, small tensors of one size reduced together; the
norms between: one multi-tensor ``torch._foreach_norm``, `torch_statistics`); ONE matrix a step is
copied to the host, which checks whether the fast pass can be trusted (the rare step with
NaN/Inf, overflow or underflowing squares takes a masked pass on the device and a second copy)
and finishes the ``[parameters, stats]`` matrix in numpy: no per-parameter ``.item()`` or
``.cpu()``, no other host sync. TensorFlow is never imported.

Order of calls in the usual recipes:

* AMP (``torch.autocast`` + ``GradScaler``): ``scaler.scale(loss).backward()``,
  ``scaler.unscale_(optimizer)``, ``monitor.step(scaler=scaler)`` (unscaled gradients; the scale
  is logged as ``<name>/loss_scale``), ``scaler.step(optimizer)``, ``scaler.update()``. A step
  the scaler skips has Inf/NaN gradients: they are logged as such.
* Clipping: ``total_norm = monitor.clip_grad_norm_(max_norm)`` in place of both ``step()`` and
  PyTorch's ``clip_grad_norm_``: it logs the pre-clip gradients and clips exactly as PyTorch
  does, in one pass where it can (`GradientMonitor.clip_grad_norm_`). Clipping yourself, call
  ``monitor.step()`` before ``clip_grad_norm_`` and pass it what that returns (``total_norm=``).
* The optimizer: ``GradientMonitor(model, writer, optimizer=optimizer)`` also logs, per
  parameter, the update the optimizer made (``update_l2_norm``; the tab shows update/weight) and,
  for Adam and AdamW, the RMS of ``g / sqrt(v)`` (``adam_rms``), read from the optimizer after its
  step (an optimizer step post-hook; `torch_optimizer` rebuilds the update from the optimizer's
  state without a copy of the weights). A logged step is then written when ``optimizer.step()``
  returns; a step the optimizer did not take (a ``GradScaler`` skipping an Inf step) is written
  at the next ``step()`` call without them (NaN).
* Gradient accumulation: call ``monitor.step()`` once per optimizer step (after the last
  ``backward`` of the accumulation), not per ``backward``.
* ``torch.compile``: compile the model, not the monitor; ``step()`` runs eagerly between
  ``backward`` and ``optimizer.step()``.
* DistributedDataParallel: after ``backward`` the gradients are all-reduced, so every rank holds
  the same ones: only rank 0 computes and writes; the other ranks' ``step()`` returns at once.
* Sharded parameters (DTensor: FSDP2 ``fully_shard``, tensor parallel, HSDP meshes; FSDP1
  ``FullyShardedDataParallel(..., use_orig_params=True)``, full or hybrid sharding): every rank
  reduces its own pieces to a small ``[parameters, k]`` matrix, ONE ``gather`` brings those to
  rank 0, which combines them by each statistic's rule (`statistics.combine_shards`: replicas
  counted once) and writes; no parameter is ever gathered whole. Names are the user's (FSDP1's
  ``_fsdp_wrapped_module.`` and activation checkpointing's prefixes are dropped). Create the
  monitor on the wrapped model (FSDP1 replaces each parameter by a view of this rank's part; a
  monitor made before says so at its first step). With gradient accumulation without sync
  (FSDP2 ``set_requires_gradient_sync(False)``, FSDP1 ``no_sync()``) call ``step()`` after the
  last, synchronising ``backward``. Every rank must call ``step()`` at every optimizer step, as
  in the usual loop: the ranks then agree on the logged steps by construction. A rank that skips
  a call leaves the others waiting in a collective (the monitor's gather or the engine's next
  one) until the process group's timeout (``init_process_group(timeout=...)``; NCCL's watchdog)
  fails the job with a timeout error; ranks that pass different ``step`` numbers are not mixed:
  rank 0 logs an error and leaves that step out.
* DeepSpeed: pass the engine ``deepspeed.initialize`` returns, ``GradientMonitor(engine, ...)``,
  and call ``step()`` after every ``engine.backward`` (before ``engine.step()``), on every rank:
  it logs only at the gradient accumulation boundary. Under ZeRO stages 1-3 each rank reduces
  the gradient fragments it holds (stages 1-2: the optimizer's partition; stage 3:
  ``safe_get_local_grad`` without its padding) and rank 0 combines and writes, as above; with
  ZeRO off the gradients are all-reduced and rank 0 alone computes. Names are the model's own.
  Under fp16 the gradients are divided by the optimizer's loss scale, which DeepSpeed only
  removes in ``engine.step()``. Parameters also split by tensor or expert parallelism are
  refused (their fragments' offsets repeat across ranks).
* The gather runs on the CPU when the process group has a CPU backend (gloo), else on the
  accelerator (an NCCL-only group). Every rank must watch the same parameters: ranks that do
  not (pipeline stages) all fail with a ValueError at the first logged step.
"""

import logging
from typing import NamedTuple, Optional

import numpy as np
import torch

from tensorboard_gradients.capture import options, torch_clip, torch_statistics
from tensorboard_gradients.capture.torch_distributed import Distribution, squared_norm, writes_here
from tensorboard_gradients.capture.torch_models import (
    deepspeed_engine, unwrapped, user_parameter_name)
from tensorboard_gradients.capture.torch_ops import ops_for
from tensorboard_gradients.capture.torch_optimizer import OptimizerReader, optimizer_note
from tensorboard_gradients.format import columns, metadata, statistics
from tensorboard_gradients.format.layout import Layout, MissingGradientWarnings
from tensorboard_gradients.format.writer import GradientWriter, run_directory

logger = logging.getLogger(__name__)

__all__ = ["GradientMonitor"]

# A logged step's statistics (`GradientMonitor.log`): all, or the norms (`EVERY_STEP_STATS`).
_FULL, _NORMS = "all", "norms"


def _detached(loss):  # a loss tensor's value is all the writer takes
    return loss.detach() if isinstance(loss, torch.Tensor) else loss


class _Extras(NamedTuple):  # a tuple: made at every logged step
    """What a logged step writes besides the gradients: the loss and the scalars' inputs."""

    loss: object = None
    total_norm: object = None
    scaler: object = None
    every_stat: bool = True  # False at a norms-only step: Adam's RMS, not a norm, is NaN there


class GradientMonitor:
    """Logs per-parameter gradient statistics of a PyTorch model to TensorBoard event files.

    Args:
      model: the `torch.nn.Module` (a `DistributedDataParallel`, FSDP or compiled module, or a
        DeepSpeed engine, works too: see the module).
      log_dir: the run directory, or a `torch.utils.tensorboard.SummaryWriter` whose run the
        gradients should join (next to your scalars). Files are created on the first logged step.
      every_n_steps: log the steps whose number is a multiple of N (1 = every step): by default
        the calls of `step` numbered 0, N, 2N, ... (see `step`).
      stats_every_n_steps: log every statistic at every N-th logged step (the first one, then
        every N-th), and at the logged steps between only the gradient norms and non-finite
        counts (what the spike, exploding, vanishing, NaN and early-warning rules judge every
        step; one multi-tensor norm instead of six passes per parameter), with ``optimizer``
        the weight and update norms too (`columns.every_step_stats`). 1: every statistic at
        every logged step.
      histograms_every_n_steps: also log the log10|g| histograms at the steps whose number is
        a multiple of N (None: never; they cost a pass per parameter).
      name: the summary name = the tag in the Gradients tab.
      include: regular expressions (or a list of them) searched in parameter names: only the
        parameters they match are watched (None: all).
      exclude: the same, for parameters not to watch (``exclude=r"\\.bias$"``).
      strict: raise when the event files cannot be written (a full disk, no permission). By
        default training goes on: the step is dropped, counted (`dropped_steps`) and reported,
        and later steps try again (see `tensorboard_gradients.format.writer`).
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm, update_l2_norm and adam_rms only when named.
      optimizer: the `torch.optim.Optimizer` that steps the model: its updates are logged too
        (``update_l2_norm`` and, for Adam and AdamW, ``adam_rms``; see the module), which is
        what tells a raised learning rate before the loss feels it. Rebuilt for SGD, Adam and
        AdamW; another optimizer's updates are not logged (a warning says so). Not with
        sharded parameters (FSDP, tensor parallel, ZeRO), whose optimizer holds pieces: there
        the update columns are NaN, and a warning says so.
      on_alert: called with each new `tensorboard_gradients.analysis.Alert` during training,
        on the training thread, once the step after the one that raised it is logged (or at
        `close`): what the Gradients tab would show, judged as the run goes (see `alerts`).
        What it raises reaches the loop (from ``step``; with ``optimizer``, from
        ``optimizer.step()``, which writes the row), so the loop can act on an alert: skip a
        batch, lower the rate, save a checkpoint, stop. On the writing process only.

    Raises:
      ValueError: a bad argument, or no parameter left to watch.
    """

    def __init__(self, model, log_dir, every_n_steps=1, histograms_every_n_steps=100,
                 name=metadata.DEFAULT_NAME, include=None, exclude=None, strict=False,
                 stats=None, optimizer=None, on_alert=None, stats_every_n_steps=10):
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        selected = columns.selected_stats(stats)
        self._gradient_stats = columns.gradient_stats(selected)
        self._logs_weights = "weight_l2_norm" in selected
        self.name = options.non_empty_name(name)
        self.every_n_steps = options.positive_int("every_n_steps", every_n_steps)
        self.histograms_every_n_steps = options.optional_positive_int(
            "histograms_every_n_steps", histograms_every_n_steps)
        self.stats_every_n_steps = options.stats_every(stats_every_n_steps)
        self._logged_rows = 0  # statistics rows of the schedule so far: every N-th is full
        include, exclude = options.patterns("include", include), options.patterns("exclude", exclude)
        deepspeed = deepspeed_engine(model)
        model = unwrapped(deepspeed.module if deepspeed else model)
        self._model = model  # what `clip_grad_norm_` clips: all of it, watched or not
        self._model_parameters = list(model.parameters())  # walking the modules: 0.25 ms/step
        self._parameters = [
            (user_parameter_name(parameter_name), parameter)
            for parameter_name, parameter in model.named_parameters()
            if parameter.requires_grad
            and options.selected((user_parameter_name(parameter_name),), include, exclude)
        ]
        self._watched_places = torch_clip.watched_places(self._model_parameters, self._parameters)
        if not self._parameters:
            raise ValueError("no trainable parameter left to watch (check include/exclude and "
                             "requires_grad)")
        self._distribution = Distribution(model, self._parameters, deepspeed)
        shapes = [self._distribution.full_shape(p) for _, p in self._parameters]
        self._sizes = np.array([np.prod(shape) for shape in shapes], dtype=np.float64)
        self._optimizer = self._optimizer_reader(optimizer, selected)
        self._layout = Layout.create([n for n, _ in self._parameters], shapes,
                                     with_weights=self._logs_weights,
                                     with_updates=self._optimizer is not None,
                                     gradient_stats=self._gradient_stats,
                                     with_optimizer=bool(self._optimizer and self._optimizer.adam),
                                     stats_every=self.stats_every_n_steps)
        self._l2_column = columns.position(self._layout.stats, "l2_norm")
        self.log_dir = run_directory(log_dir)
        self._writer = None  # created on the first logged step, on the writing rank only
        self._strict = bool(strict)
        if on_alert is not None and not callable(on_alert):
            raise ValueError(f"on_alert must be callable, got {type(on_alert).__name__}")
        self._on_alert = on_alert
        self._calls = 0
        self._checked = False
        self._missing = MissingGradientWarnings(logger)
        # The parameters, when the tag has their norms.
        self._weight_parameters = [p for _, p in self._parameters] if self._logs_weights else None
        self._norms_only = torch_statistics.NormsOnly(
            [n for n, _ in self._parameters], self._sizes, self._gradient_stats, self._missing)
        self._full_steps = torch_statistics.FullSteps(self._gradient_stats)
        self._pending = None  # a logged step's row until the optimizer's step completes it
        self._clip = None  # a `torch_clip.PendingClip` while `clip_and_log` logs
        self._global_norm_scalar = "global_norm"  # the Trainer's callback renames it

    def _optimizer_reader(self, optimizer, selected):
        """The reader of ``optimizer``'s updates, hooked after its steps (None: none logged)."""
        if optimizer is None:
            return None
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")
        if "update_l2_norm" not in selected:
            return None
        note = optimizer_note(optimizer)
        if note:
            logger.warning("GradientMonitor: %s", note)
            return None
        reader = OptimizerReader(optimizer, [p for _, p in self._parameters],
                                 adam="adam_rms" in selected)
        optimizer.register_step_post_hook(self._after_optimizer_step)
        return reader

    def step(self, step: Optional[int] = None, *, loss=None, total_norm=None,
             scaler=None) -> bool:
        """Logs this optimizer step's gradients if the schedule says so.

        Call after ``loss.backward()`` (and ``scaler.unscale_(optimizer)`` under AMP), before
        ``optimizer.step()``; once per optimizer step.

        Args:
          step: the step to log at: the number your loss scalar of this update is logged at.
            Default: the number of earlier `step` calls (0-based, as ``enumerate(loader)``).
            The schedules log the steps whose number is a multiple of ``every_n_steps`` (and
            of ``histograms_every_n_steps``): ``if step % N == 0``, as loops log their loss.
          loss: this step's training loss (a number or a one-element tensor; NaN and Inf are
            kept), logged beside the gradients at the steps they are: the rules judge gradients
            against it (a gradient spike the loss never felt is not a warning) and it marks the
            loss spikes. Without it the rules read the run's own ``loss`` scalar, when logged.
            A tensor on an accelerator is copied to the host at the logged steps only.
          total_norm: what ``torch.nn.utils.clip_grad_norm_`` returned (the global norm before
            clipping), logged as ``<name>/global_norm_before_clipping``.
          scaler: the AMP ``GradScaler``; its scale is logged as ``<name>/loss_scale``.

        Returns:
          True if statistics or histograms were written at this step, or (with ``optimizer``)
          will be when the optimizer's step completes them (False when the schedule
          skips it, on ranks other than 0 (DDP and sharded models), and when the write was
          dropped: see ``strict``; the events are written on the writer's background thread,
          so a disk that refuses them is known a write later).
        """
        with torch.no_grad():
            return self._step(step, loss=loss, total_norm=total_norm, scaler=scaler)[1]

    def _step(self, step, **extras):
        """`step` under the caller's ``no_grad``: (the step number it logged at or would
        have, whether it logged)."""
        self._write_pending()  # the last logged step's optimizer step never came (skipped)
        if self._distribution.accumulating():
            return None, False  # a micro-batch of an accumulation: its gradients are incomplete
        step = self._calls if step is None else int(step)
        self._calls += 1
        every_histograms = self.histograms_every_n_steps
        statistics_due = self.next_statistics() if step % self.every_n_steps == 0 else False
        histograms_due = every_histograms is not None and step % every_histograms == 0
        return step, self._log_step(step, statistics_due, histograms_due, **extras)

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None, *,
                        step: Optional[int] = None, loss=None, scaler=None):
        """Logs this step like `step` and clips the model's gradients in place exactly as
        ``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type,
        error_if_nonfinite, foreach)``; returns what it returns, the total norm before clipping
        (a tensor on the gradients' device). Call it instead of both, after ``backward`` (and
        ``scaler.unscale_(optimizer)``), before ``optimizer.step()``.

        Logged are the gradients the model produced (before clipping), and at the logged steps
        ``<name>/global_norm_before_clipping`` (the returned norm) and ``<name>/clip_coefficient``
        (``min(1, max_norm / (total + 1e-6))``, what the gradients were multiplied by). With
        the L2 norm the clip and the logging share their work: with plain tensors (DDP too)
        one pass, the clip's per-tensor norms being what a norms-only step logs; in pieces
        (FSDP2, HSDP, tensor parallel, FSDP1) one collective at a logged step, the monitor's
        gather, which brings every rank the total (`torch_clip.ShardedClip`; a DTensor total
        is returned replicated). Clipped are all of the model's parameters with a gradient,
        also those ``include`` and ``exclude`` leave unwatched. Elsewhere PyTorch's function
        clips (an FSDP1 model its own method). Every rank must call it, as `step`.

        Args:
          max_norm, norm_type, error_if_nonfinite, foreach: as ``torch.nn.utils
            .clip_grad_norm_``'s.
          step, loss, scaler: as `step`'s.

        Raises:
          RuntimeError: ``error_if_nonfinite`` and a total norm that is NaN or Inf (as PyTorch
            raises; this step is logged first, its non-finite gradients counted).
          ValueError: a DeepSpeed engine (it clips inside ``engine.step()``: set
            ``gradient_clipping`` in its configuration).
        """
        if self._distribution.deepspeed is not None:
            raise ValueError("a DeepSpeed engine clips its gradients itself, inside "
                             "engine.step(): set \"gradient_clipping\" in its configuration and "
                             "call monitor.step()")
        return self.clip_and_log(
            self._model_parameters, max_norm, norm_type, error_if_nonfinite, foreach,
            log=lambda: self._step(step, loss=loss, scaler=scaler))[0]

    @torch.no_grad()
    def clip_and_log(self, parameters, max_norm, norm_type, error_if_nonfinite, foreach, *,
                     log, clipped_norm=False):
        """`clip_grad_norm_` for integrations whose trainer clips (Lightning's): ``log()``
        logs the step (by `log` or `step`; returns (step, whether it logged)), and the
        gradients of ``parameters`` are clipped as ``torch.nn.utils.clip_grad_norm_(parameters,
        ...)`` does. ``clipped_norm``: also write ``global_norm_clipped`` (``global_norm`` x
        ``clip_coefficient``). Returns (the total norm, what ``log`` returned)."""
        # The model's own parameters: where each watched one is among them is known.
        places = self._watched_places if parameters is self._model_parameters else None
        max_norm, norm_type, parameters = float(max_norm), float(norm_type), list(parameters)
        clip = None
        if self._distribution.in_pieces():
            clip = self._distribution.sharded_clip(parameters, max_norm, norm_type,
                                                   error_if_nonfinite, foreach, clipped_norm)
        elif not torch_clip.is_fsdp1(self._model):
            clip = torch_clip.PendingClip.shared(parameters, self._parameters, max_norm,
                                                 norm_type, error_if_nonfinite, foreach,
                                                 clipped_norm, places)
        self._clip = clip
        try:
            logged = log()
            if clip is None or clip.total is None:  # not shared (or a step not gathered)
                total = torch_clip.clip_grad_norm_(self._model, parameters, max_norm,
                                                   norm_type, error_if_nonfinite, foreach)
                if logged[1] and writes_here():
                    self.write_scalars(logged[0], torch_clip.clip_scalars(total, max_norm))
                return total, logged
            clip.run()
        finally:
            self._clip = None
        if clip.refused:  # as PyTorch: raised before clipping (here after the step is logged)
            torch_clip.check_finite(clip.total, norm_type)
        return clip.returned_total, logged

    def next_statistics(self):
        """`log`'s ``statistics`` for the next logged step of a schedule (which it counts):
        True at every ``stats_every_n_steps``-th, the first included, ``"norms"`` between.
        For integrations that keep a schedule of their own (Lightning's)."""
        due = True if self._logged_rows % self.stats_every_n_steps == 0 else _NORMS
        self._logged_rows += 1
        return due

    def log(self, step: int, *, statistics=True, histograms=False, loss=None, total_norm=None,
            scaler=None) -> bool:
        """Logs the gradients now at ``step``, whatever the schedule: the statistics and/or the
        histograms. For integrations with a schedule of their own (and for a step you want
        whatever happens, e.g. the one where the loss jumped); under DDP and sharding every rank
        calls it alike, as `step`. ``statistics``: True for every statistic, ``"norms"`` for
        the norms only (`columns.EVERY_STEP_STATS`), False for none. Other arguments and the
        result as `step`'s."""
        if statistics not in (True, False, _NORMS):
            raise ValueError(f"statistics must be True, False or {_NORMS!r}, got "
                             f"{statistics!r}")
        with torch.no_grad():
            return self._log_step(step, statistics, histograms, loss, total_norm, scaler)

    def _log_step(self, step, statistics, histograms, loss=None, total_norm=None, scaler=None):
        """`log` under the caller's ``no_grad``."""
        statistics = _FULL if statistics is True else statistics
        if not (statistics or histograms):
            return False
        in_pieces = self._distribution.in_pieces()
        if not self._checked:  # on every rank, so a misuse fails them all, none left waiting
            self._distribution.check(self._sizes, in_pieces)
            if in_pieces and self._optimizer is not None:
                logger.warning("GradientMonitor: the optimizer of sharded parameters holds "
                               "pieces of them: their updates are not read (logged as NaN)")
                self._optimizer.readable = False
            self._checked = True
        self._write_pending()
        if not (in_pieces or writes_here()):
            return False
        dropped = self.dropped_steps
        log = self._log_pieces if in_pieces else self._log
        logged = log(int(step), statistics, bool(histograms),
                     _Extras(_detached(loss) if statistics else None, total_norm, scaler,
                             statistics == _FULL))
        return logged and self.dropped_steps == dropped

    def write_scalars(self, step: int, scalars) -> None:
        """Writes more ``<name>/<key>`` scalars at ``step`` (on the writing rank; else nothing)."""
        if writes_here():
            self._run_writer().write_scalars(step, scalars)

    def write_loss(self, step: int, loss) -> None:
        """Writes the loss of ``step`` after its gradients were logged (`step`'s ``loss``
        writes it with them): for trainers that report the loss once the step is done. On the
        writing process; nothing elsewhere."""
        if writes_here():
            self._run_writer().write_loss(step, _detached(loss))

    def write_epoch(self, step: int, epoch: int) -> None:
        """Marks the start of ``epoch`` at ``step`` for the tab (on the writing process)."""
        if writes_here():
            self._run_writer().write_epoch(step, epoch)

    def global_norm(self) -> Optional[float]:
        """The global L2 norm of the watched parameters' gradients as they are now, on the
        writing process; None on the others and without gradients. Under sharding every rank
        must call it, as `step` (ONE gather; rank 0 counts each distinct piece once)."""
        with torch.no_grad():
            if self._distribution.in_pieces():
                return self._distribution.global_norm()
            if not writes_here():
                return None
            squares = [squared_norm(p.grad).cpu() for _, p in self._parameters
                       if p.grad is not None]
            return float(torch.stack(squares).sum().sqrt()) if squares else None

    def _run_writer(self):
        """The run's writer, made on the first write (on the writing rank only)."""
        if self._writer is None:
            self._writer = GradientWriter(self.log_dir, self.name, strict=self._strict,
                                          on_alert=self._on_alert)
        return self._writer

    def _log_pieces(self, step, stats_due, histograms_due, extras):
        """`_log` for parameters in pieces: every rank reduces its own, rank 0 combines them
        (`Distribution.gather_step`) and writes."""
        # A norms-only step gathers the required stats (three passes; the norms' one is what
        # it keeps): the shards' rules combine the same reductions either way.
        full, every_step = stats_due == _FULL, self._layout.every_step
        weights_due = self._logs_weights and (full or "weight_l2_norm" in every_step)
        gathered = self._distribution.gather_step(
            step, self._gradient_stats if full else columns.REQUIRED_STATS, weights_due,
            histograms_due, self._clip)
        if gathered is None:
            return False
        absent = np.isnan(gathered.reductions[:, statistics.REDUCTIONS.index("present")])
        self._missing.warn([n for (n, _), a in zip(self._parameters, absent) if a])

        def finish():  # on the writer's thread, as `_log`'s (`torch_statistics.HostStats`)
            matrix = statistics.statistics_from_reductions(
                statistics.NumpyOps, gathered.reductions, np.where(absent, np.nan, self._sizes),
                gathered.weight_norms, self._gradient_stats).astype(gathered.dtype)
            computed = columns.stats_for(weights_due, False, self._gradient_stats)
            logged = columns.stats_for(self._logs_weights, False, self._gradient_stats)
            return matrix if full else statistics.norms_only_columns(
                statistics.NumpyOps, matrix, computed, logged, every_step)
        stats = torch_statistics.HostStats(np.dtype(gathered.dtype), finish) if stats_due else None
        return self._write(step, stats, gathered.histograms, extras)

    def _log(self, step, stats_due, histograms_due, extras):
        stats = (self._norms_only.from_clip(self._clip, self._weight_parameters,
                                            self._layout.every_step)
                 if stats_due == _NORMS else None)
        if stats is not None and not histograms_due:
            return self._write(step, stats, None, extras)  # the gradients not read again
        entries, dtype = torch_statistics.gradient_entries(
            self._parameters, self._sizes, self._distribution.loss_scale(), self._missing)
        if entries is None:
            logger.warning("step %s: no watched parameter has a gradient; nothing logged", step)
            return False
        ops = ops_for(next(e[0].device for e in entries if e is not None))
        counts = (statistics.histogram_matrix(ops, entries, dtype).cpu().numpy()
                  if histograms_due else None)
        if stats_due and stats is None:
            stats = (self._full_steps.matrix(ops, entries, dtype, self._weight_parameters)
                     if stats_due == _FULL
                     else self._norms_only.from_entries(ops, entries, dtype,
                                                        self._weight_parameters,
                                                        self._layout.every_step))
        return self._write(step, stats, counts, extras)

    def _write(self, step, stats, counts, extras):
        """Writes one logged step: statistics (with their loss and scalars) and/or histograms;
        with an optimizer, statistics wait for its step (`_after_optimizer_step`)."""
        if self._clip is not None:  # every gradient this step logs is read
            self._clip.run()
        scalars = clipped = None
        if stats is not None:  # now: the scaler's scale is this step's until its update()
            scalars = torch_clip.step_scalars(extras.total_norm, extras.scaler, self._clip)
            if self._clip is not None and self._clip.clipped_norm:
                clipped = scalars["clip_coefficient"]
        if stats is not None and self._optimizer is not None:
            self._pending = (step, stats, counts, extras.loss, scalars, clipped,
                             extras.every_stat)
            return True
        return self._write_now(step, stats, counts, extras.loss, scalars, clipped)

    def _after_optimizer_step(self, optimizer, args, kwargs):
        """The optimizer's step post-hook: completes and writes the pending row."""
        if self._pending is None:
            return
        if not self._optimizer.readable:
            self._write_pending()
            return
        try:
            with torch.no_grad():
                columns_read = self._optimizer.columns(self._pending[1].dtype)
        except Exception:  # an optimizer state this version does not know: never stop training
            logger.exception("GradientMonitor: could not read the optimizer's update; logged "
                             "as NaN")
            columns_read = None
        self._write_pending(columns_read)

    def _write_pending(self, optimizer_columns=None):
        """Writes the pending row with the optimizer's columns (NaN when its step was not
        seen: a step the optimizer skipped, or the monitor closed before it)."""
        if self._pending is None:
            return
        step, stats, counts, loss, scalars, clipped, every_stat = self._pending
        self._pending = None
        width = 1 + self._optimizer.adam
        if optimizer_columns is None:
            optimizer_columns = np.full((len(self._parameters), 2), np.nan, dtype=stats.dtype)
        if not every_stat:
            optimizer_columns[:, 1] = np.nan
        self._write_now(step, stats.then(lambda matrix: np.concatenate(
            [matrix, optimizer_columns[:, :width]], axis=1)), counts, loss, scalars, clipped)

    def _write_now(self, step, stats, counts, loss, scalars, clipped=None):
        writer = self._run_writer()
        if stats is None:
            writer.write_histograms(step, self._layout, counts)
        else:  # the global norms with the matrix, on the writer's thread (`torch_statistics`)
            writer.write_statistics_later(step, self._layout, stats.with_global_norm(
                self._l2_column, clipped, self._global_norm_scalar), counts, loss=loss,
                scalars=scalars)
        return True

    def alerts(self, wait: bool = False):
        """The alerts judged since the last call (`tensorboard_gradients.analysis.Alert`:
        findings the Gradients tab would show, each with the ``raised_step`` at which the
        analysis, fed step by step, raised it): judged in the background as steps are written,
        so an alert raised at a step is here once the next step is (within a second); ``wait``
        judges every step logged before the last one first; after `close`, all of them. Empty on
        processes that do not write."""
        return self._writer.alerts(wait=wait) if self._writer is not None else []

    @property
    def deepspeed(self):
        """The DeepSpeed engine around the watched model, or None."""
        return self._distribution.deepspeed

    @property
    def dropped_steps(self):
        """Logged steps that could not be written (see ``strict``)."""
        return self._writer.dropped_steps if self._writer else 0

    def close(self):
        """Flushes and closes the event file (the monitor can log again afterwards: its writer
        starts a new file)."""
        self._write_pending()
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
