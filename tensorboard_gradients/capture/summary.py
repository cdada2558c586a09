"""TensorFlow summary op for gradient statistics (imports TensorFlow; import it only from TF code).

Use like `tf.summary.scalar`, under a default writer, eagerly or inside `tf.function`:

```python
writer = tf.summary.create_file_writer("logs/run1")

@tf.function
def train_step(x, y, step):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    with writer.as_default(step=step):
        tensorboard_gradients.summary.gradients(grads, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
```

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

Which process writes, under ``tf.distribute`` (one step's statistics are written once):

* With ``writer=GradientWriter(...)``: inside ``strategy.run`` (a replica context) only global
  replica 0 writes, the rule TensorFlow's own summaries follow: with
  ``MultiWorkerMirroredStrategy`` that is the chief (worker 0, or the ``chief`` task), with
  ``MirroredStrategy`` the first device. Outside ``strategy.run`` (cross-replica code, e.g.
  `write_statistics` with a matrix returned from the step) the process writes if the strategy's
  ``extended.should_save_summary`` is true: the chief only under multi-worker strategies, the one
  process otherwise. The strategy is the current one, or else the one the `variables` were
  created under. Every other replica and worker returns False without computing the statistics
  or touching the writer, and since a `GradientWriter` creates its directory and event file on
  its first write, a non-chief worker leaves nothing on disk: every worker may build the same
  ``GradientWriter(log_dir)`` and run the same step. Pass the all-reduced gradients (e.g.
  ``tf.distribute.get_replica_context().all_reduce("SUM", grads)``): the op reduces nothing.
* With TensorFlow's default writer, TensorFlow's rules apply: in a replica context only replica 0
  records; cross-replica code records on every process that has a default writer, and
  ``tf.summary.create_file_writer`` creates its event file at once, so create it on the chief only.
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
    logged_stats=None,
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
        default summary writer (see `gradients`); under ``tf.distribute`` only the chief writes
        (see the module).
      logged_stats: the ``stats`` given to `gradient_statistics` (None: all).

    Returns:
      True if the statistics were written (a default writer exists and is recording; with
      `writer`, unless the step was dropped or this is not the writing process).

    Raises:
      ValueError: ``stats`` has another width than ``logged_stats`` give.
    """
    variables = list(variables)
    layout = tensorflow_ops.layout_of([None] * len(variables), variables, logged_stats)
    shape = tf.TensorShape(getattr(stats, "shape", None))
    width = shape[-1] if shape.rank == 2 else None
    if width is not None and width != len(layout.stats):
        raise ValueError(
            f"stats has {width} columns, but {len(layout.stats)} stats {list(layout.stats)} are "
            "expected: give write_statistics the logged_stats= that gradient_statistics was "
            "given as stats=")
    if writer is not None:
        counts = None if histogram_counts is None else lambda: histogram_counts
        return _write_with(writer, layout, step, description, lambda: stats, counts,
                           histogram_counts is not None, variables)
    return _write(
        layout,
        name,
        step,
        description,
        lambda: stats,
        lambda: histogram_counts,
        histogram_counts is not None,
    )


def _on_the_gradients_device(compute):
    """`compute` with the device scope cleared: `tf.summary.write` calls its tensor callable
    under ``device("cpu:0")``, which would copy every gradient to the host; this way the
    statistics run where the gradients are and only their small matrix goes to the CPU."""
    def computed():
        with tf.device(None):
            return compute()
    return computed


def _write(layout, name, step, description, stats_fn, histograms_fn, histograms_condition,
           loss=None):
    tag = _tag_for(name, layout)
    stats_fn, histograms_fn = _on_the_gradients_device(stats_fn), _on_the_gradients_device(
        histograms_fn)
    with tf.name_scope(name):
        written = tf.summary.write(
            tag,
            stats_fn,
            step=step,
            metadata=metadata.create_summary_metadata(
                metadata.stats_metadata_content(name, layout), description
            ),
        )
        if loss is not None:
            tf.summary.write(
                metadata.loss_tag(name), tf.cast(loss, tf.float64), step=step,
                metadata=metadata.create_summary_metadata(metadata.loss_metadata_content(name)))
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


