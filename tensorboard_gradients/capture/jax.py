"""JAX: gradient statistics of a pytree (Flax / optax style), computed on the device.

Two ways in. `gradient_monitor` is an optax transformation: put it first in the chain and the
statistics are computed inside the jitted update, wherever the optimizer runs (Flax
``nnx.Optimizer``, a ``flax.training.train_state.TrainState``, a plain optax loop):

```python
import optax
from tensorboard_gradients.jax import gradient_monitor

tx = optax.chain(gradient_monitor("logs/run1"), optax.adam(1e-3))
optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)     # or TrainState.create(..., tx=tx)
```

`log_gradients` is a call on a gradient pytree, for loops that hold the gradients:

```python
import optax
from tensorboard_gradients import GradientWriter
from tensorboard_gradients.jax import log_gradients

writer = GradientWriter("logs/run1")
for step, batch in enumerate(batches):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    log_gradients(writer, grads, step, params=params, histograms=step % 100 == 0)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
writer.close()
```

Steps: the gradients of an update are logged at the step at which that update's training loss
is logged, so the loss and the heatmap line up. JAX has no training loop of its own that
numbers steps, so `gradient_monitor`'s step is the 0-based count of the updates before this one:
the ``step`` of ``for step in range(n)`` / ``enumerate(batches)``, and the value of Flax's
``nnx.Optimizer.step`` and ``TrainState.step`` before the update (both start at 0 and count
updates). Log the loss of the same batch at that number. Where your numbering differs (a resumed
run that restarted its optimizer state, 1-based steps), pass the step explicitly through optax's
extra arguments: ``tx.update(grads, state, params, step=step)``, ``optimizer.update(model,
grads, step=step)`` for ``nnx.Optimizer``; `optax.chain` hands extra arguments to every member
that takes them and drops them for the others. The schedule (``every_n_steps``) then follows
that step. (``TrainState.apply_gradients`` does not forward extra arguments: there the count,
which equals ``state.step``, is the step. ``optax.conditionally_transform(...,
forward_extra_args=True)`` calls its condition with a ``step`` of its own: do not pass ``step=``
through it.) `log_gradients` logs at the ``step`` you pass it.

`gradient_monitor` passes the updates through unchanged. Its state (`GradientMonitorState`)
holds the update count and the statistics matrix of the last logged step, readable inside
``jit`` (``optax.tree.get(opt_state, "stats")``, or ``state.stat("l2_norm")``); with a
``log_dir`` an ordered ``io_callback`` also hands that matrix (and the histograms when due) to
the host writer. Steps the schedule skips compute nothing: the statistics sit in a
``lax.switch`` branch that only logged steps take. Where it stands in the chain decides what it
sees: first, the gradients; after ``optax.clip_by_global_norm``, the clipped ones. Inside
``optax.MultiSteps`` (gradient accumulation) it counts and logs the accumulated updates.

To clip, `clip_by_global_norm` takes the place of ``optax.clip_by_global_norm`` and of the
monitor: it logs the gradients before clipping, clips by optax's own function (the same
numbers), and writes the global norm and the clip coefficient beside them:

```python
from tensorboard_gradients.jax import clip_by_global_norm

tx = optax.chain(clip_by_global_norm(1.0, "logs/run1"), optax.adamw(1e-3))
```

Leaves are named by their tree path joined with ``/`` (``Dense_0/kernel``; list positions are
numbers; a Flax ``nnx.Variable`` is named by its path, without the ``value`` inside it).
Rows should run from the input side to the output side (the depth rule compares layers
with the output side), but JAX rebuilds every dictionary with sorted keys, so the order the model
created its layers in is gone by the time gradients arrive; dictionary keys are therefore sorted
with numbers compared as numbers: Flax's ``Dense_2`` comes before ``Dense_10`` (plain sorting,
`jax.tree_util`'s, would put it after). Name layers so that this order is the model's.

The statistics are one jitted computation (compiled once per tree structure and shapes) with
the same formulas as every other writer (`tensorboard_gradients.format.statistics`); only the small
``[leaves, stats]`` matrix is copied to the host. TensorFlow is never imported.

Sharded gradients (a `jax.sharding.Mesh`, ``NamedSharding``) are reduced where they lie: each
device reduces its shard and XLA adds the partial results with all-reduces, histogram counts
included (a scatter-add per shard, exact integer counts); no gradient is gathered (the tests
count the all-gathers XLA compiles: 0, with and without histograms).

Inside your own ``jax.jit`` (a train step that returns no gradients), call `log_gradients`
there: the statistics join the compiled step and an ordered ``io_callback`` hands only the small
matrices to the host writer each time the step runs.

Which process writes: in a multi-process run (``jax.distributed.initialize``), call
`log_gradients` on every process with the same arguments, as for any computation over global
arrays: every process takes part in the (collective) computation and waits for it, but only
``jax.process_index() == 0`` copies the matrices to the host and writes them. The other
processes never touch their ``writer`` (it may be None there; a `GradientWriter` creates
neither file nor directory until it writes) and get None back. Gradients that are not global
arrays (each process's own numpy or local arrays) are computed by each process alone, and
process 0 logs its own. `gradient_monitor`'s callbacks, too, write on process 0 only; it is
tested on one process.
"""

