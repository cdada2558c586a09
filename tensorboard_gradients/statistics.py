"""The gradient statistics, written once for every array library.

The formulas below run on numpy (TF-free writer), TensorFlow (summary op, on device, inside
`tf.function`) and later PyTorch/JAX, each through a tiny adapter (`ArrayOps`) that names the
library's reductions. Keeping one formula is what makes the writers agree to float tolerance.

Robustness rules (a monitor must not break exactly when gradients blow up):

* NaN and +-Inf entries are counted (``nan_count``, ``inf_count``) and excluded from every other
  statistic, which is computed over the finite entries.
* Sums are taken of values divided by the variable's finite ``abs_max`` and scaled back, so
  ``l2_norm`` of a finite gradient with entries near the float32 maximum is finite, not Inf.
* Statistics with no finite entry to describe (mean, std, min, max, abs_max, mean_abs) are NaN;
  ``l2_norm`` is 0 then (an empty sum), and the counts say why.
* Sparse gradients (rows of an embedding) pass only their present entries plus the dense
  ``size``; the absent entries count as exact zeros everywhere, without densifying the table.
"""

import numpy as np

from tensorboard_gradients import metadata


class NumpyOps:
    """`ArrayOps` for numpy (and anything `np.asarray` accepts)."""

    @staticmethod
    def computation_dtype(dtypes):
        return np.float64 if any(np.dtype(d) == np.float64 for d in dtypes) else np.float32

    @staticmethod
    def to_float(x, dtype):
        return np.asarray(x).astype(dtype, copy=False)

    @staticmethod
    def constant(value, like):
        return np.asarray(value, dtype=like.dtype)

    numel = staticmethod(lambda x: np.asarray(x.size, dtype=x.dtype))
    sum = staticmethod(lambda x: np.sum(x, dtype=x.dtype))
    count = staticmethod(lambda mask, like: np.asarray(np.count_nonzero(mask), like.dtype))
    max = staticmethod(lambda x, initial: np.max(x, initial=initial))
    min = staticmethod(lambda x, initial: np.min(x, initial=initial))
    abs = staticmethod(np.abs)
    sqrt = staticmethod(np.sqrt)
    floor = staticmethod(np.floor)
    log10 = staticmethod(np.log10)
    isnan = staticmethod(np.isnan)
    isinf = staticmethod(np.isinf)
    isfinite = staticmethod(np.isfinite)
    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    clip = staticmethod(np.clip)

    @staticmethod
    def bincount(indices, length, like):
        counts = np.bincount(indices.reshape(-1).astype(np.int64), minlength=length)
        return counts.astype(like.dtype)

    @staticmethod
    def stack(values, axis=0):
        return np.stack(values, axis=axis)


def _safe_divide(ops, numerator, denominator):
    return numerator / ops.maximum(denominator, ops.constant(1, denominator))


def _nan_where(ops, condition, value):
    return ops.where(condition, ops.constant(np.nan, value), value)


def variable_statistics(ops, values, size, weights=None):
    """The `metadata.GRADIENT_STATS` (+ `WEIGHT_STATS` when `weights` is given) of one variable.

    Args:
      ops: the array library adapter.
      values: the gradient entries that are present, any shape, in the computation dtype.
      size: entries of the dense gradient (0-d, computation dtype); more than ``values`` holds
        for a sparse gradient, whose absent entries are zeros.
      weights: the variable's value (computation dtype), or None.

    Returns:
      A 1-D array of the statistics in `metadata` column order.
    """
    nan_count = ops.count(ops.isnan(values), like=size)
    inf_count = ops.count(ops.isinf(values), like=size)
    finite = ops.isfinite(values)
    zero = ops.constant(0, size)
    x = ops.where(finite, values, zero)
    implicit_zeros = size - ops.numel(values)
    finite_count = size - nan_count - inf_count
    no_finite = finite_count <= zero

    abs_max = ops.max(ops.abs(x), initial=zero)
    scale = ops.where(abs_max > zero, abs_max, ops.constant(1, size))
    scaled = x / scale
    mean_scaled = _safe_divide(ops, ops.sum(scaled), finite_count)
    centered = ops.where(finite, scaled - mean_scaled, zero)
    variance_scaled = _safe_divide(
        ops,
        ops.sum(centered * centered) + implicit_zeros * mean_scaled * mean_scaled,
        finite_count,
    )
    infinity = ops.constant(np.inf, size)
    has_implicit_zeros = implicit_zeros > zero
    minimum = ops.min(ops.where(finite, values, infinity), initial=infinity)
    maximum = ops.max(ops.where(finite, values, -infinity), initial=-infinity)
    minimum = ops.where(has_implicit_zeros, ops.minimum(minimum, zero), minimum)
    maximum = ops.where(has_implicit_zeros, ops.maximum(maximum, zero), maximum)
    zeros = ops.count(values == zero, like=size) + implicit_zeros

    stats = [
        scale * ops.sqrt(ops.sum(scaled * scaled)),  # l2_norm
        _nan_where(ops, no_finite, scale * mean_scaled),  # mean
        _nan_where(ops, no_finite, scale * ops.sqrt(variance_scaled)),  # std
        _nan_where(ops, no_finite, minimum),  # min
        _nan_where(ops, no_finite, maximum),  # max
        _nan_where(ops, no_finite, abs_max),  # abs_max
        _nan_where(ops, no_finite, scale * _safe_divide(ops, ops.sum(ops.abs(scaled)), finite_count)),
        _nan_where(ops, size <= zero, _safe_divide(ops, zeros, size)),  # zero_fraction
        nan_count,
        inf_count,
        size,
    ]
    if weights is not None:
        stats.append(finite_l2_norm(ops, weights))
    return ops.stack(stats)