def _strategy_of(variables):
    """The `tf.distribute.Strategy` the variables were created under, or None."""
    for variable in variables:
        # A distributed tf.Variable, or the one a Keras variable holds (its `value` property).
        for candidate in (variable, getattr(variable, "value", None)):
            strategy = getattr(candidate, "distribute_strategy", None)
            if strategy is not None:
                return strategy
    return None


def _writes_here(variables):
    """Whether this replica (in ``strategy.run``) or process (cross-replica) writes with a
    `GradientWriter`: a Python bool, or a boolean tensor (see the module)."""
    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        static = tf.get_static_value(replica)
        return bool(static == 0) if static is not None else tf.equal(replica, 0)
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else _strategy_of(
        variables)
    if strategy is None:
        return True
    try:
        return bool(strategy.extended.should_save_summary)
    except NotImplementedError:  # a strategy that does not say: every process is its own writer
        return True


def _write_with(writer, layout, step, description, stats_fn, histograms_fn, histograms,
                variables, loss=None):
    """Writes with a `GradientWriter` from eager code or a graph (through ``tf.py_function``,
    so a disk error is the writer's to drop and count, never an op error), on the writing
    replica and process only (`_writes_here`); elsewhere nothing is computed and False returned."""
    step = tf.summary.experimental.get_step() if step is None else step
    if step is None:
        raise ValueError("no step: pass step= or call tf.summary.experimental.set_step")

    def write_op():
        stats = tf.convert_to_tensor(stats_fn())
        with_histograms = tf.cast(histograms, tf.bool)
        counts = tf.cond(
            with_histograms,
            lambda: tf.cast(histograms_fn(), tf.float64),
            lambda: tf.zeros([len(layout.variables), columns.HISTOGRAM_BINS], tf.float64),
        ) if histograms_fn is not None else tf.zeros([0], tf.float64)
        # No loss: an empty vector (a loss of NaN is a loss, and is written).
        loss_value = (tf.zeros([0], tf.float64) if loss is None
                      else tf.reshape(tf.cast(loss, tf.float64), [1]))
        return tf.py_function(
            write, [tf.cast(step, tf.int64), stats, counts, with_histograms, loss_value], tf.bool)

    def write(step, stats, counts, with_histograms, loss_value):
        dropped = writer.dropped_steps
        losses = loss_value.numpy()
        writer.write_statistics(int(step), layout, stats.numpy(),
                                counts.numpy() if bool(with_histograms) else None, description,
                                loss=losses[0] if losses.size else None)
        return writer.dropped_steps == dropped

    writes = _writes_here(variables)
    if writes is True:
        return write_op()
    if writes is False:
        return tf.constant(False)
    return tf.cond(writes, write_op, lambda: tf.constant(False))


def gradients(
    gradients,
    variables,
    step=None,
    name=metadata.DEFAULT_NAME,
    histograms=False,
    description=None,
    writer=None,
    stats=None,
    loss=None,
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
        Under ``tf.distribute`` only global replica 0 (the chief's) writes; the other replicas
        and workers compute nothing and never touch the writer (see the module).
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm only when named.
      loss: this step's training loss (a number or a scalar tensor; NaN and Inf are kept),
        written beside the statistics under ``<name>_loss``: the rules judge the gradients
        against it (a gradient spike the loss never felt is not a warning; the loss climbing
        with the gradient is the early warning of a loss spike). None: not logged (the rules
        then read the run's own ``loss`` scalar, when it has one).

    Returns:
      True (a boolean tensor in graph mode) if the statistics were written, False if no default
      summary writer is set or recording is off (with `writer`: if the step was dropped, or on a
      replica or worker that does not write).

    Raises:
      ValueError: gradients and variables differ in length, or are empty; an unknown stat.
    """
    gradients, variables = list(gradients), list(variables)
    stats = columns.selected_stats(stats)
    layout = tensorflow_ops.layout_of(gradients, variables, stats)
    _MISSING.warn([v for g, v in zip(gradients, layout.variables) if g is None])
    compute = lambda: tensorflow_ops.gradient_statistics(  # noqa: E731
        gradients, variables, stats=stats)
    if writer is not None:
        return _write_with(writer, layout, step, description, compute,
                           lambda: tensorflow_ops.histogram_counts(gradients, variables),
                           histograms, variables, loss)
    return _write(
        layout,
        name,
        step,
        description,
        compute,
        lambda: tensorflow_ops.histogram_counts(gradients, variables),
        histograms,
        loss,
    )
