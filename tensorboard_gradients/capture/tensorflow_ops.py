"""The one TensorFlow adapter: `statistics` on TensorFlow tensors, and a TF gradient list turned
into the statistics' inputs (sparse ``IndexedSlices`` rows summed, never densified).

Shared by the summary op (`summary`) and the Keras monitor's on-device recorder
(`keras_recorder`). Everything here is traceable: it runs on the gradients' device, inside
``tf.function`` and, for dense gradients, under XLA.
"""

import functools

import tensorflow as tf

from tensorboard_gradients.format import columns, statistics
from tensorboard_gradients.format.layout import Layout


class TensorFlowOps(statistics.ArrayOps):
    """`statistics` adapter for TensorFlow (runs on the tensors' device, traceable)."""

    @staticmethod
    def computation_dtype(dtypes):
        return tf.float64 if any(tf.as_dtype(d) == tf.float64 for d in dtypes) else tf.float32

    to_float = staticmethod(lambda x, dtype: tf.cast(x, dtype))
    constant = staticmethod(lambda value, like: tf.cast(value, like.dtype))
    numel = staticmethod(lambda x: tf.cast(tf.size(x), x.dtype))
    static_size = staticmethod(lambda x: x.shape.num_elements())
    reshape = staticmethod(tf.reshape)
    concat = staticmethod(lambda parts: tf.concat(parts, 0))
    take_rows = staticmethod(lambda matrix, indices: tf.gather(matrix, indices))
    sum = staticmethod(lambda x, axis=None: tf.reduce_sum(x, axis))
    count = staticmethod(lambda mask, like, axis=None: tf.reduce_sum(tf.cast(mask, like.dtype), axis))
    max = staticmethod(lambda x, initial, axis=None: tf.maximum(tf.reduce_max(x, axis), initial))
    min = staticmethod(lambda x, initial, axis=None: tf.minimum(tf.reduce_min(x, axis), initial))
    abs = staticmethod(tf.abs)
    sqrt = staticmethod(tf.sqrt)
    isnan = staticmethod(tf.math.is_nan)
    isfinite = staticmethod(tf.math.is_finite)
    where = staticmethod(tf.where)
    maximum = staticmethod(tf.maximum)
    minimum = staticmethod(tf.minimum)
    gather = staticmethod(tf.gather)
    take_columns = staticmethod(lambda matrix, indices: tf.gather(matrix, indices, axis=1))
    shift_right = staticmethod(
        lambda bits, count: tf.bitwise.right_shift(bits, tf.constant(count, bits.dtype)))

    @staticmethod
    def magnitude_bits(x):
        integer = tf.int64 if x.dtype == tf.float64 else tf.int32
        return tf.bitwise.bitwise_and(tf.bitcast(x, integer), integer.max)

    @staticmethod
    def bincount(indices, length, like):
        # DenseBincount with the length fixed (tf.math.bincount first reduces the indices to find
        # it): compiles under XLA, and on a CPU counts 8x faster than a segment sum of ones.
        return tf.raw_ops.DenseBincount(input=tf.reshape(indices, [-1]), size=length,
                                        weights=tf.zeros([0], like.dtype))

    indicator = staticmethod(lambda mask, like: tf.cast(mask, like.dtype))
    stack = staticmethod(tf.stack)
    all = staticmethod(tf.reduce_all)
    cond = staticmethod(tf.cond)

    # Fused kernels where TensorFlow has them (CPU, 786k entries: `l2_loss` is one pass, 0.14 ms,
    # where square-then-sum takes two and a temporary; an exact zero count from the squared signs
    # takes 0.21 ms against 0.64 ms for compare, cast and sum; benchmarks/NOTES.md).
    @classmethod
    def sum_of_squares(cls, matrix, axes):
        if matrix.shape[0] == 1:  # one array: its own fused pass
            return tf.reshape(_fused_square_sum(matrix), [1])
        return tf.reduce_sum(tf.square(matrix), axes)

    square_sum = staticmethod(lambda array: _fused_square_sum(array))
    nonzero_count = staticmethod(lambda array: _fused_square_sum(tf.sign(array)))

    @classmethod
    def zero_count(cls, matrix, axes, like):
        return cls.numel(matrix) / matrix.shape[0] - cls.sum_of_squares(tf.sign(matrix), axes)

    @staticmethod
    def square_sums(arrays):
        # One doubling of the stacked halves, not one per array: the same values (times 2 is
        # exact), one graph op instead of one per variable in every traced step.
        return 2 * tf.stack([tf.nn.l2_loss(a) for a in arrays])