def finite_l2_norm(ops, values):
    """L2 norm over the finite entries, scaled so that it cannot overflow."""
    zero = ops.constant(0, values)
    x = ops.where(ops.isfinite(values), values, zero)
    abs_max = ops.max(ops.abs(x), initial=zero)
    scale = ops.where(abs_max > zero, abs_max, ops.constant(1, values))
    scaled = x / scale
    return scale * ops.sqrt(ops.sum(scaled * scaled))


def statistics_matrix(ops, gradients, weights, dtype):
    """The ``[variables, stats]`` matrix of one step.

    Args:
      gradients: per variable, None (missing: a row of NaN, see `metadata`) or a pair
        ``(present values, dense size)`` already in `dtype`.
      weights: per variable values in `dtype`, or None for no `weight_l2_norm` column.
      dtype: the computation dtype (`ArrayOps.computation_dtype`).
    """
    like = ops.to_float(0, dtype)
    num_stats = len(metadata.GRADIENT_STATS) + (len(metadata.WEIGHT_STATS) if weights else 0)
    rows = []
    for index, gradient in enumerate(gradients):
        if gradient is None:
            rows.append(ops.stack([ops.constant(np.nan, like)] * num_stats))
        else:
            values, size = gradient
            weight = weights[index] if weights else None
            rows.append(variable_statistics(ops, values, ops.constant(size, like), weight))
    return ops.stack(rows)


def histogram_matrix(ops, gradients, dtype):
    """The ``[variables, HISTOGRAM_BINS]`` counts of one step (missing gradients: all zero)."""
    like = ops.to_float(0, dtype)
    empty = ops.constant(np.zeros(metadata.HISTOGRAM_BINS), like)
    return ops.stack(
        [
            empty if g is None else variable_histogram(ops, g[0], ops.constant(g[1], like))
            for g in gradients
        ]
    )


def variable_histogram(ops, values, size):
    """Counts of |g| in the fixed `metadata` histogram columns (absent sparse entries are zeros)."""
    magnitude = ops.abs(values)
    finite = ops.isfinite(values)
    positive = ops.where(finite, magnitude > ops.constant(0, magnitude), False)
    log_magnitude = ops.log10(ops.where(positive, magnitude, ops.constant(1, magnitude)))
    position = ops.floor(
        (log_magnitude - metadata.HISTOGRAM_LOG10_MIN) * metadata.HISTOGRAM_BINS_PER_DECADE
    )
    column = metadata.HIST_FIRST_LOG_BIN + ops.clip(position, -1, metadata.HISTOGRAM_LOG_BINS)
    column = ops.where(positive, column, ops.constant(metadata.HIST_ZERO, column))
    column = ops.where(ops.isnan(values), ops.constant(metadata.HIST_NAN, column), column)
    column = ops.where(ops.isinf(values), ops.constant(metadata.HIST_INF, column), column)
    counts = ops.bincount(column, metadata.HISTOGRAM_BINS, like=size)
    implicit_zeros = size - ops.numel(values)
    return counts + implicit_zeros * ops.constant(
        np.eye(1, metadata.HISTOGRAM_BINS, metadata.HIST_ZERO)[0], size
    )
