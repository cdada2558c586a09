"""Shards of one variable combined: the partial results of each rank's pieces, made whole.

Under sharding (`capture.torch_sharded`) every rank reduces the pieces of the variables it
holds to `formulas.REDUCTIONS` rows; rank 0 combines those rows here, then derives the stats
from them as for a whole variable (`formulas.statistics_from_reductions`).
"""

import numpy as np

from tensorboard_gradients.format.statistics.array_ops import NumpyOps
from tensorboard_gradients.format.statistics.formulas import (
    REDUCTIONS, combine_moments, stack_reductions)


def combine_shards(parts, counted):
    """The `reduction_matrix` rows of whole variables from the rows of their shards (numpy).

    Each statistic combines by its own rule: counts and the scaled sums add (after rescaling
    every shard's sums to the largest ``abs_max``, so nothing overflows), ``min``/``max``/
    ``abs_max`` take the extreme, ``m2`` joins by the parallel-variance formula
    (`combine_moments`) with each shard's mean, never from sums of squares.

    Args:
      parts: ``[shards, variables, REDUCTIONS]``: one `reduction_matrix` per shard (a rank's
        local pieces), NaN rows for a shard without a gradient.
      counted: ``bool[shards, variables]``: whether that shard's row counts. A replica of a
        shard another row already holds (data-parallel copies, replicated biases) does not.

    Returns:
      ``[variables, REDUCTIONS]`` float64; a variable with a counted shard lacking a gradient
      (or no counted shard) is a row of NaN: missing.
    """
    parts = np.asarray(parts, dtype=np.float64)
    counted = np.asarray(counted, dtype=bool)
    column = lambda name: parts[..., REDUCTIONS.index(name)]  # noqa: E731
    missing = (counted & np.isnan(column("present"))).any(axis=0) | ~counted.any(axis=0)
    used = counted & ~np.isnan(column("present"))
    shard_scale = np.where(used & (column("abs_max") > 0), column("abs_max"), 1.0)
    abs_max = np.where(used, column("abs_max"), 0.0).max(axis=0)
    ratio = np.where(used, shard_scale / np.where(abs_max > 0, abs_max, 1.0), 0.0)
    total = lambda values: np.where(used, values, 0.0).sum(axis=0)  # noqa: E731
    ops = NumpyOps
    moments = (np.zeros_like(abs_max), np.zeros_like(abs_max), np.zeros_like(abs_max))
    for shard in range(parts.shape[0]):
        finite = np.where(used[shard], column("finite")[shard], 0.0)
        scaled_sum = np.where(used[shard], column("sum")[shard] * ratio[shard], 0.0)
        shard_moments = (finite, scaled_sum / np.maximum(finite, 1.0),
                         np.where(used[shard], column("m2")[shard] * ratio[shard] ** 2, 0.0))
        moments = combine_moments(ops, moments, shard_moments)
    with np.errstate(invalid="ignore"):
        combined = stack_reductions(
            ops,
            axis=1,
            present=total(column("present")),
            nan=total(column("nan")),
            finite=total(column("finite")),
            abs_max=abs_max,
            sum=total(column("sum") * ratio),
            sum_squares=total(column("sum_squares") * ratio**2),
            sum_abs=total(column("sum_abs") * ratio),
            min=np.where(used, column("min"), np.inf).min(axis=0),
            max=np.where(used, column("max"), -np.inf).max(axis=0),
            zeros=total(column("zeros")),
            m2=moments[2],
        )
    return np.where(missing[:, None], np.nan, combined)
