"""The JAX recorder of the Keras `GradientMonitor`: statistics inside the jitted train step.

Keras' JAX trainer computes the gradients with ``jax.value_and_grad`` and hands them to
``optimizer.stateless_apply(optimizer_variables, grads, trainable_variables)``, which returns the
new weights. `StepRecorder` wraps ``stateless_apply`` on the optimizer INSTANCE (classes
untouched) for the duration of ``fit``, so it sees exactly the gradients that are applied and
both the weights before and after the update, with no extra forward or backward pass. Under
``jit`` (``jit_compile=True``, the default) the statistics are traced into the compiled step:
a ``lax.cond`` computes them only at logged steps, and an `io_callback` hands the host only the
small ``[variables, stats]`` matrix (and the scalars; the ``[variables, bins]`` histogram
counts on histogram steps). Without ``jit`` (``jit_compile=False``) the host picks the logged
steps and runs the same statistics as one compiled function, whose results stay on the device
until the host reads them.

The step: ``optimizer.iterations`` as the step receives it (a traced value, read from the
optimizer variables the step is given), so ``every_n_steps`` is decided on the device. A
``LossScaleOptimizer`` does not count the steps it skips (non-finite gradients) in
``iterations``; to keep those steps visible and numbered as on the other backends, the step
number then comes from the host: one ordered ``io_callback`` per step returns it (a scalar; the
statistics still stay on the device on the steps that are not logged).

What the statistics describe (as on TensorFlow): gradients unscaled (``LossScaleOptimizer``,
``loss_scale_factor``) in the same order and dtype as Keras does; pre-clip statistics with the
clipped global norm as a scalar; ``update_l2_norm`` = ``||w_after - w_before||`` of the weights
``stateless_apply`` returns (weight decay, EMA and every other rule of the optimizer included;
0 at a skipped step); ``adam_rms`` from the second moment among the optimizer variables it
returns. A trainable variable that does not reach the loss gets zeros from
``jax.grad`` (Keras applies those), not a missing gradient as on TensorFlow and PyTorch.

Under a `keras.distribution` (``DataParallel`` tested, on two devices) the gradients inside the
step are global arrays: XLA reduces them where they lie and the callback receives the small
results. Multi-process runs (``jax.distributed``) are not supported: every process would write.
"""

import functools
import threading

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from tensorboard_gradients.capture.jax import JaxOps
from tensorboard_gradients.capture.keras_hooks import (
    SCALAR_GLOBAL_NORM_CLIPPED,
    Recorder,
    adam_gradients,
    adam_rms,
    adam_second_moments,
    global_norm,
    optimizers,
)
from tensorboard_gradients.format import statistics


