"""TensorFlow summary op for gradient statistics (imports TensorFlow; import it only from TF code).

Use like `tf.summary.scalar`, under a default writer, eagerly or inside `tf.function`::

    writer = tf.summary.create_file_writer("logs/run1")

    @tf.function
    def train_step(x, y, step):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        with writer.as_default(step=step):
            tensorboard_gradients.summary.gradients(grads, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

All statistics of all variables are computed on the gradients' device and written as ONE summary
(a ``[variables, stats]`` matrix, see `tensorboard_gradients.format.metadata`).

XLA: summary ops cannot run inside a ``jit_compile=True`` function. There, compute the matrix
inside the compiled function with `gradient_statistics` (XLA-compatible for dense gradients),
return it, and write it outside with `write_statistics`.

A full log disk: by default `gradients` writes through TensorFlow's own summary writer, like
``tf.summary.scalar``, and TensorFlow raises that writer's write errors from its flush (when
``as_default()`` ends or its queue fills), inside the graph, where no code can catch them: the
training step fails. Pass ``writer=GradientWriter(log_dir)`` instead (to `gradients`, inside a
``tf.function`` too, or to `write_statistics`): the matrix then goes to the host through a
``tf.py_function`` and that writer drops and counts what cannot be written, so the op never
raises for a full disk (`tensorboard_gradients.format.writer`).
"""

import contextlib
import logging
import weakref

import tensorflow as tf

from tensorboard_gradients.format import columns, metadata, statistics
from tensorboard_gradients.format.layout import Layout, LayoutTags, MissingGradientWarnings

logger = logging.getLogger(__name__)

__all__ = ["gradients", "gradient_statistics", "write_statistics"]


class TensorFlowOps(statistics.ArrayOps):
    """`statistics` adapter for TensorFlow (runs on the tensors' device, traceable)."""

    @staticmethod
    def computation_dtype(dtypes):
        return tf.float64 if any(tf.as_dtype(d) == tf.float64 for d in dtypes) else tf.float32

    to_float = staticmethod(lambda x, dtype: tf.cast(x, dtype))
    constant = staticmethod(lambda value, like: tf.cast(value, like.dtype))
    numel = staticmethod(lambda x: tf.cast(tf.size(x), x.dtype))
    sum = staticmethod(tf.reduce_sum)
    count = staticmethod(lambda mask, like: tf.reduce_sum(tf.cast(mask, like.dtype)))
    max = staticmethod(lambda x, initial: tf.maximum(tf.reduce_max(x), initial))
    min = staticmethod(lambda x, initial: tf.minimum(tf.reduce_min(x), initial))
    abs = staticmethod(tf.abs)
    sqrt = staticmethod(tf.sqrt)
    floor = staticmethod(tf.floor)
    log10 = staticmethod(lambda x: tf.math.log(x) / tf.math.log(tf.constant(10, x.dtype)))
    isnan = staticmethod(tf.math.is_nan)
    isinf = staticmethod(tf.math.is_inf)
    isfinite = staticmethod(tf.math.is_finite)
    where = staticmethod(tf.where)
    maximum = staticmethod(tf.maximum)
    minimum = staticmethod(tf.minimum)

    @staticmethod
    def clip(x, low, high):
        return tf.clip_by_value(x, tf.cast(low, x.dtype), tf.cast(high, x.dtype))

    @staticmethod
    def bincount(indices, length, like):
        # A segment sum, not tf.math.bincount: DenseBincount has no XLA kernel.
        indices = tf.cast(tf.reshape(indices, [-1]), tf.int32)
        return tf.math.unsorted_segment_sum(tf.ones_like(indices, like.dtype), indices, length)

    stack = staticmethod(tf.stack)
    all = staticmethod(tf.reduce_all)
    cond = staticmethod(tf.cond)


def _variable_name(variable):
    if isinstance(variable, str):
        return variable
    # Keras 3 `.name` is just "kernel" (not unique); `.path` is "dense_3/kernel".
    return getattr(variable, "path", None) or variable.name


def _has_value(variable):
    return not isinstance(variable, str)


def _variable_shape(variable, gradient):
    if _has_value(variable):
        return tuple(variable.shape)
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tuple(tf.get_static_value(gradient.dense_shape))
    return tuple(gradient.shape)


def _layout(gradients, variables):
    if len(gradients) != len(variables):
        raise ValueError(
            f"got {len(gradients)} gradients for {len(variables)} variables; pass them in the "
            "same order, as from tape.gradient(loss, variables)"
        )
    if not variables:
        raise ValueError("no variables to log gradients for")
    return Layout.create(
        [_variable_name(v) for v in variables],
        [_variable_shape(v, g) for v, g in zip(variables, gradients)],
        with_weights=all(_has_value(v) for v in variables),
    )