import functools
import re
import sys
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback, multihost_utils

from tensorboard_gradients.format import columns, statistics
from tensorboard_gradients.format.layout import Layout

__all__ = ["JaxOps", "log_gradients", "named_leaves"]


class JaxOps(statistics.ArrayOps):
    """`statistics` adapter for `jax.numpy` (traceable: the whole matrix is one jitted
    function)."""

    @staticmethod
    def computation_dtype(dtypes):
        return jnp.float64 if any(jnp.dtype(d) == jnp.float64 for d in dtypes) else jnp.float32

    to_float = staticmethod(lambda x, dtype: jnp.asarray(x, dtype))
    constant = staticmethod(lambda value, like: jnp.asarray(value, like.dtype))
    groups_arrays = False  # XLA fuses each array's reductions: a stack would only copy
    # A leading axis, not a flattening reshape: reshaping a sharded array makes XLA gather it.
    rows_matrix = staticmethod(lambda arrays: jnp.stack(arrays))
    numel = staticmethod(lambda x: jnp.asarray(x.size, x.dtype))
    static_size = staticmethod(lambda x: x.size)
    reshape = staticmethod(jnp.reshape)
    concat = staticmethod(jnp.concatenate)
    take_rows = staticmethod(lambda matrix, indices: matrix[jnp.asarray(indices)])
    sum = staticmethod(lambda x, axis=None: jnp.sum(x, axis=axis))
    count = staticmethod(lambda mask, like, axis=None: jnp.sum(mask, axis=axis, dtype=like.dtype))
    max = staticmethod(lambda x, initial, axis=None: jnp.max(x, axis=axis, initial=initial))
    min = staticmethod(lambda x, initial, axis=None: jnp.min(x, axis=axis, initial=initial))
    abs = staticmethod(jnp.abs)
    sqrt = staticmethod(jnp.sqrt)
    isnan = staticmethod(jnp.isnan)
    isfinite = staticmethod(jnp.isfinite)
    where = staticmethod(jnp.where)
    maximum = staticmethod(jnp.maximum)
    minimum = staticmethod(jnp.minimum)
    all = staticmethod(jnp.all)
    shift_right = staticmethod(jnp.right_shift)
    # int32 indices (the tables hold 2^12 or 2^15 rows, the matrices a few columns): with
    # int64 ones, under `jax.enable_x64` after jnp indexing ran without it (JAX 0.10), the
    # normalization of negative indices met an int32 size kept from before, and failed ("lax.add
    # requires arguments to have the same dtypes").
    gather = staticmethod(lambda table, indices: table[jnp.asarray(indices, jnp.int32)])
    take_columns = staticmethod(
        lambda matrix, indices: matrix[:, jnp.asarray(indices, jnp.int32)])

    @staticmethod
    def magnitude_bits(x):
        integer = jnp.int64 if x.dtype == jnp.float64 else jnp.int32
        return jax.lax.bitcast_convert_type(x, integer) & jnp.iinfo(integer).max

    cond = staticmethod(
        lambda predicate, true_fn, false_fn: jax.lax.cond(predicate, true_fn, false_fn))

    @staticmethod
    def bincount(indices, length, like):
        # A scatter-add of ones indexed by the bin array itself, in its own shape: no reshape to
        # 1-D (jnp.bincount's), which makes XLA all-gather a sharded leaf to flatten it. The SPMD
        # partitioner keeps the scatter sharded: each device counts its shard into a [length]
        # int32 vector and one all-reduce adds them (exact integers), memory O(length) per
        # device; about jnp.bincount's cost on one device. A one-hot comparison summed over the
        # entries is as gather-free but ~40x slower on CPU. `statistics.histogram_rows`
        # already keeps bins in [0, length); the clip (jnp.bincount's rule) makes the in-bounds
        # promise hold whatever the caller passes.
        bins = jnp.clip(indices.astype(jnp.int32), 0, length - 1)
        counts = jnp.zeros(length, jnp.int32).at[bins].add(1, mode="promise_in_bounds")
        return counts.astype(like.dtype)

    @staticmethod
    def stack(values, axis=0):
        return jnp.stack(list(values), axis=axis)