def _all_finite(grads):
    """Whether every entry of the gradients is finite: a ``LossScaleOptimizer`` skips the step
    otherwise."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in grads if g is not None]))


def _position(variables, variable):
    ids = [id(v) for v in variables]
    return ids.index(id(variable))


class StepRecorder(Recorder):
    """Records the statistics of every ``every_n_steps``-th optimizer step of one model (JAX).

    Same arguments as the TensorFlow recorder (`keras_recorder.StepRecorder`); nothing is
    buffered on the device (``steps_between_reads`` is not needed): the rows reach the host as
    the steps run and wait there until `read`.
    """

    distributed = False  # XLA reduces global arrays: one gradient, whatever the distribution

    def __init__(self, model, watched, every_n_steps, histograms_every_n_steps,
                 steps_between_reads, first_step_index, stats=None, stats_every_n_steps=1):
        del steps_between_reads
        super().__init__(model, watched, every_n_steps, histograms_every_n_steps, stats,
                         stats_every_n_steps)
        self._model = model
        self._lock = threading.Lock()
        self._rows = []
        self._histogram_rows = []
        self._next_index = int(first_step_index)  # the host's count (LossScaleOptimizer only)

    # --- installation -------------------------------------------------------------------------

    def install(self, trainable_variables):
        optimizer = self._optimizer
        if not optimizer.built:
            optimizer.build(trainable_variables)
        trained = self._trained = optimizer._trainable_variables
        self._positions = [_position(trained, v) for v in self.watched]
        if self.records_adam:
            self._adam_positions = [_position(optimizer.variables, v) for v in
                                    adam_second_moments(self._inner, self.watched)]
            self._adam_iterations = _position(optimizer.variables, self._inner.iterations)
        watched = set(self._positions)
        self._unwatched = [i for i in range(len(trained)) if i not in watched]
        self._iterations = _position(optimizer.variables, optimizer.iterations)
        if self._loss_scaled:
            self._dynamic_scale = _position(optimizer.variables, optimizer.dynamic_scale)
        original = optimizer.stateless_apply

        def stateless_apply(optimizer_variables, grads, trainable_variables):
            traced = any(isinstance(v, jax.core.Tracer)
                         for v in jax.tree_util.tree_leaves((optimizer_variables, grads)))
            index = self._step_index(optimizer_variables, traced)
            new_trainable, new_optimizer = original(optimizer_variables, grads, trainable_variables)
            record = self._record if traced else self._record_eagerly
            record(index, list(optimizer_variables), list(grads), list(trainable_variables),
                   list(new_trainable), list(new_optimizer))
            return new_trainable, new_optimizer

        self._patches.apply(optimizer, "stateless_apply", stateless_apply)
        # Compiled once per recorder (and shapes): inlined into a traced step, and what keeps an
        # eager (``jit_compile=False``) step from running the statistics op by op.
        self._stats_functions = {full: jax.jit(functools.partial(self._stats_and_scalars,
                                                                  full=full))
                                 for full in (True, False)}
        self._histogram_function = jax.jit(self._histogram_matrix)

    def uninstall(self):
        self._patches.undo()

    # --- inside the train step ----------------------------------------------------------------

    def _step_index(self, optimizer_variables, traced):
        """The 0-based index of this step: a traced int32 scalar under ``jit``, else an int."""
        if self._loss_scaled:
            if not traced:
                return self._take_index()
            return io_callback(self._take_index, jax.ShapeDtypeStruct((), jnp.int32), ordered=True)
        iterations = optimizer_variables[self._iterations]
        return jnp.asarray(iterations, jnp.int32) if traced else int(iterations)

    def _take_index(self):
        with self._lock:
            index = self._next_index
            self._next_index += 1
        return np.int32(index)

    def _unscale(self, grads, optimizer_variables):
        if self._loss_scaled:
            scale = optimizer_variables[self._dynamic_scale]
            grads = [None if g is None else g / jnp.asarray(scale, g.dtype) for g in grads]
        factor = self._inner.loss_scale_factor
        if factor is not None:
            grads = [None if g is None else g / factor for g in grads]
        return grads

    def _record(self, index, optimizer_variables, grads, before, after, optimizer_after):
        """Inside a traced step: the statistics at logged steps only (``lax.cond``), handed to
        the host by `io_callback`."""

        def record_stats(full):
            stats, scalars = self._stats_functions[full](optimizer_variables, grads, before,
                                                         after, optimizer_after)
            io_callback(self._receive_stats, None, index + 1, stats, scalars)

        jax.lax.cond(index % self._every == 0,
                     lambda: jax.lax.cond(self.full_step(index), lambda: record_stats(True),
                                          lambda: record_stats(False)),
                     lambda: None)
        if self._histogram_every:

            def record_histograms():
                counts = self._histogram_function(optimizer_variables, grads)
                io_callback(self._receive_histograms, None, index + 1, counts)

            jax.lax.cond(index % self._histogram_every == 0, record_histograms, lambda: None)

    def _record_eagerly(self, index, optimizer_variables, grads, before, after, optimizer_after):
        """The same without ``jit``: the matrices stay on the device until `read`."""
        if index % self._every == 0:
            stats, scalars = self._stats_functions[bool(self.full_step(index))](
                optimizer_variables, grads, before, after, optimizer_after)
            self._receive_stats(index + 1, stats, scalars)
        if self._histogram_every and index % self._histogram_every == 0:
            counts = self._histogram_function(optimizer_variables, grads)
            self._receive_histograms(index + 1, counts)

    def _entries(self, optimizer_variables, grads):
        """(unscaled gradients, the watched ones' statistics inputs, computation dtype)."""
        unscaled = self._unscale(grads, optimizer_variables)
        watched = [unscaled[i] for i in self._positions]
        dtype = JaxOps.computation_dtype(
            [g.dtype for g in watched if g is not None] or [v.dtype for v in self.watched])
        return unscaled, [None if g is None else (g.astype(dtype), g.size) for g in watched], dtype

    def _stats_and_scalars(self, optimizer_variables, grads, before, after, optimizer_after,
                           full=True):
        unscaled, entries, dtype = self._entries(optimizer_variables, grads)
        weights = ([before[i].astype(dtype) for i in self._positions] if self.logs_weights
                   else None)
        stats = self.step_statistics(JaxOps, entries, weights, dtype, full)
        extra = []
        if self.records_updates:
            extra.append(JaxOps.sqrt(JaxOps.square_sums(
                [after[i].astype(dtype) - before[i].astype(dtype) for i in self._positions])))
        if self.records_adam:  # Adam's RMS is not a norm: NaN at norms-only steps
            extra.append(self._adam_rms(unscaled, optimizer_after, dtype) if full
                         else jnp.full((len(self.watched),), jnp.nan, dtype))
        if extra:
            stats = jnp.concatenate([stats, jnp.stack(extra, axis=1)], axis=1)
        return stats, self._scalars(grads, unscaled, stats, optimizer_variables, dtype)

    def _adam_rms(self, unscaled, optimizer_after, dtype):
        """From the optimizer variables ``stateless_apply`` returned: ``iterations`` counts this
        step there (Adam's t)."""
        watched = adam_gradients(self._inner, unscaled, self._trained, self.watched)
        seconds = [optimizer_after[i].astype(dtype) for i in self._adam_positions]
        return adam_rms(JaxOps, self._inner, [None if g is None else g.astype(dtype)
                                              for g in watched], seconds,
                        jnp.asarray(optimizer_after[self._adam_iterations], dtype),
                        _all_finite(unscaled) if self._loss_scaled else None)

    def _histogram_matrix(self, optimizer_variables, grads):
        _, entries, dtype = self._entries(optimizer_variables, grads)
        return statistics.histogram_matrix(JaxOps, entries, dtype)

    def _scalars(self, grads, unscaled, stats, optimizer_variables, dtype):
        others = [unscaled[i].astype(dtype) for i in self._unwatched if unscaled[i] is not None]
        zero = jnp.zeros((), dtype)
        other_squares = JaxOps.sum(JaxOps.square_sums(others)) if others else zero
        values = [global_norm(JaxOps, stats, self.stat_names, other_squares)]
        if SCALAR_GLOBAL_NORM_CLIPPED in self.scalar_names:
            clipped = self._inner._clip_gradients([g for g in unscaled if g is not None])
            values.append(JaxOps.sqrt(JaxOps.sum(JaxOps.square_sums(
                [g.astype(dtype) for g in clipped]))))
        if self._loss_scaled:
            finite = _all_finite(grads)
            values += [optimizer_variables[self._dynamic_scale], jnp.logical_not(finite)]
        return jnp.stack([jnp.asarray(v, jnp.float32) for v in values])

    # --- host side ----------------------------------------------------------------------------

    def _receive_stats(self, step, stats, scalars):
        """Keeps a row (numpy from `io_callback`; device arrays, read later, when eager)."""
        with self._lock:
            self._rows.append((step, stats, scalars))

    def _receive_histograms(self, step, counts):
        with self._lock:
            self._histogram_rows.append((step, counts))

    def skip(self, steps):
        with self._lock:  # the host's count only; otherwise the optimizer counted them
            self._next_index += steps

    def completed_steps(self):
        if self._loss_scaled:
            jax.effects_barrier()
            with self._lock:
                return self._next_index
        # Inside an epoch the model's variables are purged: the current values are the
        # trainer's `_jax_state` (what callbacks read to sync the state).
        state = getattr(self._model, "_jax_state", None)
        if state and state.get("optimizer_variables"):
            return int(np.asarray(state["optimizer_variables"][self._iterations]))
        return int(np.asarray(self._optimizer.iterations))

    def read(self):
        """Everything received since the last read: (completed steps, stat rows, histogram rows),
        as `keras_recorder.StepRecorder.read` returns them."""
        jax.effects_barrier()  # every step dispatched so far has handed over its rows
        with self._lock:
            rows, self._rows = self._rows, []
            histogram_rows, self._histogram_rows = self._histogram_rows, []
        rows = [(int(step), np.asarray(stats),
                 dict(zip(self.scalar_names, np.asarray(scalars).tolist())))
                for step, stats, scalars in rows]
        histogram_rows = [(int(step), np.asarray(counts)) for step, counts in histogram_rows]
        return self.completed_steps(), rows, histogram_rows


# --- probe_data -------------------------------------------------------------------------------


def probe_function(model, watched, histograms):
    """A jitted function: the statistics of the compiled loss' gradients on one fixed batch,
    through the trainer's own stateless loss (``compute_loss_and_updates``, ``training=True``).
    Stateless: the new layer states (BatchNorm statistics, dropout seeds) it computes are
    dropped, so the probe does not change training."""
    optimizer, inner, loss_scaled = optimizers(model)
    positions = [_position(model.trainable_variables, v) for v in watched]
    scale_position = (
        _position(optimizer.variables, optimizer.dynamic_scale) if loss_scaled else None)

    @jax.jit
    def probe(trainable, non_trainable, metrics, optimizer_variables, x, y, sample_weight):
        def loss(values):
            return model.compute_loss_and_updates(
                values, non_trainable, metrics, x, y, sample_weight, training=True,
                optimizer_variables=optimizer_variables)

        grads, _ = jax.grad(loss, has_aux=True)(trainable)
        # The loss was scaled as in training (`optimizer.scale_loss`): unscale the same way.
        scale = optimizer_variables[scale_position] if loss_scaled else inner.loss_scale_factor
        grads = [grads[i] if scale is None else grads[i] / jnp.asarray(scale, grads[i].dtype)
                 for i in positions]
        dtype = JaxOps.computation_dtype([g.dtype for g in grads])
        entries = [(g.astype(dtype), g.size) for g in grads]
        weights = [trainable[i].astype(dtype) for i in positions]
        stats = statistics.statistics_matrix(JaxOps, entries, weights, dtype)
        counts = statistics.histogram_matrix(JaxOps, entries, dtype) if histograms else None
        return stats, counts

    return probe


def run_probe(model, function, batch):
    """Runs `probe_function` on the model's current values (between epochs they are synced)."""
    values = lambda variables: [v.value for v in variables]  # noqa: E731
    stats, counts = function(
        values(model.trainable_variables), values(model.non_trainable_variables),
        values(model.metrics_variables), values(model.optimizer.variables), *batch)
    return np.asarray(stats), None if counts is None else np.asarray(counts)
