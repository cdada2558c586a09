"""The optax transformations of `tensorboard_gradients.jax` (documented there, in
`tensorboard_gradients.capture.jax`): `gradient_monitor`, which logs the updates it sees and
passes them on (or runs the optimizer it wraps), and `clip_by_global_norm`, which logs the
gradients and clips them by optax's own ``clip_by_global_norm``. Both keep the last logged
statistics in their state (`GradientMonitorState`) and hand them to the host writer through an
ordered ``io_callback``."""

import atexit
import dataclasses
import functools
from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp
from jax.experimental import io_callback

from tensorboard_gradients.capture import optax_adam, options
from tensorboard_gradients.capture.jax import (
    JaxOps, _matrices, _rows, _weights_for, _write_from_callback)
from tensorboard_gradients.format import columns, metadata
from tensorboard_gradients.format.layout import Layout
from tensorboard_gradients.format.writer import GradientWriter

__all__ = ["GradientMonitorState", "StatsNames", "clip_by_global_norm", "gradient_monitor"]


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class StatsNames:
    """What the rows and columns of `GradientMonitorState.stats` are: a pytree without leaves
    (static under ``jit``, carried through every tree map over the optimizer state)."""

    variables: Tuple[str, ...]
    columns: Tuple[str, ...]


class GradientMonitorState(NamedTuple):
    """The state of `gradient_monitor`; its leaves are ``count``, ``step``, ``stats`` and the
    wrapped ``optimizer``'s state.

    Inside or outside ``jit``: ``opt_state[0].stats`` when the monitor is the chain's first
    member, or ``optax.tree.get(opt_state, "stats")`` wherever it is.

    Attributes:
      count: int32 scalar, the updates seen so far (the default step of the next one).
      step: int32 scalar, the step whose statistics ``stats`` holds (-1: none logged yet).
      stats: ``[len(variables), len(columns)]``, the statistics of the last logged step (NaN
        before the first; the weight columns are NaN when ``update`` was given no ``params``).
      names: the row and column names (`StatsNames`; also `variables` and `columns`).
      inner: the state of the ``optimizer`` it wraps (None: it wraps none).
      adam_beta2: the ``beta2`` of the wrapped optimizer's Adam, read when the state was made
        (`optax_adam.second_moment_decay`); None where ``adam_rms`` is not logged.
    """

    count: jax.Array
    step: jax.Array
    stats: jax.Array
    names: StatsNames
    inner: object = None
    adam_beta2: object = None

    @property
    def variables(self):
        """The row names: the leaves' paths, e.g. ``linear1/kernel``."""
        return self.names.variables

    @property
    def columns(self):
        """The column names (`tensorboard_gradients.format.columns`), e.g. ``l2_norm``."""
        return self.names.columns

    def stat(self, name):
        """The ``[len(variables)]`` column of statistic ``name`` (e.g. ``"l2_norm"``)."""
        return self.stats[:, columns.position(self.columns, name)]


