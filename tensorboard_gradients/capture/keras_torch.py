"""The PyTorch recorder of the Keras `GradientMonitor`: statistics on the gradients' device.

Keras' torch trainer runs ``loss.backward()`` and then, under ``torch.no_grad()``,
``optimizer.apply(gradients, trainable_weights)`` with the ``.grad`` of each weight.
`StepRecorder` wraps ``apply`` on the optimizer INSTANCE (classes untouched) for the duration of
``fit``: it sees exactly the gradients that are applied, with no extra forward or backward pass.
At a logged step it computes the ``[variables, stats]`` matrix on the gradients' device with the
shared formulas (`format.statistics` through `capture.torch.TorchOps`: multi-tensor kernels) and
keeps it there; the host copies the kept matrices once per read (every few logged steps), so
training is not synchronised at every step.

What the statistics describe (as on TensorFlow): gradients unscaled (``LossScaleOptimizer``,
``loss_scale_factor``); pre-clip statistics with the clipped global norm as a scalar; a weight
whose ``.grad`` is None is logged as missing; ``update_l2_norm`` = ``||w_after - w_before||``,
measured on a copy of the watched weights taken before ``apply`` at logged steps (the torch
optimizers update the weights in place with multi-tensor kernels, which leave no update value to
read): one copy of the watched weights per logged step, in memory only during ``apply``;
``adam_rms`` from the optimizer's second moment after ``apply``.

``jit_compile=True`` (``torch.compile`` of the train step): the recorder's work is excluded from
the compiled graph (``torch.compiler.disable``) and runs eagerly between the compiled parts.
"""

import numpy as np
import torch

from tensorboard_gradients.capture.keras_hooks import (
    SCALAR_GLOBAL_NORM_CLIPPED,
    Recorder,
    adam_gradients,
    adam_rms,
    adam_second_moments,
    global_norm,
)
from tensorboard_gradients.capture.torch_ops import TorchOps, ops_for
from tensorboard_gradients.format import statistics


def _tensor(variable):
    """The torch tensor behind a Keras variable (the trainer's ``v.value``), detached."""
    return variable.value.detach()


