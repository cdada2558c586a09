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

from tensorboard_gradients.capture import tensorflow_ops
from tensorboard_gradients.capture.tensorflow_ops import gradient_statistics
from tensorboard_gradients.format import columns, metadata
from tensorboard_gradients.format.layout import LayoutTags, MissingGradientWarnings

logger = logging.getLogger(__name__)

__all__ = ["gradients", "gradient_statistics", "write_statistics"]


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
    layout = tensorflow_ops.layout_of([None] * len(variables), variables)
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
    layout = tensorflow_ops.layout_of(gradients, variables)
    _MISSING.warn([v for g, v in zip(gradients, layout.variables) if g is None])
    if writer is not None:
        return _write_with(writer, layout, step, description,
                           tensorflow_ops.gradient_statistics(gradients, variables),
                           lambda: tensorflow_ops.histogram_counts(gradients, variables), histograms)
    return _write(
        layout,
        name,
        step,
        description,
        lambda: tensorflow_ops.gradient_statistics(gradients, variables),
        lambda: tensorflow_ops.histogram_counts(gradients, variables),
        histograms,
    )