def gradient_monitor(log_dir, every_n_steps=1, histograms_every_n_steps=None,
                     name=metadata.DEFAULT_NAME, include=None, exclude=None, strict=False,
                     stats=None, optimizer=None, stats_every_n_steps=10):
    """An optax transformation that logs the statistics of the updates it sees, from inside
    ``jit``, and passes them through unchanged.

    Put it first in the chain to log the gradients:

    ```python
    tx = optax.chain(gradient_monitor("logs/run1"), optax.adam(1e-3))
    ```

    Steps are the 0-based count of earlier updates, or ``step=`` passed to ``update`` (see the
    module, "Steps"). A step is logged when it is a multiple of ``every_n_steps`` (``step %
    every_n_steps == 0``: 0, N, 2N, ... by default). ``update``'s ``params`` give the weight
    norms (the ``weight_l2_norm`` column and the gradient/weight ratio); without them those
    columns are left out of the logs. ``update``'s ``value=`` (optax's name for the loss, as
    ``optax.contrib.reduce_on_plateau`` takes it) is logged beside the statistics, for the
    loss-spike rule: ``optimizer.update(grads, state, params, value=loss)``.

    Given the ``optimizer`` it wraps, it is the whole optimizer: it logs the gradients, runs the
    optimizer (extra arguments, ``value`` included, reach it) and logs the updates it returns,
    which ``optax.apply_updates`` adds to the parameters: each step's real update
    (``update_l2_norm``; the tab shows update/weight), without a copy of anything, which tells a
    raised learning rate before the loss feels it. For an optimizer with one ``scale_by_adam``
    (``adam``, ``adamw``, in a chain or ``inject_hyperparams`` too) it also logs Adam's RMS of
    g / sqrt(v_hat) (``adam_rms``), read from that state (`optax_adam`):

    ```python
    tx = gradient_monitor("logs/run1", optimizer=optax.adamw(1e-3))
    ```

    Args:
      log_dir: where to write: a run directory, or anything else `GradientWriter` takes (a
        tensorboardX ``SummaryWriter`` whose run to join), for which a `GradientWriter` is made
        (it touches no disk before the first logged step and is closed when Python exits); a
        `GradientWriter` (yours to close, after ``jax.effects_barrier()``: the writes happen in
        callbacks); or None to keep the statistics in the state only.
      every_n_steps: log the steps that are multiples of it.
      histograms_every_n_steps: also log the log10|g| histograms on their own schedule (None:
        never). Needs a ``log_dir``: the state keeps only the statistics.
      name: the summary name = the tag in the Gradients tab (a `GradientWriter` has its own).
      include / exclude: regular expressions (or lists of them) searched in the leaves' paths
        (``linear1/kernel``), to watch part of a model (``exclude=r"/bias$"``).
      strict: raise when the event files cannot be written (a full disk, no permission); by
        default the step is dropped and counted, and training goes on (see
        `tensorboard_gradients.format.writer`). Only for a ``log_dir`` path.
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the parameters). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm, update_l2_norm and adam_rms only when named.
      optimizer: the optax optimizer (a `GradientTransformation`) to wrap, whose updates (and
        Adam's RMS) are logged too (see above); None: the updates pass through unchanged.
      stats_every_n_steps: every statistic at the logged steps s with ``(s // every_n_steps)
        % stats_every_n_steps == 0`` (the first, then every N-th logged step), the norms and
        NaN/Inf counts only between (`columns.every_step_stats`: one pass over each gradient,
        the weights' too with the update; the other columns NaN, in the state too); 1: every
        statistic at every logged step.

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a `GradientMonitorState`.

    Raises:
      ValueError: a bad argument (here); from ``init``, no leaf left to watch; from ``update``,
        updates that do not have the leaves ``init`` saw, ``params`` without them, or a
        ``step`` that is not an integer.
    """
    return _transformation(log_dir, every_n_steps, histograms_every_n_steps, name, include,
                           exclude, strict, stats, optimizer, stats_every_n_steps)


def clip_by_global_norm(max_norm, log_dir=None, every_n_steps=1, histograms_every_n_steps=None,
                        name=metadata.DEFAULT_NAME, include=None, exclude=None, strict=False,
                        stats=None, optimizer=None, stats_every_n_steps=10):
    """``optax.clip_by_global_norm(max_norm)`` that logs: an optax transformation that logs the
    gradients it is given as `gradient_monitor` does (before clipping), then clips the whole
    tree by optax's own ``clip_by_global_norm`` (the same numbers), and, at the logged steps,
    writes ``<name>/global_norm_before_clipping`` (optax's global norm of the tree) and
    ``<name>/clip_coefficient`` (what every update was multiplied by: ``max_norm / norm``, 1
    when the norm is below ``max_norm``). Use it in place of both:

    ```python
    tx = optax.chain(clip_by_global_norm(1.0, "logs/run1"), optax.adamw(1e-3))
    ```

    Given the ``optimizer``, it is the whole optimizer: the clipped gradients go on to it, and
    its updates (and Adam's RMS) are logged too, as `gradient_monitor`'s ``optimizer`` are:
    ``clip_by_global_norm(1.0, "logs/run1", optimizer=optax.adamw(1e-3))``.

    Args:
      max_norm: as ``optax.clip_by_global_norm``'s.
      log_dir, every_n_steps, histograms_every_n_steps, name, include, exclude, strict, stats,
        optimizer, stats_every_n_steps: as `gradient_monitor`'s (``include`` and ``exclude`` choose what is logged;
        the whole tree is clipped).

    Returns:
      An `optax.GradientTransformationExtraArgs` whose state is a `GradientMonitorState`.

    Raises:
      ValueError: as `gradient_monitor`, and a ``max_norm`` that is not a positive number.
    """
    return _transformation(log_dir, every_n_steps, histograms_every_n_steps, name, include,
                           exclude, strict, stats, optimizer, stats_every_n_steps,
                           max_norm=options.positive_number("max_norm", max_norm))