def variable_name(variable):
    if isinstance(variable, str):
        return variable
    # Keras 3 `.name` is just "kernel" (not unique); `.path` is "dense_3/kernel".
    return getattr(variable, "path", None) or variable.name


def has_value(variable):
    return not isinstance(variable, str)


def variable_shape(variable, gradient):
    if has_value(variable):
        return tuple(variable.shape)
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tuple(tf.get_static_value(gradient.dense_shape))
    return tuple(gradient.shape)


def logs_weights(variables, stats=None):
    """Whether the ``weight_l2_norm`` column is logged: the variables' values are known (not
    names) and ``stats`` (`columns.selected_stats`) has it."""
    return ("weight_l2_norm" in columns.selected_stats(stats)
            and all(has_value(v) for v in variables))


def layout_of(gradients, variables, stats=None):
    """The `Layout` of ``variables``' matrices for the ``stats`` asked for (a writer's
    ``stats=``)."""
    if len(gradients) != len(variables):
        raise ValueError(
            f"got {len(gradients)} gradients for {len(variables)} variables; pass them in the "
            "same order, as from tape.gradient(loss, variables)"
        )
    if not variables:
        raise ValueError("no variables to log gradients for")
    return Layout.create(
        [variable_name(v) for v in variables],
        [variable_shape(v, g) for v, g in zip(variables, gradients)],
        with_weights=logs_weights(variables, stats),
        gradient_stats=columns.gradient_stats(stats),
    )


def summed_rows(gradient, dtype, table_rows):
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


def statistics_inputs(gradients, variables, dtype):
    """Per variable None or (present values, dense size); sparse rows de-duplicated, not densified."""
    entries = []
    for gradient, variable in zip(gradients, variables):
        if gradient is None:
            entries.append(None)
        elif isinstance(gradient, tf.IndexedSlices):
            # Embedding gradients repeat a row once per lookup: sum repeats before any norm.
            dense_shape = (
                tf.constant(tuple(variable.shape), tf.int64)
                if has_value(variable)
                else tf.cast(gradient.dense_shape, tf.int64)
            )
            table_rows = variable.shape[0] if has_value(variable) else None
            entries.append(
                (summed_rows(gradient, dtype, table_rows), tf.reduce_prod(dense_shape))
            )
        else:
            gradient = tf.convert_to_tensor(gradient)
            size = gradient.shape.num_elements()  # static where known: one constant for all
            entries.append((tf.cast(gradient, dtype),
                            tf.size(gradient, out_type=tf.int64) if size is None else size))
    return entries


def computation_dtype(gradients):
    """float64 when any gradient is, else float32 (`statistics.ArrayOps.computation_dtype`)."""
    return TensorFlowOps.computation_dtype(
        [g.dtype for g in gradients if g is not None]
    )


def gradient_statistics(gradients, variables, histograms=False, stats=None):
    """Computes the statistics matrix (and optionally the histogram matrix) without writing.

    Pure computation on the gradients' device: usable inside ``jit_compile=True`` functions for
    dense gradients. Write the result with `write_statistics` (given the same ``stats`` as
    ``logged_stats``).

    ``stats``: the statistics to compute (`columns.selected_stats`): None for all, or some of
    their names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of
    six, none over the variables). l2_norm, min, max, abs_max, nan_count, inf_count and size
    are always computed; weight_l2_norm only when named.

    Returns:
      ``stats`` (``[variables, stats]``), or ``(stats, histogram_counts)`` if `histograms`.
    """
    gradients, variables = list(gradients), list(variables)
    layout_of(gradients, variables, stats)
    entries, weights, dtype = statistics_arguments(gradients, variables,
                                                   logs_weights(variables, stats))
    matrix = statistics.statistics_matrix(TensorFlowOps, entries, weights, dtype,
                                          columns.gradient_stats(stats))
    if not histograms:
        return matrix
    return matrix, histogram_matrix(entries, dtype)


def statistics_arguments(gradients, variables, with_weights):
    """``(entries, weights, dtype)`` of `statistics.statistics_matrix` for these gradients of
    ``variables``: `statistics_inputs` in their computation dtype, and the variables' values
    in it when ``with_weights`` (else None)."""
    dtype = computation_dtype(gradients)
    weights = ([tf.cast(tf.convert_to_tensor(v), dtype) for v in variables] if with_weights
               else None)
    return statistics_inputs(gradients, variables, dtype), weights, dtype


