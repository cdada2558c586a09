"""The TensorFlow recorder of the Keras `GradientMonitor`: statistics inside the train step.

`StepRecorder` wraps ``model.optimizer.apply`` on the optimizer INSTANCE (the user's model and
optimizer classes are untouched). Keras' train step calls ``apply`` with exactly the gradients it
is about to apply, so the recorder sees the real training gradients with no extra forward or
backward pass. Inside the (possibly XLA-compiled) step it computes the ``[variables, stats]``
matrix and stores it in a small ring buffer of device variables; the host reads the buffer only
every few steps. No summary op runs inside the step, so ``jit_compile=True`` works.

What the statistics describe:

* Loss scaling: ``LossScaleOptimizer`` (mixed precision) and ``loss_scale_factor`` gradients
  arrive scaled; they are unscaled first, in the same order and dtype as Keras does, so the
  statistics are of the gradients that are applied. Skipped (non-finite) steps are recorded too.
* Clipping (``clipnorm``, ``clipvalue``, ``global_clipnorm``) happens inside the optimizer after
  ``apply`` starts: the statistics are pre-clip; the global norm after the optimizer's clipping
  rule is recorded as a scalar.
* Distribution strategies (several replicas): ``apply`` runs once per replica with that replica's
  partial gradient. The recorder sums the partial gradients across replicas (one reduce, to the
  first device) in a ``merge_call`` and records the statistics of that sum once per step: the
  all-reduced gradient Keras applies.
* Updates: ``update_l2_norm`` (``||w_after - w_before||``) is taken from the values the optimizer
  passes to its ``assign``/``assign_add``/``assign_sub`` (plus the decoupled weight decay the
  optimizer applied just before), so no copy of the weights is kept. ``adam_rms`` (Adam and
  AdamW) is read after the step from the optimizer's second moment (`statistics.adam_rms`), with
  the gradients as Adam received them (clipped by the optimizer's rule when it clips). Neither is
  available with several replicas, where updates run per device.

Longer than this project's other modules on purpose: `StepRecorder` is one traced train step's
worth of state (the ring buffer, the ``apply`` hook and the update hooks share it); split across
files, one step's logic could no longer be read in one place.
"""

import math

import keras
import tensorflow as tf

from tensorboard_gradients.capture import tensorflow_ops
from tensorboard_gradients.capture.keras_hooks import (
    RECORDED_STEPS_PER_READ,
    SCALAR_GLOBAL_NORM_CLIPPED,
    Recorder,
    adam_gradients,
    adam_rms,
    adam_second_moments,
)
from tensorboard_gradients.format import columns


def _tf_variable(variable):
    return variable.value if isinstance(variable, keras.Variable) else variable


def buffer_capacity(steps_per_execution, every_n_steps):
    """Slots so that RECORDED_STEPS_PER_READ steps plus one more execution's steps fit."""
    return RECORDED_STEPS_PER_READ + math.ceil(steps_per_execution / every_n_steps) + 1


def _branch(condition, if_true, if_false):
    """``tf.cond(condition, if_true, if_false)``, or ``if_true()`` alone where ``condition`` is
    the constant True (every step logged; every logged step full).

    Not a formality: the optimizer's update of a weight waits for every op that reads it before
    (TensorFlow's automatic control dependencies), and to them a cond is one op. A logged step
    reads the weights in a cond, so the whole step's updates waited for all its gradients and
    every statistic of the cond (benchmarks/NOTES.md, "the Keras recorder's cond").
    """
    if condition is True:
        return if_true()
    return tf.cond(condition, if_true, if_false)


def _when(condition, record):
    """Runs ``record`` in the traced step where ``condition`` holds (`_branch`)."""
    _branch(condition, record, lambda: tf.constant(False))


def _rows(variable):
    return variable.shape[0] if len(variable.shape) else None