def _transformation(log_dir, every_n_steps, histograms_every_n_steps, name, include, exclude,
                    strict, stats, optimizer, stats_every_n_steps, max_norm=None):
    """`gradient_monitor`, and with ``max_norm`` `clip_by_global_norm`."""
    import optax  # here, not at the top: `log_gradients` works without optax

    every_n_steps = options.positive_int("every_n_steps", every_n_steps)
    stats_every = options.stats_every(stats_every_n_steps)
    histograms_every_n_steps = options.optional_positive_int(
        "histograms_every_n_steps", histograms_every_n_steps)
    name = options.non_empty_name(name)
    include, exclude = options.patterns("include", include), options.patterns("exclude", exclude)
    selected = columns.selected_stats(stats)
    gradient_stats = columns.gradient_stats(selected)
    logs_weights = "weight_l2_norm" in selected
    inner = None if optimizer is None else optax.with_extra_args_support(optimizer)
    logs_updates = inner is not None and "update_l2_norm" in selected
    reads_adam = inner is not None and "adam_rms" in selected
    writer = _writer(log_dir, name, strict)
    if writer is None and histograms_every_n_steps is not None:
        raise ValueError("histograms_every_n_steps needs a log_dir: the state keeps only the "
                         "statistics, the histograms are written")

    def watched(tree):
        return [(n, leaf) for n, leaf in _rows(tree) if options.selected((n,), include, exclude)]

    def init(params):
        rows = watched(params)
        if not rows:
            raise ValueError("gradient_monitor has no leaf to watch: the parameters are empty "
                             "or include/exclude leave none")
        inner_state = None if inner is None else inner.init(params)
        beta2 = (optax_adam.second_moment_decay(inner, inner_state, params) if reads_adam
                 else None)
        layout = Layout.create([n for n, _ in rows], [leaf.shape for _, leaf in rows],
                               with_weights=logs_weights, with_updates=logs_updates,
                               gradient_stats=gradient_stats, with_optimizer=beta2 is not None)
        dtype = JaxOps.computation_dtype([leaf.dtype for _, leaf in rows])
        return GradientMonitorState(
            count=jnp.zeros([], jnp.int32), step=jnp.full([], -1, jnp.int32),
            stats=jnp.full((len(rows), len(layout.stats)), jnp.nan, dtype),
            names=StatsNames(layout.variables, layout.stats), inner=inner_state,
            adam_beta2=beta2)

    def update(updates, state, params=None, *, step=None, value=None, **extra_args):
        rows = watched(updates)
        names, gradients = [n for n, _ in rows], [leaf for _, leaf in rows]
        weights = None if params is None or not logs_weights else _weights_for(names, params)
        inner_state, applied, adam, clipped = state.inner, None, None, None
        if max_norm is not None:  # optax's own clip of the whole tree: the same numbers
            total = optax.tree.norm(updates)
            updates, _ = optax.clip_by_global_norm(max_norm).update(updates, optax.EmptyState())
            clipped = (total, jnp.where(total < max_norm, 1.0, max_norm / total))
        if inner is not None:  # the optimizer's own extra arguments reach it
            updates, inner_state = inner.update(updates, state.inner, params, value=value,
                                                **extra_args)
            applied = [leaf for _, leaf in watched(updates)] if logs_updates else None
        if state.adam_beta2 is not None:
            before, after = (optax_adam.adam_state(s) for s in (state.inner, inner_state))
            seconds = [dict(_rows(s.nu)) for s in (before, after)]
            adam = ([seconds[0].get(n) for n in names], [seconds[1].get(n) for n in names],
                    after.count, state.adam_beta2)
        layout = Layout.create(names, [g.shape for g in gradients],
                               with_weights=weights is not None, with_updates=logs_updates,
                               gradient_stats=gradient_stats,
                               with_optimizer=adam is not None, stats_every=stats_every)
        if layout.variables != state.variables:
            raise ValueError(
                f"gradient_monitor was initialised with leaves {list(state.variables)[:5]}, the "
                f"updates have {list(layout.variables)[:5]}: pass updates shaped like the params")
        step = state.count if step is None else _integer_step(step)
        due = (step % every_n_steps == 0).astype(jnp.int32)
        if histograms_every_n_steps is not None:
            due += 2 * (step % histograms_every_n_steps == 0).astype(jnp.int32)

        def branch(stats_due, histograms_due):
            def run(gradients, weights, applied, adam, step, loss, clipped, last):
                if not (stats_due or histograms_due):
                    return last
                # Every statistic at every stats_every-th logged step, the norms between.
                full = (step // every_n_steps) % stats_every == 0
                stats, counts = _matrices(gradients, weights, histograms_due, stats_due,
                                          gradient_stats, full if stats_every > 1 else True,
                                          layout.every_step)
                if stats is not None and applied is not None:
                    norms = JaxOps.sqrt(JaxOps.square_sums([u.astype(stats.dtype)
                                                            for u in applied]))
                    stats = jnp.concatenate([stats, norms[:, None]], 1)
                if stats is not None and adam is not None:  # not a norm: NaN when norms only
                    rms = JaxOps.cond(
                        full, lambda: optax_adam.adam_rms(JaxOps, *adam, stats.dtype),
                        lambda: jnp.full(stats.shape[:1], jnp.nan, stats.dtype))
                    stats = jnp.concatenate([stats, rms[:, None]], 1)
                if writer is not None:
                    write = functools.partial(_write_step, writer, layout)
                    io_callback(write, None, step, stats, counts,
                                loss if stats_due else None, clipped if stats_due else None,
                                ordered=True)
                if stats is None:
                    return last
                return _in_columns(stats, layout.stats, state.columns).astype(last.dtype)
            return run

        branches = [branch(bool(k & 1), bool(k & 2))
                    for k in range(2 if histograms_every_n_steps is None else 4)]
        stats = jax.lax.switch(due, branches, gradients, weights, applied, adam, step, value,
                               clipped, state.stats)
        logged = due % 2 == 1
        return updates, state._replace(
            count=state.count + 1, step=jnp.where(logged, step, state.step), stats=stats,
            inner=inner_state)

    return optax.GradientTransformationExtraArgs(init, update)


def _write_step(writer, layout, step, stats, counts, loss, clipped):
    """The host side of a logged step (`_write_from_callback`), with the clip's global norm and
    coefficient (``clipped``; None: no clip) beside the statistics."""
    if clipped is not None and jax.process_index() == 0:
        total, coefficient = clipped
        writer.write_scalars(int(step), {"global_norm_before_clipping": float(total),
                                         "clip_coefficient": float(coefficient)})
    _write_from_callback(writer, layout, step, stats, counts, loss)


def _writer(log_dir, name, strict):
    """The `GradientWriter` for ``log_dir`` (see `gradient_monitor`), or None."""
    if log_dir is None:
        return None
    if isinstance(log_dir, GradientWriter):
        if name != metadata.DEFAULT_NAME or strict:
            raise ValueError("name and strict are the GradientWriter's own: pass them to "
                             "GradientWriter, not to gradient_monitor")
        return log_dir
    writer = GradientWriter(log_dir, name, strict=strict)  # it checks the path
    atexit.register(_close_at_exit, writer)
    return writer


def _close_at_exit(writer):
    jax.effects_barrier()  # the callbacks of steps still running write first
    writer.close()


def _integer_step(step):
    step = jnp.asarray(step)
    if step.shape != () or not jnp.issubdtype(step.dtype, jnp.integer):
        raise ValueError(f"step must be an integer scalar, got {step.dtype}{list(step.shape)}")
    return step.astype(jnp.int32)


def _in_columns(stats, given, wanted):
    """``stats`` (columns ``given``) with the columns ``wanted``, NaN for those it lacks."""
    if given == wanted:
        return stats
    nan = jnp.full(stats.shape[:1], jnp.nan, stats.dtype)
    return jnp.stack([stats[:, given.index(c)] if c in given else nan for c in wanted], axis=1)