def histogram_counts(gradients, variables):
    """Only the histogram matrix: histogram steps must not recompute the stats matrix."""
    dtype = computation_dtype(gradients)
    return histogram_matrix(statistics_inputs(gradients, variables, dtype), dtype)


def histogram_matrix(entries, dtype):
    """`statistics.histogram_matrix` of `statistics_inputs` entries, the arrays of static shape
    counted by one XLA-compiled function: fused into a few loops, the bit-pattern histogram of
    the benchmark MLP's 30 gradients takes 3 ms on a 2-core CPU against 9-12 ms op by op (196
    tensors: 8 ms against 41 ms; benchmarks/NOTES.md "Overhead (issue 19)"), for one compilation
    per model (1 s and 7 s). Entries of a shape known only when the step runs (the summed rows
    of a sparse gradient) are counted op by op: XLA would compile again for every new row count.
    Inside a step that is itself compiled with XLA the function is simply part of it.

    Only where TensorFlow has no GPU: there each op is one fast kernel anyway, and XLA's GPU
    compiler needs parts of the CUDA toolkit (ptxas, libdevice) that many installations lack;
    a compilation failing there would stop the training step."""
    compiled = [index for index, entry in enumerate(entries)
                if entry is not None and entry[0].shape.is_fully_defined()
                and isinstance(entry[1], int)]
    if not compiled or not _compiles_histograms():
        return statistics.histogram_matrix(TensorFlowOps, entries, dtype)
    counted = _compiled_histograms()([entries[i][0] for i in compiled],
                                     tuple(entries[i][1] for i in compiled))
    if len(compiled) == len(entries):
        return counted
    # The others op by op, with all-zero rows where the compiled counts go.
    compiled_set = set(compiled)
    rest = statistics.histogram_matrix(
        TensorFlowOps, [None if i in compiled_set else e for i, e in enumerate(entries)], dtype)
    return rest + tf.scatter_nd([[i] for i in compiled], counted, tf.shape(rest))


@functools.lru_cache(maxsize=None)
def _compiles_histograms():
    return tf.test.is_built_with_xla() and not tf.config.list_physical_devices("GPU")


def _static_histogram_matrix(values, sizes):
    return statistics.histogram_matrix(TensorFlowOps, list(zip(values, sizes)), values[0].dtype)


def _compiled_histograms():
    """The XLA-compiled `_static_histogram_matrix`. Inside a traced step, a function of its own:
    traced once with the step and freed with it (one kept for the process would hold every
    model's compilation, and warn of retracing after a few models). Called eagerly, the one kept
    for the process, so that each shape compiles once."""
    if tf.inside_function():
        return tf.function(_static_histogram_matrix, jit_compile=True, autograph=False)
    return _EAGER_COMPILED_HISTOGRAMS


_EAGER_COMPILED_HISTOGRAMS = tf.function(_static_histogram_matrix, jit_compile=True,
                                         autograph=False)


def dense_values(gradient, dtype, table_rows=None):
    """A dense tensor whose sum of squares is that of a dense or ``IndexedSlices`` gradient
    (repeated rows summed first, as `statistics_inputs` does), in ``dtype``."""
    if isinstance(gradient, tf.IndexedSlices):
        return summed_rows(gradient, dtype, table_rows)
    return tf.cast(gradient, dtype)


def sum_of_squares(gradient, dtype, table_rows=None):
    """The sum of squared entries of a dense or ``IndexedSlices`` gradient; NaN/Inf propagate."""
    return _fused_square_sum(dense_values(gradient, dtype, table_rows))


def _fused_square_sum(x):
    """``sum(x * x)`` in one pass (`tf.nn.l2_loss` is half of it)."""
    return 2 * tf.nn.l2_loss(x)


def divided(gradient, scale):
    """A dense or ``IndexedSlices`` gradient divided by ``scale`` (None stays None): how loss-scaled
    gradients are unscaled, in the gradient's own dtype as Keras does."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            gradient.values / tf.cast(scale, gradient.values.dtype),
            gradient.indices,
            gradient.dense_shape,
        )
    return gradient / tf.cast(scale, gradient.dtype)