class StepRecorder(Recorder):
    """Records the statistics of every ``every_n_steps``-th optimizer step of one model (torch).

    Same arguments as the TensorFlow recorder (`keras_recorder.StepRecorder`); Keras' torch
    backend runs one step per execution (``steps_per_execution`` must be 1 there).
    """

    distributed = False

    def __init__(self, model, watched, every_n_steps, histograms_every_n_steps,
                 steps_between_reads, first_step_index, stats=None, stats_every_n_steps=1):
        del steps_between_reads
        super().__init__(model, watched, every_n_steps, histograms_every_n_steps, stats,
                         stats_every_n_steps)
        self._watched_ids = {id(v) for v in self.watched}
        self._completed = int(first_step_index)
        self._rows = []  # (step, stats, scalars) still on the device
        self._histogram_rows = []

    # --- installation -------------------------------------------------------------------------

    def install(self, trainable_variables):
        optimizer = self._optimizer
        if not optimizer.built:
            optimizer.build(trainable_variables)
        original = optimizer.apply
        before_update = torch.compiler.disable(self._before_update)
        after_update = torch.compiler.disable(self._after_update)

        def apply(grads, trainable_variables=None):
            grads = list(grads)
            variables = (
                list(self._optimizer._trainable_variables)
                if trainable_variables is None
                else list(trainable_variables)
            )
            pending = before_update(grads, variables)
            result = original(grads, trainable_variables)
            if pending is not None:
                after_update(*pending)
            return result

        self._patches.apply(optimizer, "apply", apply)

    def uninstall(self):
        self._patches.undo()

    # --- inside the train step ----------------------------------------------------------------

    def _unscale(self, grads):
        if self._loss_scaled:
            scale = _tensor(self._optimizer.dynamic_scale)
            grads = [None if g is None else g / scale.to(g.dtype) for g in grads]
        factor = self._inner.loss_scale_factor
        if factor is not None:
            grads = [None if g is None else g / factor for g in grads]
        return grads

    @torch.no_grad()
    def _before_update(self, grads, variables):
        """Records the statistics (and histograms) of this step; returns what `_after_update`
        needs to add the update norms, or None when the step is not logged or without them."""
        index = self._completed
        self._completed += 1
        stats_due = index % self._every == 0
        histograms_due = bool(self._histogram_every) and index % self._histogram_every == 0
        if not (stats_due or histograms_due):
            return None
        unscaled = self._unscale(grads)
        by_variable = {id(v): g for v, g in zip(variables, unscaled)}
        watched = [by_variable.get(id(v)) for v in self.watched]
        present = [g for g in watched if g is not None]
        weights = [_tensor(v) for v in self.watched]
        dtype = TorchOps.computation_dtype([g.dtype for g in present] or [w.dtype for w in weights])
        device = (present or weights)[0].device
        ops = ops_for(device)
        entries = [None if g is None else (g.to(device=device, dtype=dtype), g.numel())
                   for g in watched]
        if histograms_due:
            counts = statistics.histogram_matrix(ops, entries, dtype)
            self._histogram_rows.append((index + 1, counts))
        if not stats_due:
            return None
        weights = [w.to(device=device, dtype=dtype) for w in weights]
        full = self.full_step(index)
        stats = self.step_statistics(ops, entries, weights if self.logs_weights else None,
                                     dtype, full)
        others = [g.to(device=device, dtype=dtype) for v, g in zip(variables, unscaled)
                  if g is not None and id(v) not in self._watched_ids]
        other_squares = ops.sum(ops.square_sums(others)) if others else torch.zeros(
            (), dtype=dtype, device=device)
        scalars = [global_norm(ops, stats, self.stat_names, other_squares)]
        if SCALAR_GLOBAL_NORM_CLIPPED in self.scalar_names:
            clipped = self._inner._clip_gradients([g for g in unscaled if g is not None])
            scalars.append(ops.sqrt(ops.sum(ops.square_sums(
                [g.to(device=device, dtype=dtype) for g in clipped]))))
        finite = None  # a LossScaleOptimizer skips a step whose gradients are not all finite
        if self._loss_scaled:
            finite = torch.stack([torch.isfinite(g).all().to(device) for g in grads
                                  if g is not None]).all()
            scalars += [_tensor(self._optimizer.dynamic_scale), ~finite]
        scalars = torch.stack([torch.as_tensor(s).to(device=device, dtype=torch.float32)
                               for s in scalars])
        if not (self.records_updates or self.records_adam):
            self._rows.append((index + 1, stats, scalars))
            return None
        # The weights as they are before `apply` changes them in place.
        before = [w.clone() for w in weights] if self.records_updates else None
        adam = None  # (the gradients Adam received, whether the step was taken)
        if self.records_adam and full:  # Adam's RMS is not a norm: NaN at norms-only steps
            adam = ([None if g is None else g.to(device=device, dtype=dtype)
                     for g in adam_gradients(self._inner, unscaled, variables, self.watched)],
                    finite)
        return index + 1, stats, scalars, before, adam, ops, dtype

    @torch.no_grad()
    def _after_update(self, step, stats, scalars, before, adam, ops, dtype):
        device = stats.device
        extra = []
        if before is not None:
            deltas = [_tensor(v).to(device=device, dtype=dtype) - b
                      for v, b in zip(self.watched, before)]
            extra.append(ops.sqrt(ops.square_sums(deltas)))
        if self.records_adam and adam is None:
            extra.append(torch.full((len(self.watched),), float("nan"), dtype=dtype,
                                    device=device))
        elif adam is not None:
            gradients, finite = adam
            inner = self._inner
            seconds = [_tensor(v).to(device=device, dtype=dtype)
                       for v in adam_second_moments(inner, self.watched)]
            # ``iterations`` counts this step now: it is Adam's t (kept on the device: no sync).
            extra.append(adam_rms(ops, inner, gradients, seconds,
                                  _tensor(inner.iterations).to(device=device, dtype=dtype),
                                  finite))
        self._rows.append((step, torch.cat([stats, torch.stack(extra, dim=1)], dim=1), scalars))

    # --- host side ----------------------------------------------------------------------------

    def completed_steps(self):
        return self._completed

    def skip(self, steps):
        self._completed += steps

    def read(self):
        """Everything recorded since the last read: (completed steps, stat rows, histogram rows),
        as `keras_recorder.StepRecorder.read` returns them."""
        rows, self._rows = self._rows, []
        histogram_rows, self._histogram_rows = self._histogram_rows, []
        stat_rows = [
            (step, stats.cpu().numpy(), dict(zip(self.scalar_names, scalars.cpu().tolist())))
            for step, stats, scalars in rows
        ]
        return self._completed, stat_rows, [(s, c.cpu().numpy()) for s, c in histogram_rows]


# --- probe_data -------------------------------------------------------------------------------


def probe_function(model, watched, histograms):
    """The statistics of the compiled loss' gradients on one fixed batch (``training=True``,
    ``model.compute_loss``), by ``torch.autograd.grad`` of the watched weights only: the
    weights' ``.grad`` are left alone."""
    import keras

    def probe(x, y, sample_weight):
        x, y, sample_weight = keras.tree.map_structure(
            lambda a: None if a is None else keras.ops.convert_to_tensor(a), (x, y, sample_weight))
        with torch.enable_grad():
            y_pred = model(x, training=True)
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            tensors = [v.value for v in watched]
            grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        with torch.no_grad():
            present = [g for g in grads if g is not None]
            dtype = TorchOps.computation_dtype([g.dtype for g in present] or [torch.float32])
            device = tensors[0].device
            ops = ops_for(device)
            entries = [None if g is None else (g.to(device=device, dtype=dtype), g.numel())
                       for g in grads]
            weights = [t.detach().to(device=device, dtype=dtype) for t in tensors]
            stats = statistics.statistics_matrix(ops, entries, weights, dtype)
            counts = statistics.histogram_matrix(ops, entries, dtype) if histograms else None
        return stats, counts

    return probe


def run_probe(model, function, batch):
    """Runs `probe_function` with the model's states (BatchNorm, RNG seeds, metrics) restored,
    and torch's global random state: unseeded ``Dropout`` draws from it on this backend."""
    state = list({id(v): v for v in model.non_trainable_variables + model.metrics_variables}.values())
    saved = [np.array(v) for v in state]
    accelerators = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=accelerators):
            stats, counts = function(*batch)
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)
    return stats.cpu().numpy(), None if counts is None else counts.cpu().numpy()