def _summed_rows(gradient, dtype, table_rows):
    """An IndexedSlices gradient's rows with repeated indices summed, without densifying.

    Sort-based rather than `tf.unique` so that it compiles under XLA: XLA needs a static segment
    count, so the summed matrix may carry trailing all-zero rows, which the statistics count as
    the zeros they stand for (``size`` is the dense size, absent entries are zeros anyway).
    """
    indices = tf.reshape(gradient.indices, [-1])
    order = tf.argsort(indices)
    sorted_indices = tf.gather(indices, order)
    starts_row = tf.concat(
        [tf.ones([1], tf.bool), tf.not_equal(sorted_indices[1:], sorted_indices[:-1])], 0
    )
    segments = tf.cumsum(tf.cast(starts_row, tf.int32)) - 1
    lookups = indices.shape[0]
    segment_count = (
        tf.minimum(tf.size(indices), table_rows)
        if lookups is None or table_rows is None
        else min(lookups, table_rows)
    )
    return tf.math.unsorted_segment_sum(
        tf.gather(tf.cast(gradient.values, dtype), order), segments, segment_count
    )


def _entries(gradients, variables, dtype):
    """Per variable None or (present values, dense size); sparse rows de-duplicated, not densified."""
    entries = []
    for gradient, variable in zip(gradients, variables):
        if gradient is None:
            entries.append(None)
        elif isinstance(gradient, tf.IndexedSlices):
            # Embedding gradients repeat a row once per lookup: sum repeats before any norm.
            dense_shape = (
                tf.constant(tuple(variable.shape), tf.int64)
                if _has_value(variable)
                else tf.cast(gradient.dense_shape, tf.int64)
            )
            table_rows = variable.shape[0] if _has_value(variable) else None
            entries.append(
                (_summed_rows(gradient, dtype, table_rows), tf.reduce_prod(dense_shape))
            )
        else:
            gradient = tf.convert_to_tensor(gradient)
            entries.append((tf.cast(gradient, dtype), tf.size(gradient, out_type=tf.int64)))
    return entries


def _dtype(gradients):
    return TensorFlowOps.computation_dtype(
        [g.dtype for g in gradients if g is not None]
    )


def gradient_statistics(gradients, variables, histograms=False):
    """Computes the statistics matrix (and optionally the histogram matrix) without writing.

    Pure computation on the gradients' device: usable inside ``jit_compile=True`` functions for
    dense gradients. Write the result with `write_statistics`.

    Returns:
      ``stats`` (``[variables, stats]``), or ``(stats, histogram_counts)`` if `histograms`.
    """
    gradients, variables = list(gradients), list(variables)
    _layout(gradients, variables)
    dtype = _dtype(gradients)
    entries = _entries(gradients, variables, dtype)
    weights = (
        [tf.cast(tf.convert_to_tensor(v), dtype) for v in variables]
        if all(_has_value(v) for v in variables)
        else None
    )
    stats = statistics.statistics_matrix(TensorFlowOps, entries, weights, dtype)
    if not histograms:
        return stats
    return stats, statistics.histogram_matrix(TensorFlowOps, entries, dtype)


def _histogram_counts(gradients, variables):
    """Only the histogram matrix: histogram steps must not recompute the stats matrix."""
    dtype = _dtype(gradients)
    return statistics.histogram_matrix(TensorFlowOps, _entries(gradients, variables, dtype), dtype)


# Per default writer (weakly held): which tag each variable layout goes to under each name.
_LAYOUT_TAGS = weakref.WeakKeyDictionary()
_NO_WRITER_TAGS = LayoutTags()
_MISSING = MissingGradientWarnings(logger)


def _tag_for(name, layout):
    from tensorflow.python.ops import summary_ops_v2  # the only way to see the default writer

    writer = getattr(getattr(summary_ops_v2, "_summary_state", None), "writer", None)
    tags = _NO_WRITER_TAGS if writer is None else _LAYOUT_TAGS.setdefault(writer, LayoutTags())
    return tags.tag_for(name, layout)


def write_statistics(
    stats,
    variables,
    step=None,
    name=metadata.DEFAULT_NAME,
    histogram_counts=None,
    description=None,
    writer=None,
):
    """Writes a matrix from `gradient_statistics` (e.g. returned from an XLA-compiled step).

    Args:
      stats: ``[variables, stats]`` from `gradient_statistics` for the same `variables`.
      variables: the variables (or their names) in the same order.
      step: defaults to ``tf.summary.experimental.get_step()``.
      name: summary name = tag.
      histogram_counts: optional histogram matrix, written under ``<tag>_histograms``.
      description: optional summary description.
      writer: a `tensorboard_gradients.GradientWriter` to write with instead of TensorFlow's
        default summary writer (see `gradients`).

    Returns:
      True if the statistics were written (a default writer exists and is recording; with
      `writer`, unless the step was dropped).
    """
    variables = list(variables)
    layout = _layout([None] * len(variables), variables)
    if writer is not None:
        counts = None if histogram_counts is None else lambda: histogram_counts
        return _write_with(writer, layout, step, description, stats, counts,
                           histogram_counts is not None)
    return _write(
        layout,
        name,
        step,
        description,
        lambda: stats,
        lambda: histogram_counts,
        histogram_counts is not None,
    )