def _key_name(key):
    for attribute in ("key", "name", "idx"):  # DictKey, GetAttrKey, SequenceKey
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def _natural_key(key):
    """``"Dense_10"`` -> ``["Dense_", 10, ""]``: numbers sort as numbers (strings and ints
    alternate from a string, so two keys always compare like with like)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(key))]


def _is_nnx_variable(tree):
    """Whether ``tree`` is a Flax ``nnx.Variable`` (a box around one array, e.g. the leaves of
    ``nnx.state(model)`` and of ``nnx.grad``'s result). Flax is never imported for this: a
    Variable exists only once the program has imported it."""
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(tree, nnx.Variable)


def named_leaves(tree, prefix=()):
    """``[(path name, leaf)]``, dictionary keys in natural order, sequences in their order."""
    if isinstance(tree, Mapping):
        children = sorted(tree.items(), key=lambda item: _natural_key(item[0]))
    elif isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        children = enumerate(tree)
    elif _is_nnx_variable(tree):
        return named_leaves(tree.get_value(), prefix)
    else:
        # Any other pytree node (a NamedTuple, a flax.struct, optax state): JAX's own order.
        flat, _ = jax.tree_util.tree_flatten_with_path(tree)
        if len(flat) == 1 and flat[0][0] == ():
            return [("/".join(prefix), tree)]
        return [("/".join(prefix + tuple(_key_name(k) for k in path)), leaf)
                for path, leaf in flat]
    named = []
    for key, child in children:
        named += named_leaves(child, prefix + (str(key),))
    return named


def _rows(tree):
    """`named_leaves` as arrays, a bare leaf named ``gradient``."""
    return [(name or "gradient", jnp.asarray(leaf)) for name, leaf in named_leaves(tree)]


def _weights_for(names, params):
    """The leaves of ``params`` named ``names`` (the gradients' rows), in that order."""
    weight_leaves = dict(_rows(params))
    absent = [n for n in names if n not in weight_leaves]
    if absent:
        raise ValueError(f"params has no leaves {absent[:5]} that grads has; pass the tree "
                         "the gradients were taken of")
    return [weight_leaves[n] for n in names]


@functools.partial(jax.jit,
                   static_argnames=("histograms", "stats", "gradient_stats", "every_step"))
def _matrices(gradients, weights, histograms, stats=True, gradient_stats=columns.GRADIENT_STATS,
              full=True, every_step=columns.EVERY_STEP_STATS):
    """(the statistics matrix of ``gradient_stats`` if ``stats``, the histogram counts if
    ``histograms``; else None). ``full``: every statistic (True), the norms only (False,
    `statistics.norms_only_statistics`: the ``every_step`` stats of the tag's layout), or a
    traced boolean choosing between the two."""
    dtype = JaxOps.computation_dtype([g.dtype for g in gradients])
    # No reshape: a flattened sharded array would be gathered along its mesh axes first.
    entries = [(g.astype(dtype), g.size) for g in gradients]
    cast_weights = None if weights is None else [w.astype(dtype) for w in weights]
    arguments = (JaxOps, entries, cast_weights, dtype, gradient_stats)
    matrix = None
    if stats and isinstance(full, bool):
        matrix = (statistics.statistics_matrix(*arguments) if full
                  else statistics.norms_only_statistics(*arguments, every_step))
    elif stats:
        matrix = JaxOps.cond(full, lambda: statistics.statistics_matrix(*arguments),
                             lambda: statistics.norms_only_statistics(*arguments, every_step))
    counts = statistics.histogram_matrix(JaxOps, entries, dtype) if histograms else None
    return matrix, counts


def _host_matrix(matrix, writes):
    """The numpy value of a result of `_matrices` on the writing process; None elsewhere.

    A result that every process holds whole (fully replicated, which XLA makes of these small
    reductions, or one process's own array) is read locally, and only by the writing process
    (the others just wait for it). A result split across processes is gathered with a
    collective that every process joins: the sharding is the same on each, so they all choose
    the same branch and none waits for a collective the others skip.
    """
    if matrix is None:
        return None
    if not (matrix.is_fully_replicated or matrix.is_fully_addressable):
        gathered = multihost_utils.process_allgather(matrix, tiled=True)
        return gathered if writes else None
    if writes:
        return np.asarray(matrix)
    jax.block_until_ready(matrix)
    return None


def _traced(*values):
    return any(isinstance(value, jax.core.Tracer) for value in values)


def _write_from_callback(writer, layout, step, stats, counts, loss, with_histograms=True):
    """The host side of a step logged inside ``jit``: receives the small matrices (``stats``
    None: the histograms alone) and the loss (None: none)."""
    if jax.process_index() != 0:
        return
    counts = np.asarray(counts) if counts is not None and bool(with_histograms) else None
    if stats is None:
        writer.write_histograms(int(step), layout, counts)
    else:
        writer.write_statistics(int(step), layout, np.asarray(stats), counts,
                                loss=None if loss is None else np.asarray(loss))
    # This runs on JAX's callback thread, not the training loop's: waiting here for the writer's
    # thread keeps "after jax.effects_barrier() the step is on disk" true (for a bucket: in the
    # segment being filled, uploaded when due rather than an object per step).
    writer.flush(upload=False)


def log_gradients(writer, grads, step, params=None, histograms=False, stats=None, loss=None):
    """Writes the statistics of a gradient pytree at ``step`` with a `GradientWriter`.

    In a multi-process run, call it on every process with the same arguments: all of them
    compute, only process 0 writes (see the module, "which process writes").

    Inside a jitted function (``grads`` or ``step`` traced), the statistics become part of that
    computation and the small matrices go to the host through an ordered
    `jax.experimental.io_callback`, which writes them each time the compiled function runs
    (``step`` and ``histograms`` may be traced values; a traced ``histograms`` makes every run
    compute the counts). The writer is the one given when the function was traced. Tested on one
    process; in multi-process runs call it outside ``jit``.

    Args:
      writer: a `tensorboard_gradients.GradientWriter` (one per run). Used only on the writing
        process (``jax.process_index() == 0``); other processes never touch it (None is fine
        there), so theirs creates no event file and no directory.
      grads: the gradient pytree, e.g. from ``jax.grad(loss_fn)(params, ...)``: arrays on one
        device, sharded over a mesh, or global arrays spanning several processes.
      step: the step (an int).
      params: the parameter pytree of the same structure, for the ``weight_l2_norm`` column
        (and the gradient/weight ratio); optional.
      histograms: also write the log10|g| histograms at this step.
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm only when named.
      loss: this step's training loss (a number or a scalar array, traced inside ``jit``; NaN
        and Inf are kept), written beside the statistics: the rules judge the gradients
        against it (see `GradientWriter.write`). None: not logged.

    Returns:
      The tag written to, on the writing process (process 0; the only one in a single-process
      run). None on every other process: it took part in the computation and wrote nothing.
      None inside ``jit`` (the write happens when the compiled function runs).

    Raises:
      ValueError: an empty tree, or ``params`` whose leaves do not match ``grads`` (on every
        process alike, before any computation starts).
    """
    rows = _rows(grads)
    if not rows:
        raise ValueError("log_gradients needs a pytree with at least one gradient leaf")
    names = [name for name, _ in rows]
    gradients = [leaf for _, leaf in rows]
    selected = columns.selected_stats(stats)
    gradient_stats = columns.gradient_stats(selected)
    weights = (None if params is None or "weight_l2_norm" not in selected
               else _weights_for(names, params))
    # Before the computation: a layout error is raised by every process, none left waiting in
    # a collective.
    layout = Layout.create(names, [g.shape for g in gradients], with_weights=weights is not None,
                           gradient_stats=gradient_stats)
    if _traced(*gradients, step):
        histograms_known = not _traced(histograms)
        stats, counts = _matrices(gradients, weights,
                                  bool(histograms) if histograms_known else True,
                                  gradient_stats=gradient_stats)
        write = functools.partial(_write_from_callback, writer, layout)
        operands = ((step, stats, counts, loss) if counts is None
                    else (step, stats, counts, loss, histograms))
        io_callback(write, None, *operands, ordered=True)
        return None
    writes = jax.process_index() == 0
    stats, counts = _matrices(gradients, weights, bool(histograms), gradient_stats=gradient_stats)
    stats, counts = _host_matrix(stats, writes), _host_matrix(counts, writes)
    if isinstance(loss, jax.Array):
        loss = _host_matrix(loss, writes)
    if not writes:
        return None
    return writer.write_statistics(int(step), layout, stats, counts, loss=loss)
