"""JAX: gradient statistics of a pytree (Flax / optax style), computed on the device.

::

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

Leaves are named by their tree path joined with ``/`` (``Dense_0/kernel``; list positions are
numbers). Rows should run from the input side to the output side (the depth rule compares layers
with the output side), but JAX rebuilds every dictionary with sorted keys, so the order the model
created its layers in is gone by the time gradients arrive; dictionary keys are therefore sorted
with numbers compared as numbers: Flax's ``Dense_2`` comes before ``Dense_10`` (plain sorting,
`jax.tree_util`'s, would put it after). Name layers so that this order is the model's.

The statistics are one jitted computation (compiled once per tree structure and shapes) with
the same formulas as every other writer (`tensorboard_gradients.format.statistics`); only the small
``[leaves, stats]`` matrix is copied to the host. TensorFlow is never imported.
"""

import functools
import re
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from tensorboard_gradients.format import statistics
from tensorboard_gradients.format.layout import Layout

__all__ = ["log_gradients", "named_leaves"]


class JaxOps(statistics.ArrayOps):
    """`statistics` adapter for `jax.numpy` (traceable: the whole matrix is one jitted function)."""

    @staticmethod
    def computation_dtype(dtypes):
        return jnp.float64 if any(jnp.dtype(d) == jnp.float64 for d in dtypes) else jnp.float32

    to_float = staticmethod(lambda x, dtype: jnp.asarray(x, dtype))
    constant = staticmethod(lambda value, like: jnp.asarray(value, like.dtype))
    numel = staticmethod(lambda x: jnp.asarray(x.size, x.dtype))
    sum = staticmethod(jnp.sum)
    count = staticmethod(lambda mask, like: jnp.sum(mask, dtype=like.dtype))
    max = staticmethod(lambda x, initial: jnp.max(x, initial=initial))
    min = staticmethod(lambda x, initial: jnp.min(x, initial=initial))
    abs = staticmethod(jnp.abs)
    sqrt = staticmethod(jnp.sqrt)
    floor = staticmethod(jnp.floor)
    log10 = staticmethod(jnp.log10)
    isnan = staticmethod(jnp.isnan)
    isinf = staticmethod(jnp.isinf)
    isfinite = staticmethod(jnp.isfinite)
    where = staticmethod(jnp.where)
    maximum = staticmethod(jnp.maximum)
    minimum = staticmethod(jnp.minimum)
    clip = staticmethod(jnp.clip)
    all = staticmethod(jnp.all)
    cond = staticmethod(lambda predicate, true_fn, false_fn: jax.lax.cond(predicate, true_fn, false_fn))

    @staticmethod
    def bincount(indices, length, like):
        return jnp.bincount(indices.reshape(-1).astype(jnp.int32), length=length).astype(like.dtype)

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


def named_leaves(tree, prefix=()):
    """``[(path name, leaf)]``, dictionary keys in natural order, sequences in their order."""
    if isinstance(tree, Mapping):
        children = sorted(tree.items(), key=lambda item: _natural_key(item[0]))
    elif isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        children = enumerate(tree)
    else:
        # Any other pytree node (a NamedTuple, a flax.struct, optax state): JAX's own order.
        flat, _ = jax.tree_util.tree_flatten_with_path(tree)
        if len(flat) == 1 and flat[0][0] == ():
            return [("/".join(prefix), tree)]
        return [("/".join(prefix + tuple(_key_name(k) for k in path)), leaf) for path, leaf in flat]
    named = []
    for key, child in children:
        named += named_leaves(child, prefix + (str(key),))
    return named


@functools.partial(jax.jit, static_argnames=("histograms",))
def _matrices(gradients, weights, histograms):
    dtype = JaxOps.computation_dtype([g.dtype for g in gradients])
    # No reshape: a flattened sharded array would be gathered along its mesh axes first.
    entries = [(g.astype(dtype), g.size) for g in gradients]
    cast_weights = None if weights is None else [w.astype(dtype) for w in weights]
    stats = statistics.statistics_matrix(JaxOps, entries, cast_weights, dtype)
    counts = statistics.histogram_matrix(JaxOps, entries, dtype) if histograms else None
    return stats, counts


def log_gradients(writer, grads, step, params=None, histograms=False):
    """Writes the statistics of a gradient pytree at ``step`` with a `GradientWriter`.

    Args:
      writer: a `tensorboard_gradients.GradientWriter` (one per run).
      grads: the gradient pytree, e.g. from ``jax.grad(loss_fn)(params, ...)``.
      step: the step (an int).
      params: the parameter pytree of the same structure, for the ``weight_l2_norm`` column
        (and the gradient/weight ratio); optional.
      histograms: also write the log10|g| histograms at this step.

    Returns:
      The tag written to.

    Raises:
      ValueError: an empty tree, or ``params`` whose leaves do not match ``grads``.
    """
    named = named_leaves(grads)
    if not named:
        raise ValueError("log_gradients needs a pytree with at least one gradient leaf")
    names = [name or "gradient" for name, _ in named]
    gradients = [jnp.asarray(leaf) for _, leaf in named]
    weights = None
    if params is not None:
        weight_leaves = dict(named_leaves(params))
        absent = [n for n, _ in named if n not in weight_leaves]
        if absent:
            raise ValueError(f"params has no leaves {absent[:5]} that grads has; pass the tree "
                             "the gradients were taken of")
        weights = [jnp.asarray(weight_leaves[n]) for n, _ in named]
    stats, counts = _matrices(gradients, weights, bool(histograms))
    layout = Layout.create(names, [g.shape for g in gradients],
                                    with_weights=weights is not None)
    return writer.write_statistics(int(step), layout, np.asarray(stats),
                                   None if counts is None else np.asarray(counts))