class StepRecorder(Recorder):
    """Records the statistics of every ``every_n_steps``-th optimizer step of one model.

    Args:
      model: a compiled Keras 3 model on the TensorFlow backend.
      watched: the trainable Keras variables to record, in model order.
      every_n_steps: record steps whose 0-based index is a multiple of this.
      histograms_every_n_steps: the same for the log10|g| histograms (None: never).
      steps_between_reads: ``steps_per_execution``: the host can only read between executions, so
        the ring buffer holds RECORDED_STEPS_PER_READ recorded steps plus one execution's.
      first_step_index: the 0-based index of the next optimizer step.
      stats: the stats to record (`columns.selected_stats`; None: all).
      stats_every_n_steps: every stat at every N-th recorded step, the norms only between
        (`Recorder.full_step`).
    """

    def __init__(self, model, watched, every_n_steps, histograms_every_n_steps,
                 steps_between_reads, first_step_index, stats=None, stats_every_n_steps=1):
        self._strategy = model.distribute_strategy
        self.distributed = self._strategy.num_replicas_in_sync > 1
        self.updates_recordable = not self.distributed
        super().__init__(model, watched, every_n_steps, histograms_every_n_steps, stats,
                         stats_every_n_steps)
        self._watched_ids = {id(v): i for i, v in enumerate(self.watched)}
        self._watched_by_tf_variable = {id(_tf_variable(v)): i for i, v in enumerate(self.watched)}
        self.stat_count = len(self.stat_names)
        self._step_deltas = None  # while a step is traced with every step logged: its updates
        self._step_graph = None  # the graph that step is traced in
        self.dtype = tensorflow_ops.TensorFlowOps.computation_dtype([v.dtype for v in self.watched])

        variables = len(self.watched)
        capacity = buffer_capacity(steps_between_reads, every_n_steps)
        with self._strategy.scope():
            self._completed = self._variable(first_step_index, tf.int64)
            self._stats = self._variable(
                tf.fill([capacity, variables, self.stat_count], math.nan), self.dtype
            )
            self._scalars = self._variable(
                tf.zeros([capacity, len(self.scalar_names)]), tf.float32
            )
            self._stat_steps = self._variable(tf.fill([capacity], -1), tf.int64)
            if histograms_every_n_steps:
                histogram_capacity = buffer_capacity(steps_between_reads, histograms_every_n_steps)
                self._histograms = self._variable(
                    tf.zeros([histogram_capacity, variables, columns.HISTOGRAM_BINS]), self.dtype
                )
                self._histogram_steps = self._variable(tf.fill([histogram_capacity], -1), tf.int64)
            if self.records_updates:
                self._update_squares = self._variable(tf.zeros([variables]), self.dtype)

    def _set_row(self, buffer, slot, value):
        if self.distributed:
            # Slice assignment and scatter updates are unavailable on mirrored variables in the
            # cross-replica context where distributed steps record: assign the whole buffer.
            buffer.assign(
                tf.tensor_scatter_nd_update(buffer, tf.reshape(slot, [1, 1]), value[tf.newaxis])
            )
        else:
            buffer[slot].assign(value)

    @staticmethod
    def _variable(initial, dtype):
        return tf.Variable(
            tf.cast(initial, dtype),
            trainable=False,
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )

    # --- installation -------------------------------------------------------------------------

    def install(self, trainable_variables):
        if not self._optimizer.built:
            # The hook reads optimizer state (the loss scale) before `apply` would build it.
            with self._strategy.scope():
                self._optimizer.build(trainable_variables)
            self._optimizer.built = True
        original_apply = self._optimizer.apply

        def apply(grads, trainable_variables=None):
            grads = list(grads)
            variables = (
                list(self._inner._trainable_variables)
                if trainable_variables is None
                else list(trainable_variables)
            )
            pending = self._before_update(grads, variables)
            result = original_apply(grads, trainable_variables)
            if pending is not None:
                self._store_after_update(*pending)
            return result

        self._patches.apply(self._optimizer, "apply", apply)
        if self.records_updates:
            for name, sign in (("assign", None), ("assign_add", 1.0), ("assign_sub", -1.0)):
                self._patches.apply(
                    self._inner, name, self._update_hook(getattr(self._inner, name), sign)
                )

    def uninstall(self):
        self._patches.undo()

    # --- inside the train step ----------------------------------------------------------------

    def _before_update(self, grads, variables):
        """Records the step; returns what `_store_after_update` needs, or None."""
        if self.distributed:
            tf.distribute.get_replica_context().merge_call(
                self._record_reduced, args=(grads, variables)
            )
            return None
        return self._record(grads, variables)

    def _store_after_update(self, logged, full, slot, grads, variables):
        """At a logged step, after ``apply``: the update norms and Adam's RMS (`grads`: the
        unscaled gradients of ``variables``)."""
        deltas = self._step_deltas

        def store():  # recorded only without replicas: plain variables, slice assign
            if self.records_updates:
                column = columns.position(self.stat_names, "update_l2_norm")
                squares = self._update_squares.read_value()
                if deltas:  # every step logged: these squares in a few grouped reductions
                    zero = tf.zeros([], self.dtype)
                    squares += tensorflow_ops.TensorFlowOps.square_sums(
                        [zero if i not in deltas else
                         tensorflow_ops.dense_values(deltas[i], self.dtype, _rows(v))
                         for i, v in enumerate(self.watched)])
                self._stats[slot, :, column].assign(tf.sqrt(squares))
            if self.records_adam:  # Adam's RMS is not a norm: NaN at norms-only steps
                self._stats[slot, :, columns.position(self.stat_names, "adam_rms")].assign(
                    _branch(full, lambda: self._adam_rms(grads, variables),
                            lambda: tf.fill([len(self.watched)], tf.constant(math.nan,
                                                                             self.dtype))))
            return tf.constant(True)

        _when(logged, store)

    def _adam_rms(self, grads, variables):
        inner = self._inner
        dense = [None if g is None else tf.cast(tf.convert_to_tensor(g), self.dtype)
                 for g in adam_gradients(inner, grads, variables, self.watched)]
        seconds = [tf.cast(_tf_variable(v), self.dtype)
                   for v in adam_second_moments(inner, self.watched)]
        # ``iterations`` counts this step now: it is Adam's t.
        return adam_rms(tensorflow_ops.TensorFlowOps, inner, dense, seconds,
                        tf.cast(_tf_variable(inner.iterations), self.dtype),
                        self._all_finite(grads) if self._loss_scaled else None)

    def _record_reduced(self, strategy, grads, variables):
        present = [i for i, g in enumerate(grads) if g is not None]
        destination = strategy.extended.worker_devices[0]
        reduced = strategy.extended.batch_reduce_to(
            tf.distribute.ReduceOp.SUM, [(grads[i], destination) for i in present]
        )
        summed = [None] * len(grads)
        for i, value in zip(present, reduced):
            summed[i] = strategy.experimental_local_results(value)[0]
        with tf.device(destination):
            self._record(summed, variables)

    def _unscale(self, grads):
        if self._loss_scaled:
            grads = [tensorflow_ops.divided(g, self._optimizer.dynamic_scale) for g in grads]
        if self._inner.loss_scale_factor is not None:
            grads = [tensorflow_ops.divided(g, self._inner.loss_scale_factor) for g in grads]
        return grads

    def _record(self, grads, variables):
        grads = self._unscale(grads)
        by_variable = {id(v): g for v, g in zip(variables, grads)}
        watched_grads = [by_variable.get(id(v)) for v in self.watched]
        completed = self._completed.read_value()
        # Every step logged: the update hooks hand over their deltas (index -> delta) when they
        # run in this graph; else (an optimizer applying inside a cond, as the loss scale
        # optimizer does) each hook reduces its own into the squares variable.
        self._step_deltas = {} if self._every == 1 else None
        self._step_graph = tf.compat.v1.get_default_graph()
        if self.records_updates:
            self._update_squares.assign(tf.zeros_like(self._update_squares))

        logged = True if self._every == 1 else tf.equal(completed % self._every, 0)
        full = True if self._stats_every == 1 else self.full_step(completed)
        slot = (completed // self._every) % self._stats.shape[0]

        def record_stats():
            ops = tensorflow_ops.TensorFlowOps
            entries, weights, dtype = tensorflow_ops.statistics_arguments(
                watched_grads, self.watched, self.logs_weights)
            stats = tf.cast(_branch(
                full, lambda: self.step_statistics(ops, entries, weights, dtype, True),
                lambda: self.step_statistics(ops, entries, weights, dtype, False)), self.dtype)
            after = int(self.records_updates) + int(self.records_adam)
            if after:  # filled in by `_store_after_update` once the optimizer applied this step
                stats = tf.concat([stats, tf.zeros([len(self.watched), after], stats.dtype)], 1)
            self._set_row(self._stats, slot, stats)
            self._set_row(self._scalars, slot, self._step_scalars(grads, variables, stats))
            self._set_row(self._stat_steps, slot, completed + 1)
            return tf.constant(True)

        _when(logged, record_stats)
        if self._histogram_every:

            def record_histograms():
                slot = (completed // self._histogram_every) % self._histograms.shape[0]
                self._set_row(
                    self._histograms,
                    slot,
                    tf.cast(tensorflow_ops.histogram_counts(watched_grads, self.watched), self.dtype),
                )
                self._set_row(self._histogram_steps, slot, completed + 1)
                return tf.constant(True)

            _when(self._histogram_every == 1 or tf.equal(completed % self._histogram_every, 0),
                  record_histograms)
        self._completed.assign_add(1)
        if self.records_updates or self.records_adam:
            return logged, full, slot, grads, variables
        return None

    def _step_scalars(self, grads, variables, stats):
        values = [self._global_norm(grads, variables, stats)]
        if SCALAR_GLOBAL_NORM_CLIPPED in self.scalar_names:
            present = [(g, v) for g, v in zip(grads, variables) if g is not None]
            clipped = self._inner._clip_gradients([g for g, _ in present])
            values.append(self._global_norm(clipped, [v for _, v in present], None))
        if self._loss_scaled:
            finite = self._all_finite(grads)
            values += [
                tf.cast(self._optimizer.dynamic_scale, tf.float32),
                tf.cast(tf.logical_not(finite), tf.float32),
            ]
        return tf.stack([tf.cast(v, tf.float32) for v in values])

    @staticmethod
    def _all_finite(grads):
        """Whether every entry of the gradients is finite: a ``LossScaleOptimizer`` skips the
        step otherwise."""
        return tf.reduce_all([
            tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
            for g in grads if g is not None])

    def _global_norm(self, grads, variables, watched_stats):
        """L2 norm over all gradients (sparse rows summed); NaN/Inf when any entry is.

        With `watched_stats`, the watched variables' share comes from their (overflow-safe)
        ``l2_norm`` column instead of another pass over their gradients.
        """
        dtype = self.dtype
        squares = [tf.zeros([], dtype)]
        for variable, gradient in zip(variables, grads):
            if gradient is None or (watched_stats is not None and id(variable) in self._watched_ids):
                continue
            squares.append(tensorflow_ops.sum_of_squares(gradient, dtype, _rows(variable)))
        total = tf.add_n(squares)
        if watched_stats is None:
            return tf.sqrt(total)
        column = lambda name: columns.position(self.stat_names, name)  # noqa: E731
        present = tf.logical_not(tf.math.is_nan(watched_stats[:, column("size")]))

        def present_sum(name, transform=lambda x: x):
            return tf.reduce_sum(tf.where(present, transform(watched_stats[:, column(name)]), 0))

        total += present_sum("l2_norm", tf.square)
        norm = tf.sqrt(total)
        norm = tf.where(present_sum("inf_count") > 0, tf.constant(math.inf, dtype), norm)
        return tf.where(present_sum("nan_count") > 0, tf.constant(math.nan, dtype), norm)

    def _update_hook(self, original, sign):
        def hooked(variable, value):
            index = self._watched_by_tf_variable.get(id(_tf_variable(variable)))
            if index is not None:

                def store_square():
                    delta = self._update_delta(self.watched[index], variable, value, sign)
                    self._update_squares[index].assign(
                        tensorflow_ops.sum_of_squares(delta, self.dtype, _rows(self.watched[index])))
                    return tf.constant(True)

                if (self._step_deltas is not None
                        and tf.compat.v1.get_default_graph() is self._step_graph):
                    self._step_deltas[index] = self._update_delta(
                        self.watched[index], variable, value, sign)
                elif self._every == 1:
                    store_square()
                else:  # only a logged step's update norm is kept: skip the others' reduction
                    # `_record` already counted this step, hence the - 1.
                    logged = tf.equal((self._completed.read_value() - 1) % self._every, 0)
                    tf.cond(logged, store_square, lambda: tf.constant(False))
            return original(variable, value)

        return hooked

    def _update_delta(self, watched, variable, value, sign):
        """``w_after - w_before`` of this step's update to `variable` (dense or IndexedSlices),
        or its negative: only its norm is taken. So ``assign_sub``'s value is used as it is,
        not negated (a pass over the entries saved) unless weight decay is added to it."""
        dtype = self.dtype
        current = tf.cast(tf.convert_to_tensor(_tf_variable(variable)), dtype)
        inner = self._inner
        decayed = inner.weight_decay is not None and inner._use_weight_decay(watched)
        if sign is None:  # assign(variable, new_value)
            if isinstance(value, tf.IndexedSlices):
                value = tf.convert_to_tensor(value)
            delta = tf.cast(value, dtype) - current
        else:
            signed = (lambda x: sign * x) if decayed else (lambda x: x)  # noqa: E731
            delta = (tf.IndexedSlices(signed(tf.cast(value.values, dtype)), value.indices,
                                      value.dense_shape)
                     if isinstance(value, tf.IndexedSlices) else signed(tf.cast(value, dtype)))
        if decayed:
            # The optimizer already scaled the weights by (1 - c) this step (c = lr * decay) before
            # calling us, so w_before = current / (1 - c) and the decay moved them by -c/(1-c) * current.
            c = tf.cast(inner.learning_rate, dtype) * tf.cast(inner.weight_decay, dtype)
            delta = tf.convert_to_tensor(delta) - c / (1 - c) * current
        return delta

    # --- host side ----------------------------------------------------------------------------

    def completed_steps(self):
        return int(self._completed.numpy())

    def skip(self, steps):
        self._completed.assign_add(steps)

    def read(self):
        """Everything buffered: (completed steps, stat rows, histogram rows).

        Stat rows are ``(step, stats[variables, stats], {scalar: value})``; histogram rows are
        ``(step, counts[variables, bins])``; steps are 1-based optimizer steps, -1 = empty slot.
        """
        stat_steps = self._stat_steps.numpy()
        stats = self._stats.numpy()
        scalars = self._scalars.numpy()
        rows = [
            (int(step), stats[i], dict(zip(self.scalar_names, scalars[i].tolist())))
            for i, step in enumerate(stat_steps)
            if step >= 0
        ]
        histogram_rows = []
        if self._histogram_every:
            histogram_steps = self._histogram_steps.numpy()
            histograms = self._histograms.numpy()
            histogram_rows = [
                (int(step), histograms[i]) for i, step in enumerate(histogram_steps) if step >= 0
            ]
        return self.completed_steps(), rows, histogram_rows
