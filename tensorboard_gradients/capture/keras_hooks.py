"""What the Keras `GradientMonitor`'s three recorders share, free of any backend import.

A recorder (`keras_recorder` for TensorFlow, `keras_jax`, `keras_torch`) is what the host side
(`keras`) talks to, with one interface:

* ``StepRecorder(model, watched, every_n_steps, histograms_every_n_steps, steps_between_reads,
  first_step_index, stats, stats_every_n_steps)`` (every statistic at every
  ``stats_every_n_steps``-th logged step, `Recorder.full_step`; the norms only between);
* ``install(trainable_variables)`` / ``uninstall()``: hook the optimizer instance for one ``fit``
  and put it back exactly (`Patches`);
* ``read()`` -> ``(completed steps, [(step, stats, {scalar: value})], [(step, counts)])``;
* ``completed_steps()``; ``skip(steps)``: the optimizer took that many steps without the
  recorder (a ``fit`` without the monitor), which the numbering must count; the attributes
  ``watched``, ``records_updates``, ``records_adam``, ``distributed``;

and, for ``probe_data``, ``probe_function(model, watched, histograms)`` and
``run_probe(model, function, batch)`` -> ``(stats, counts or None)`` (TensorFlow's in
`keras_probe`).

Steps are 1-based optimizer steps; a row of step k holds the statistics of the k-th update.
"""

import numpy as np

from tensorboard_gradients.format import columns, statistics

SCALAR_GLOBAL_NORM = "global_norm"
SCALAR_GLOBAL_NORM_CLIPPED = "global_norm_clipped"
SCALAR_LOSS_SCALE = "loss_scale"
SCALAR_SKIPPED_STEP = "skipped_step"

# The host reads the recorded steps once this many have been recorded (or an epoch ends): one
# device-to-host sync per 16 recorded steps instead of one per step.
RECORDED_STEPS_PER_READ = 16


class Patches:
    """Instance-attribute overrides that can be undone exactly."""

    def __init__(self):
        self._undo = []

    def apply(self, owner, attribute, replacement):
        own = vars(owner)
        self._undo.append((owner, attribute, attribute in own, own.get(attribute)))
        setattr(owner, attribute, replacement)

    def undo(self):
        for owner, attribute, had_own, previous in reversed(self._undo):
            if had_own:
                setattr(owner, attribute, previous)
            else:
                delattr(owner, attribute)
        self._undo = []


def optimizers(model):
    """``(optimizer, inner optimizer, loss scaled)``: the inner one is what a
    ``LossScaleOptimizer`` wraps (the optimizer itself otherwise)."""
    import keras

    optimizer = model.optimizer
    loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    return optimizer, optimizer.inner_optimizer if loss_scaled else optimizer, loss_scaled


def clips(optimizer):
    return any(
        getattr(optimizer, a, None) is not None for a in ("clipnorm", "clipvalue", "global_clipnorm")
    )


def scalar_names(clipping, loss_scaled):
    """The ordinary scalars a recorder logs with each stats row, in order."""
    names = [SCALAR_GLOBAL_NORM]
    if clipping:
        names.append(SCALAR_GLOBAL_NORM_CLIPPED)
    if loss_scaled:
        names += [SCALAR_LOSS_SCALE, SCALAR_SKIPPED_STEP]
    return names


def reads_adam_moments(optimizer):
    """Whether the (inner) optimizer is Keras' Adam or AdamW, whose second moment ``adam_rms``
    reads after each step: Keras' own classes (the PyTorch backend's multi-tensor ones are
    subclasses with the same update), not a user's subclass (which may change the update), and
    not with ``gradient_accumulation_steps`` (the moment then moves once every few steps)."""
    import keras

    return (isinstance(optimizer, keras.optimizers.Adam)
            and type(optimizer).__module__.startswith("keras.")
            and not optimizer.gradient_accumulation_steps)


def adam_second_moments(optimizer, watched):
    """Per watched variable, the (built) Adam optimizer's variable holding the second moment it
    divides that variable's step by: ``v``, or AMSGrad's running maximum of it."""
    seconds = optimizer._velocity_hats if optimizer.amsgrad else optimizer._velocities
    return [seconds[optimizer._get_variable_index(v)] for v in watched]