def _write(layout, name, step, description, stats_fn, histograms_fn, histograms_condition):
    tag = _tag_for(name, layout)
    with tf.name_scope(name):
        written = tf.summary.write(
            tag,
            stats_fn,
            step=step,
            metadata=metadata.create_summary_metadata(
                metadata.stats_metadata_content(name, layout), description
            ),
        )
        if histograms_condition is False:
            return written
        recording = (
            contextlib.nullcontext()
            if histograms_condition is True
            else tf.summary.record_if(
                tf.logical_and(
                    tf.summary.should_record_summaries(), tf.cast(histograms_condition, tf.bool)
                )
            )
        )
        with recording:
            tf.summary.write(
                metadata.histogram_tag(tag),
                histograms_fn,
                step=step,
                metadata=metadata.create_summary_metadata(
                    metadata.histogram_metadata_content(name, layout), description
                ),
            )
    return written


def _write_with(writer, layout, step, description, stats, histograms_fn, histograms):
    """Writes with a `GradientWriter` from eager code or a graph (through ``tf.py_function``,
    so a disk error is the writer's to drop and count, never an op error)."""
    step = tf.summary.experimental.get_step() if step is None else step
    if step is None:
        raise ValueError("no step: pass step= or call tf.summary.experimental.set_step")
    stats = tf.convert_to_tensor(stats)
    histograms = tf.cast(histograms, tf.bool)
    counts = tf.cond(
        histograms,
        lambda: tf.cast(histograms_fn(), tf.float64),
        lambda: tf.zeros([len(layout.variables), columns.HISTOGRAM_BINS], tf.float64),
    ) if histograms_fn is not None else tf.zeros([0], tf.float64)

    def write(step, stats, counts, with_histograms):
        dropped = writer.dropped_steps
        writer.write_statistics(int(step), layout, stats.numpy(),
                                counts.numpy() if bool(with_histograms) else None, description)
        return writer.dropped_steps == dropped

    return tf.py_function(write, [tf.cast(step, tf.int64), stats, counts, histograms], tf.bool)


def gradients(
    gradients,
    variables,
    step=None,
    name=metadata.DEFAULT_NAME,
    histograms=False,
    description=None,
    writer=None,
):
    """Writes per-variable gradient statistics as one summary, like `tf.summary.scalar`.

    Args:
      gradients: one gradient per variable, as returned by ``tape.gradient(loss, variables)``:
        dense tensors, `tf.IndexedSlices` (repeated rows are summed, the table is not densified)
        or None (logged as missing, with a one-time warning). float16, bfloat16, float32 and
        float64 are accepted; statistics are computed in float32 (float64 if any gradient is).
      variables: the variables, in model order (input side first). Their values give the
        ``weight_l2_norm`` column; plain strings (names) are accepted too, without that column.
      step: the step; defaults to ``tf.summary.experimental.get_step()``.
      name: the summary name and tag (a changed variable set goes to ``<name>_varset<k>``).
      histograms: a Python bool or a boolean tensor (e.g. ``step % 100 == 0``): also write
        the log10|g| histograms under ``<tag>_histograms`` when true.
      description: optional description stored with the summary metadata.
      writer: optional `tensorboard_gradients.GradientWriter` to write with instead of
        TensorFlow's default summary writer, so that a full or unwritable log disk never makes
        the op raise (see the module). The writer's ``name`` is the tag then; without a default
        TensorFlow writer `tf.summary.record_if` does not apply: call it on the steps to log.

    Returns:
      True (a boolean tensor in graph mode) if the statistics were written, False if no default
      summary writer is set or recording is off (with `writer`: if the step was dropped).

    Raises:
      ValueError: gradients and variables differ in length, or are empty.
    """
    gradients, variables = list(gradients), list(variables)
    layout = _layout(gradients, variables)
    _MISSING.warn([v for g, v in zip(gradients, layout.variables) if g is None])
    if writer is not None:
        return _write_with(writer, layout, step, description,
                           gradient_statistics(gradients, variables),
                           lambda: _histogram_counts(gradients, variables), histograms)
    return _write(
        layout,
        name,
        step,
        description,
        lambda: gradient_statistics(gradients, variables),
        lambda: _histogram_counts(gradients, variables),
        histograms,
    )