def adam_gradients(optimizer, grads, variables, watched):
    """The watched variables' gradients as Adam receives them in ``apply``: ``grads`` (of
    ``variables``, unscaled) clipped by the optimizer's own rule when it clips; None for a
    variable without one."""
    present = [(g, v) for g, v in zip(grads, variables) if g is not None]
    clipped = optimizer._clip_gradients([g for g, _ in present]) if clips(optimizer) else (
        [g for g, _ in present])
    by_variable = {id(v): g for (_, v), g in zip(present, clipped)}
    return [by_variable.get(id(v)) for v in watched]


def adam_rms(ops, optimizer, gradients, seconds, steps, taken=None):
    """`statistics.adam_rms` of a step of Keras' Adam ``optimizer``, over ``ops``: ``gradients``
    as it received them (`adam_gradients`), ``seconds`` its second moments after the step
    (`adam_second_moments`), ``steps`` its ``iterations`` after the step (Adam's t: a scalar of
    the computation dtype, read on the device), ``taken`` whether a ``LossScaleOptimizer`` took
    the step (None: no loss scaling). A skipped step moved no moment: its row is NaN, as the
    PyTorch monitor writes a skipped step's."""
    correction = 1 - ops.constant(optimizer.beta_2, steps) ** steps
    rms = statistics.adam_rms(ops, gradients, seconds, correction)
    return rms if taken is None else ops.where(taken, rms, ops.constant(np.nan, rms))


class Recorder:
    """What every backend's ``StepRecorder`` sets up the same way: the optimizers, the watched
    variables, the schedules, the scalar and statistic names (of the ``stats`` asked for,
    `columns.selected_stats`), whether update norms are recorded (``records_updates``: asked for,
    and ``updates_recordable``, which a recorder sets before calling this), whether Adam's RMS is
    (``records_adam``: asked for, an Adam optimizer, and ``updates_recordable``) and the optimizer
    patches."""

    updates_recordable = True

    def __init__(self, model, watched, every_n_steps, histograms_every_n_steps, stats,
                 stats_every_n_steps=1):
        self._optimizer, self._inner, self._loss_scaled = optimizers(model)
        self.watched = list(watched)
        self._every = every_n_steps
        self._histogram_every = histograms_every_n_steps
        self._stats_every = stats_every_n_steps
        self.scalar_names = scalar_names(clips(self._inner), self._loss_scaled)
        self.stats = columns.selected_stats(stats)
        self.records_updates = self.updates_recordable and "update_l2_norm" in self.stats
        self.records_adam = (self.updates_recordable and "adam_rms" in self.stats
                             and reads_adam_moments(self._inner))
        self.gradient_stats = columns.gradient_stats(self.stats)
        self.logs_weights = "weight_l2_norm" in self.stats
        self.stat_names = columns.stats_for(self.logs_weights, self.records_updates,
                                            self.gradient_stats, self.records_adam)
        self._patches = Patches()

    def full_step(self, index):
        """Whether the logged step of 0-based optimizer step ``index`` (an int, or a traced
        integer) holds every statistic: every ``stats_every_n_steps``-th logged step, from the
        first; the others hold the norms only (format 1.6, `columns.EVERY_STEP_STATS`)."""
        return (index // self._every) % self._stats_every == 0

    def step_statistics(self, ops, entries, weights, dtype, full):
        """The stats matrix of a logged step (`statistics.statistics_matrix`'s arguments;
        ``weights`` None unless logged): every gradient stat asked for when ``full``, else the
        norms only, one pass per gradient (`statistics.norms_only_statistics`)."""
        if full:
            return statistics.statistics_matrix(ops, entries, weights, dtype, self.gradient_stats)
        return statistics.norms_only_statistics(ops, entries, weights, dtype,
                                                self.gradient_stats,
                                                columns.every_step_stats(self.stat_names))


def global_norm(ops, stats, stat_names, other_squares):
    """The L2 norm over all gradients from the watched rows' (overflow-safe) ``l2_norm`` column
    plus ``other_squares``, the sum of squares of the unwatched gradients; NaN / Inf when any
    watched entry is (their ``l2_norm`` is over the finite entries only). Missing rows add 0."""
    column = lambda name: stats[:, columns.position(stat_names, name)]  # noqa: E731
    present = ~ops.isnan(column("size"))
    zero = ops.constant(0, other_squares)

    def present_sum(values):
        return ops.sum(ops.where(present, values, zero))

    norm = ops.sqrt(other_squares + present_sum(column("l2_norm") * column("l2_norm")))
    norm = ops.where(present_sum(column("inf_count")) > 0, ops.constant(np.inf, norm), norm)
    return ops.where(present_sum(column("nan_count")) > 0, ops.constant(np.nan, norm), norm)
