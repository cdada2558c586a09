"""The gradient statistics, written once for every array library.

The formulas below run on numpy (TF-free writer), TensorFlow (summary op, on device, inside
`tf.function`), PyTorch and JAX (their monitors, on device), each through a tiny adapter
(`ArrayOps`) that names the library's reductions. Keeping one formula is what makes the writers agree to float tolerance.

Robustness rules (a monitor must not break exactly when gradients blow up):

* NaN and +-Inf entries are counted (``nan_count``, ``inf_count``) and excluded from every other
  statistic, which is computed over the finite entries.
* Sums are taken of values divided by the variable's finite ``abs_max`` and scaled back, so
  ``l2_norm`` of a finite gradient with entries near the float32 maximum is finite, not Inf.
* ``std`` comes from the sum of squared deviations from the mean (two passes: the mean, then
  ``sum((x - mean)^2)``), never from ``mean(x^2) - mean^2``, which cancels catastrophically when
  ``|mean| >> std`` (a bias whose entries all sit near one value: float32 keeps ~7 digits, so
  with ``|mean| / std = 1e4`` the difference keeps none, and the summation order the compiler
  picks decides whether it comes out 0). The two-pass error is second order in the mean's
  rounding error (Chan, Golub & LeVeque 1983, "Algorithms for computing the sample variance").
  The same (count, mean, M2) triple combines partial results by the parallel-variance formula
  (`combine_moments`), which is how the absent entries of a sparse gradient join in.
* Statistics with no finite entry to describe (mean, std, min, max, abs_max, mean_abs) are NaN;
  ``l2_norm`` is 0 then (an empty sum), and the counts say why.
* Sparse gradients (rows of an embedding) pass only their present entries plus the dense
  ``size``; the absent entries count as exact zeros everywhere, without densifying the table.
"""

import functools

import numpy as np

from tensorboard_gradients.format import columns


# Arrays of up to this many entries (biases, norm scales) are reduced together with the other
# arrays of their size: stacked into one ``[k, n]`` matrix, a group costs the ~8 reductions one
# array costs, instead of ~8 per array, and each of those costs a fixed dispatch of several
# microseconds on a CPU and in eager PyTorch anywhere, most of a small array's cost. Larger
# arrays are reduced on their own: stacking them costs a copy (a pass over the entries) and, on
# the 14-layer MLP's 65k-entry kernels, made the statistics slower on both TensorFlow (3.1-5.1 ms
# against 1.8-2.8 ms) and PyTorch (8.2-8.7 ms against 4.8-5.0 ms) on a 2-core CPU
# (benchmarks/NOTES.md "Overhead (issue 19)"). A group holds at most `GROUP_MAX_ENTRIES`
# entries, so the extra memory of a stack stays bounded (16 MiB in float32).
GROUPED_ARRAY_MAX_ENTRIES = 2**12
GROUP_MAX_ENTRIES = 2**22


def size_groups(sizes, grouped=True):
    """Index lists partitioning ``range(len(sizes))``: arrays of one static size up to
    `GROUPED_ARRAY_MAX_ENTRIES` share a group of at most `GROUP_MAX_ENTRIES` entries (first
    occurrence order); any other array (larger, of unknown size (None), or all when ``grouped`` is
    false) is a group of its own."""
    groups, open_group = [], {}
    for index, size in enumerate(sizes):
        if not grouped or size is None or size > GROUPED_ARRAY_MAX_ENTRIES or size == 0:
            groups.append([index])
            continue
        members = open_group.get(size)
        if members is None or (len(members) + 1) * size > GROUP_MAX_ENTRIES:
            members = open_group[size] = []
            groups.append(members)
        members.append(index)
    return groups


class ArrayOps:
    """Base of the array-library adapters: the elementwise ops and reductions are each library's
    own (see `NumpyOps`; reductions take an optional ``axis``); the grouped reductions below are
    written once over them. ``groups_arrays``: whether small arrays of one size are stacked and
    reduced together (`size_groups`); off where a compiler fuses every array's reductions anyway
    (JAX's jit), so a stack would only add a copy."""

    groups_arrays = True

    @classmethod
    def rows_matrix(cls, arrays):
        """``[k, n]``: ``k`` arrays of ``n`` entries each, one per row (a view for one array)."""
        if len(arrays) == 1:
            return cls.reshape(arrays[0], (1, -1))
        if len({tuple(a.shape) for a in arrays}) == 1:  # one reshape, not one per array
            return cls.reshape(cls.stack(arrays), (len(arrays), -1))
        return cls.stack([cls.reshape(a, (-1,)) for a in arrays])

    @classmethod
    def grouped_rows(cls, arrays, reduce_matrix):
        """``[len(arrays), C]``: ``reduce_matrix`` (``[k, n]`` -> ``[k, C]``) applied to every
        `size_groups` group of ``arrays``, rows in the order of ``arrays``."""
        groups = size_groups([cls.static_size(a) for a in arrays], cls.groups_arrays)
        parts = [reduce_matrix(cls.rows_matrix([arrays[i] for i in group])) for group in groups]
        order = [index for group in groups for index in group]
        if order == list(range(len(arrays))):
            return parts[0] if len(parts) == 1 else cls.concat(parts)
        return cls.take_rows(cls.concat(parts), np.argsort(order))

    @classmethod
    def pass_rows(cls, values, passes):
        """``[len(values), len(passes)]``: the `MATRIX_REDUCTIONS` named in ``passes`` of each
        array. An array in a `size_groups` group of its own is reduced by `array_reductions`,
        a reduction each with nothing around it, and the results of all of them are stacked
        once per pass; the groups of small arrays are reduced as stacked matrices
        (`matrix_reductions`). Per array that is a third of the operations a one-row matrix
        takes (its reshape, count, stack and concatenation), which is what an eager library and
        TensorFlow's graph executor pay a dispatch for (benchmarks/NOTES.md)."""
        sizes = [cls.static_size(a) for a in values]
        groups = size_groups(sizes, cls.groups_arrays)
        # Known, non-empty sizes only: an empty array has no min or max to take.
        alone = [group[0] for group in groups if len(group) == 1 and sizes[group[0]]]
        stacked = [group for group in groups if not (len(group) == 1 and sizes[group[0]])]
        blocks = [cls._rows_of_arrays_alone([values[i] for i in alone], passes)] if alone else []
        blocks += [cls.stack(cls.matrix_reductions(cls.rows_matrix([values[i] for i in group]),
                                                   passes), axis=1)
                   for group in stacked]
        rows = blocks[0] if len(blocks) == 1 else cls.concat(blocks)
        order = alone + [index for group in stacked for index in group]
        return rows if order == sorted(order) else cls.take_rows(rows, np.argsort(order))

    @classmethod
    def _rows_of_arrays_alone(cls, arrays, passes):
        found = [cls.array_reductions(a, passes) for a in arrays]
        counts = cls.constant(np.array([cls.static_size(a) for a in arrays], dtype=np.float64),
                              next(iter(found[0].values())))
        column = {"count": counts}
        for name in passes:
            if name == "zeros":  # one subtraction for all arrays, not a scalar operation each
                column[name] = counts - cls.stack([f["nonzeros"] for f in found])
            elif name != "count":
                column[name] = cls.stack([f[name] for f in found])
        return cls.stack([column[name] for name in passes], axis=1)

    @classmethod
    def array_reductions(cls, array, passes):
        """``{reduction: scalar}``: the `MATRIX_REDUCTIONS` named in ``passes`` of one non-empty
        array of any shape (not flattened: a JAX array sharded over a mesh would be gathered),
        but the count, and instead of the zero count "nonzeros" (`pass_rows`
        subtracts them from the counts for all arrays at once); the deviations' squares
        two-pass, as `_matrix_reductions`. An adapter with fused kernels overrides this."""
        like = cls.constant(0, array)
        found = {}
        if "sum" in passes:
            found["sum"] = cls.sum(array)
        if "min" in passes:
            found["min"] = cls.min(array, initial=cls.constant(np.inf, like))
        if "max" in passes:
            found["max"] = cls.max(array, initial=cls.constant(-np.inf, like))
        if "m2" in passes:
            found["m2"] = cls.square_sum(array - found["sum"] / cls.static_size(array))
        if "sum_abs" in passes:
            found["sum_abs"] = cls.sum(cls.abs(array))
        if "zeros" in passes:
            found["nonzeros"] = cls.nonzero_count(array)
        if "sum_squares" in passes:
            found["sum_squares"] = cls.square_sum(array)
        return found

    @classmethod
    def square_sum(cls, array):
        """The sum of the squares of all entries (an adapter with a fused kernel overrides)."""
        return cls.sum(array * array)

    @classmethod
    def nonzero_count(cls, array):
        """The entries that are not 0, in the array's dtype (NaN ones may count either way: the
        fast pass is then rejected anyway)."""
        return cls.count(array != cls.constant(0, array), like=array)

    @classmethod
    def matrix_reductions(cls, matrix, passes):
        """The `MATRIX_REDUCTIONS` named in ``passes`` (in that order) of each row of a ``[k, n]``
        matrix, each a ``[k]`` vector (see `_matrix_reductions`); an adapter with fused kernels
        for some of them overrides this."""
        return _matrix_reductions(cls, matrix, passes)

    @classmethod
    def sum_of_squares(cls, matrix, axes):
        """The sum of squared entries over ``axes`` (an adapter with a fused kernel overrides)."""
        return cls.sum(matrix * matrix, axis=axes)

    @classmethod
    def zero_count(cls, matrix, axes, like):
        """Entries exactly 0 over ``axes``, as ``like``'s dtype; NaN where an entry is NaN is
        allowed (the fast pass is then rejected anyway)."""
        return cls.count(matrix == like, like=like, axis=axes)

    @staticmethod
    def indicator(mask, like):
        """``mask`` as 0 and 1 that add to the integers ``like``: the booleans themselves in
        numpy, PyTorch and JAX, which add them as they are (a `where` on PyTorch's CPU costs
        twice the addition: 80 us for 65k entries)."""
        return mask

    @classmethod
    def square_sums(cls, arrays):
        """``[len(arrays)]``: the plain sum of squares of each array (NaN/Inf propagate)."""
        return cls.grouped_rows(arrays, lambda matrix: cls.stack([cls.sum_of_squares(
            matrix, tuple(range(1, len(matrix.shape))))], axis=1))[:, 0]


class NumpyOps(ArrayOps):
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
    static_size = staticmethod(lambda x: np.size(x))
    reshape = staticmethod(np.reshape)
    concat = staticmethod(np.concatenate)
    take_rows = staticmethod(lambda matrix, indices: matrix[indices])
    sum = staticmethod(lambda x, axis=None: np.sum(x, axis=axis, dtype=x.dtype))
    count = staticmethod(
        lambda mask, like, axis=None: np.asarray(np.count_nonzero(mask, axis=axis), like.dtype))
    max = staticmethod(lambda x, initial, axis=None: np.max(x, axis=axis, initial=initial))
    min = staticmethod(lambda x, initial, axis=None: np.min(x, axis=axis, initial=initial))
    abs = staticmethod(np.abs)
    sqrt = staticmethod(np.sqrt)
    isnan = staticmethod(np.isnan)
    isfinite = staticmethod(np.isfinite)
    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    shift_right = staticmethod(np.right_shift)
    gather = staticmethod(lambda table, indices: table[indices])
    take_columns = staticmethod(lambda matrix, indices: matrix[:, indices])

    @staticmethod
    def magnitude_bits(x):
        """The bits of ``|x|`` as a signed integer of x's width (`histogram_rows`)."""
        integer = np.dtype(f"int{x.dtype.itemsize * 8}")
        return np.ascontiguousarray(x).view(integer) & np.iinfo(integer).max

    all = staticmethod(np.all)

    @staticmethod
    def cond(predicate, true_fn, false_fn):
        return true_fn() if predicate else false_fn()

    @staticmethod
    def bincount(indices, length, like):
        counts = np.bincount(indices.reshape(-1).astype(np.int64), minlength=length)
        return counts.astype(like.dtype)

    @staticmethod
    def stack(values, axis=0):
        return np.stack(values, axis=axis)


# Per-variable reductions (one small vector each) that `_finalize` turns into the stats of all
# variables at once: a few big reductions per variable, the arithmetic on [variables] vectors.
# Found by name (`stack_reductions`, `_column`), never by position: an adapter with its own fast
# path (PyTorch) names each one it computes.
REDUCTIONS = (
    "present",  # entries given (the dense size minus a sparse gradient's absent rows)
    "nan",  # NaN entries
    "finite",  # finite entries
    "abs_max",  # largest finite |entry|
    "sum",  # the sums below are of entries / abs_max (`scaled_sums`): no overflow
    "sum_squares",
    "sum_abs",
    "min",
    "max",
    "zeros",  # entries exactly 0
    "m2",  # sum of squared deviations from the mean (two-pass; see the module)
)
_REDUCTION_INDEX = {name: index for index, name in enumerate(REDUCTIONS)}
# Sums that overflow or turn NaN when an entry is not finite: the fast pass is trusted only when
# all of these are finite.
_CHECKED_REDUCTIONS = ("abs_max", "sum", "sum_squares", "sum_abs", "m2")


def stack_reductions(ops, axis=0, **reductions):
    """The `REDUCTIONS`, given by name, stacked in their order: one vector (``axis=0``, values of
    one variable) or a ``[variables, reductions]`` matrix (``axis=1``, vectors over variables)."""
    if set(reductions) != set(REDUCTIONS):
        raise ValueError(f"reductions {sorted(reductions)} are not {sorted(REDUCTIONS)}")
    return ops.stack([reductions[name] for name in REDUCTIONS], axis=axis)


def _column(reductions, name):
    """``[variables]``: one reduction of a ``[variables, reductions]`` matrix."""
    return reductions[:, _REDUCTION_INDEX[name]]


# The reductions of the fast pass, one ``[k]`` vector each per group (`_matrix_reductions`): the
# entry count, then one pass over the entries each. `passes_for` picks the ones the logged stats
# need; `_fast_reductions` derives the rest once for all arrays.
MATRIX_REDUCTIONS = ("count", "sum", "min", "max", "m2", "sum_abs", "zeros", "sum_squares")


@functools.lru_cache(maxsize=None)
def passes_for(gradient_stats=columns.GRADIENT_STATS):
    """The `MATRIX_REDUCTIONS` that compute the gradient stats ``gradient_stats`` (a tuple of
    names; `columns.REQUIRED_STATS` always): the count and each stat's ``passes`` in its
    `columns` row, in `MATRIX_REDUCTIONS` order.

    All stats take six passes (sum, min, max, M2, |x|, zeros): the sum of squares is then
    ``M2 + sum * mean`` (`_fast_reductions`). The required stats alone take three (squares, min,
    max; min and max are one kernel in PyTorch), the cheapest set that is still exact: a finite
    sum of squares proves that no entry was NaN or Inf, and abs_max is the larger of -min and
    max.
    """
    stats = set(gradient_stats) | set(columns.REQUIRED_STATS)
    wanted = {"count"} | {p for s in stats for p in columns.BY_NAME[s].passes}
    if "m2" in wanted:
        wanted.discard("sum_squares")
    return tuple(r for r in MATRIX_REDUCTIONS if r in wanted)


def _matrix_reductions(ops, matrix, passes):
    """The `MATRIX_REDUCTIONS` named in ``passes`` of each row of a ``[k, n]`` matrix (k arrays
    of n entries, or one array with a leading axis), in that order: sum, min, max, the deviations
    from the mean (two-pass M2), |x|, the zero count, squares. No masking or scaling:
    any NaN/Inf entry or overflowing sum shows up as a non-finite result, which
    `checked_fast_rows` checks."""
    rows = matrix.shape[0]
    axes = tuple(range(1, len(matrix.shape)))  # a [1, ...] array reduces over its own axes
    like = ops.constant(0, matrix)
    infinity = ops.constant(np.inf, like)
    count = ops.numel(matrix) / rows + ops.constant(np.zeros(rows), like)
    found = {"count": count}
    if "sum" in passes:
        found["sum"] = ops.sum(matrix, axis=axes)
    if "min" in passes:
        found["min"] = ops.min(matrix, initial=infinity, axis=axes)
    if "max" in passes:
        found["max"] = ops.max(matrix, initial=-infinity, axis=axes)
    if "m2" in passes:
        mean = found["sum"] / ops.maximum(count, ops.constant(1, like))
        found["m2"] = ops.sum_of_squares(
            matrix - ops.reshape(mean, (rows,) + (1,) * len(axes)), axes)
    if "sum_abs" in passes:
        found["sum_abs"] = ops.sum(ops.abs(matrix), axis=axes)
    if "zeros" in passes:
        found["zeros"] = ops.zero_count(matrix, axes, like)
    if "sum_squares" in passes:
        found["sum_squares"] = ops.sum_of_squares(matrix, axes)
    return tuple(found[name] for name in passes)


def _fast_reductions(ops, raw, passes):
    """``[arrays, REDUCTIONS]`` from the ``[arrays, passes]`` of `_matrix_reductions`, for the
    common step where every entry is finite; sums unscaled (`scaled_sums` divides them).
    Reductions no stat asked for (not in ``passes``) are 0: finite, and never logged.

    ``abs_max`` comes from min and max and, without its own pass, the sum of squares from the
    two-pass M2 as ``M2 + sum * mean``: two non-negative terms, so no cancellation (the second's
    rounding error is at most ~2x the sum's relative error times the whole, by Cauchy-Schwarz
    ``|sum| <= sqrt(n * sum_squares)``), and one pass fewer than squaring the entries again.
    """
    column = dict(zip(passes, (raw[:, i] for i in range(len(passes)))))
    count = column["count"]
    zero = ops.constant(0, count)
    not_computed = zero * count
    total = column.get("sum", not_computed)
    mean = total / ops.maximum(count, ops.constant(1, count))
    m2 = column.get("m2", not_computed)
    minimum, maximum = column["min"], column["max"]  # required: always computed
    return stack_reductions(
        ops,
        axis=1,
        present=count,
        nan=not_computed,  # counted by the masked pass only
        finite=count,
        abs_max=ops.maximum(ops.maximum(-minimum, maximum), zero),  # empty rows: 0
        sum=total,
        sum_squares=column["sum_squares"] if "sum_squares" in column else m2 + total * mean,
        sum_abs=column.get("sum_abs", not_computed),
        min=minimum,
        max=maximum,
        zeros=column.get("zeros", not_computed),
        m2=m2,
    )


def scaled_sums(ops, reductions):
    """Divides the sum columns of `_fast_reductions` rows by each variable's abs_max."""
    by_name = {name: _column(reductions, name) for name in REDUCTIONS}
    abs_max = by_name["abs_max"]
    scale = ops.where(abs_max > ops.constant(0, abs_max), abs_max, ops.constant(1, abs_max))
    by_name["sum"] = by_name["sum"] / scale
    by_name["sum_squares"] = by_name["sum_squares"] / scale / scale
    by_name["sum_abs"] = by_name["sum_abs"] / scale
    by_name["m2"] = by_name["m2"] / scale / scale
    return stack_reductions(ops, axis=1, **by_name)


def _masked_reductions(ops, values):
    """Reductions over the finite entries, sums of values / abs_max: correct for any input."""
    like = ops.constant(0, values)
    finite = ops.isfinite(values)
    x = ops.where(finite, values, like)
    abs_max = ops.max(ops.abs(x), initial=like)
    # Multiplied twice by 1/sqrt(abs_max), not divided by abs_max: XLA (JAX, TF's jit) divides
    # by multiplying with the reciprocal, and 1/3e38 is subnormal, which XLA flushes to zero
    # (it would also fold two divisions into one); 1/sqrt(3e38) = 6e-20 is a normal float.
    inverse_root = ops.constant(1, like) / ops.sqrt(
        ops.where(abs_max > like, abs_max, ops.constant(1, like)))
    scaled = x * inverse_root * inverse_root
    infinity = ops.constant(np.inf, like)
    finite_count = ops.count(finite, like=like)
    total = ops.sum(scaled)
    deviations = ops.where(finite, scaled - total / ops.maximum(finite_count, ops.constant(1, like)), like)
    return stack_reductions(
        ops,
        present=ops.numel(values),
        nan=ops.count(ops.isnan(values), like=like),
        finite=finite_count,
        abs_max=abs_max,
        sum=total,
        sum_squares=ops.sum(scaled * scaled),
        sum_abs=ops.sum(ops.abs(scaled)),
        min=ops.min(ops.where(finite, values, infinity), initial=infinity),
        max=ops.max(ops.where(finite, values, -infinity), initial=-infinity),
        zeros=ops.count(values == like, like=like),
        m2=ops.sum(deviations * deviations),
    )


def _finalize(ops, reductions, sizes):
    """The `columns.GRADIENT_STATS` by name, each a ``[variables]`` vector, from the
    ``[variables, REDUCTIONS]`` matrix and the dense sizes."""
    column = lambda name: _column(reductions, name)  # noqa: E731
    zero = ops.constant(0, sizes)
    one = ops.constant(1, sizes)
    nan = ops.constant(np.nan, sizes)
    abs_max = column("abs_max")
    scale = ops.where(abs_max > zero, abs_max, one)
    nan_count = column("nan")
    inf_count = column("present") - column("finite") - nan_count
    implicit_zeros = sizes - column("present")  # absent rows of a sparse gradient
    finite_count = column("finite") + implicit_zeros
    divisor = ops.maximum(finite_count, one)
    mean_scaled = column("sum") / divisor
    # The absent entries of a sparse gradient are a second group: count Z, mean 0, M2 0.
    _, _, m2_scaled = combine_moments(
        ops,
        (column("finite"), column("sum") / ops.maximum(column("finite"), one), column("m2")),
        (implicit_zeros, zero, zero),
    )
    variance_scaled = m2_scaled / divisor
    has_implicit_zeros = implicit_zeros > zero
    minimum = ops.where(has_implicit_zeros, ops.minimum(column("min"), zero), column("min"))
    maximum = ops.where(has_implicit_zeros, ops.maximum(column("max"), zero), column("max"))
    no_finite = finite_count <= zero
    undefined_without_finite = lambda value: ops.where(no_finite, nan, value)  # noqa: E731
    stats = {
        "l2_norm": scale * ops.sqrt(column("sum_squares")),  # an empty sum is 0
        "mean": undefined_without_finite(scale * mean_scaled),
        "std": undefined_without_finite(scale * ops.sqrt(variance_scaled)),
        "min": undefined_without_finite(minimum),
        "max": undefined_without_finite(maximum),
        "abs_max": undefined_without_finite(abs_max),
        "mean_abs": undefined_without_finite(scale * (column("sum_abs") / divisor)),  # no overflow
        "zero_fraction": ops.where(
            sizes > zero, (column("zeros") + implicit_zeros) / ops.maximum(sizes, one), nan),
        "nan_count": nan_count,
        "inf_count": inf_count,
        "size": sizes,
    }
    return stats


def combine_moments(ops, first, second):
    """``(count, mean, M2)`` of the union of two groups, each given as ``(count, mean, M2)``.

    M2 is the sum of squared deviations from the group's mean. The parallel-variance formula
    (Chan, Golub & LeVeque 1979): ``M2 = M2_a + M2_b + (mean_b - mean_a)^2 * n_a * n_b / n``;
    no difference of large sums, so it stays exact to rounding when ``|mean| >> std``. Empty
    groups (count 0) contribute nothing. Works elementwise on arrays of groups.
    """
    count_a, mean_a, m2_a = first
    count_b, mean_b, m2_b = second
    count = count_a + count_b
    divisor = ops.maximum(count, ops.constant(1, count))
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / divisor)
    return count, mean, m2_a + m2_b + delta * delta * (count_a / divisor) * count_b


def statistics_matrix(ops, gradients, weights, dtype, gradient_stats=columns.GRADIENT_STATS):
    """The ``[variables, stats]`` matrix of one step, columns `columns.stats_for` (no update).

    Args:
      ops: the array library adapter (`NumpyOps`, the TensorFlow one, ...).
      gradients: per variable, None (missing: a row of NaN, see `format.metadata`) or a pair
        ``(present values, dense size)`` with values in `dtype`; the dense size exceeds the
        present entries for a sparse gradient, whose absent entries are exact zeros.
      weights: per variable values in `dtype` for the `weight_l2_norm` column, or None.
        Unlike the gradient stats, the weight norm is over all entries: corrupted weights show.
      dtype: the computation dtype (`ArrayOps.computation_dtype`).
      gradient_stats: the gradient stats to compute and return (`columns.gradient_stats`).
    """
    reductions, sizes = reduction_matrix(ops, gradients, dtype, gradient_stats)
    # Plain norms: NaN/Inf weights make them NaN/Inf, which is the news to report.
    weight_norms = ops.sqrt(ops.square_sums(weights)) if weights else None
    return statistics_from_reductions(ops, reductions, sizes, weight_norms, gradient_stats)


def reduction_matrix(ops, gradients, dtype, gradient_stats=columns.GRADIENT_STATS):
    """``([variables, REDUCTIONS], [variables] dense sizes)`` of one step (`statistics_matrix`'s
    arguments): the per-variable partial results, sums scaled by the row's ``abs_max`` (by 1 when
    it is 0). Rows of the shards of one variable combine with `combine_shards`."""
    passes, sizes = pass_matrix(ops, gradients, dtype, gradient_stats)
    rows = fast_reductions(ops, passes, gradient_stats)
    scaled, trusted = checked_fast_rows(ops, rows, sizes, dtype, gradient_stats)
    # The masked pass runs only on steps with NaN/Inf, overflow or underflow: the rare ones.
    return ops.cond(trusted, lambda: scaled,
                    lambda: masked_reduction_matrix(ops, gradients, dtype)), sizes


def pass_matrix(ops, gradients, dtype, gradient_stats=columns.GRADIENT_STATS):
    """``([variables, passes], [variables] dense sizes)``: the `MATRIX_REDUCTIONS` that
    ``gradient_stats`` need (`passes_for`) of every variable, a NaN row for a missing gradient:
    all the work over the entries. `fast_reductions` derives the rest from this small matrix,
    on the device or, for a caller that copies it to the host anyway (the PyTorch monitor:
    one copy, no host sync deciding the masked pass on the device), there."""
    like = ops.to_float(0, dtype)
    given = [np.nan if g is None else g[1] for g in gradients]
    if _known_when_traced(given):
        sizes = ops.constant(np.array(given, dtype=np.float64), like)  # one constant, not one each
    else:  # sizes only known when the step runs (TensorFlow's sparse gradients)
        sizes = ops.stack([ops.constant(size, like) for size in given])
    passes = passes_for(tuple(gradient_stats))
    missing = ops.reshape(ops.stack([ops.constant(np.nan, like)] * len(passes)), (1, -1))
    return _rows_in_order(ops, gradients, lambda values: ops.pass_rows(values, passes),
                          missing), sizes


def fast_reductions(ops, passes, gradient_stats=columns.GRADIENT_STATS):
    """``[variables, REDUCTIONS]`` (sums unscaled) from a `pass_matrix` of ``gradient_stats``,
    to be scaled and trusted only where `checked_fast_rows` says so."""
    return _fast_reductions(ops, passes, passes_for(tuple(gradient_stats)))


def checked_fast_rows(ops, rows, sizes, dtype, gradient_stats=columns.GRADIENT_STATS):
    """``(scaled rows, trusted)``: `fast_reductions` rows (of ``gradient_stats``) computed
    in ``dtype`` with their sums scaled (`scaled_sums`), and whether they are exact to rounding:
    no non-finite or overflowing sum, no lost squares (`_no_square_underflows`); missing rows
    aside."""
    scaled = scaled_sums(ops, rows)
    checked = ops.stack([_column(scaled, name) for name in _CHECKED_REDUCTIONS], axis=1)
    deviations = "m2" in passes_for(tuple(gradient_stats))
    return scaled, ops.all(
        (ops.all(ops.isfinite(checked), axis=1)
         & _no_square_underflows(ops, rows, dtype, deviations))
        | ops.isnan(sizes))


def masked_reduction_matrix(ops, gradients, dtype):
    """The `reduction_matrix` rows by the masked pass, one variable at a time: right for any
    input (NaN/Inf entries, sums that would overflow or underflow)."""
    missing_row = _missing_row(ops, ops.to_float(0, dtype))
    return ops.stack([missing_row if g is None else _masked_reductions(ops, g[0])
                      for g in gradients])


def _missing_row(ops, like):
    """The `REDUCTIONS` row of a variable without a gradient: all NaN."""
    return ops.stack([ops.constant(np.nan, like)] * len(REDUCTIONS))


def _no_square_underflows(ops, rows, dtype, deviations=True):
    """``[variables]``: whether the unscaled squares of `_fast_reductions` lost nothing.

    Squares of entries under ~1e-19 (float32) underflow to subnormals, which TensorFlow, XLA and
    GPUs flush to zero, and under ~1e-23 to zero everywhere: a vanishing gradient would read as
    an exact 0. The n squares of a sum lose less than ``n * tiny`` (tiny: the smallest normal
    float) in all, which is below the sum's own rounding (``u``, unit roundoff, times the sum)
    when the sum is at least ``n * tiny / u``: checked for the sum of squares (unless every entry
    is 0: abs_max 0) and, when ``deviations`` (the M2 pass ran), for M2 (unless all entries are
    equal: min == max, M2 truly 0). The other rows take the masked pass, which scales by abs_max
    first.
    """
    info = np.finfo(numpy_float(dtype))
    column = lambda name: _column(rows, name)  # noqa: E731
    zero = ops.constant(0, column("m2"))
    least_sum = column("present") * ops.constant(info.tiny / (info.eps / 2), zero)
    kept = (column("sum_squares") >= least_sum) | (column("abs_max") == zero)
    if deviations:
        kept = kept & ((column("m2") >= least_sum) | (column("min") == column("max")))
    return kept


def statistics_from_reductions(ops, reductions, sizes, weight_norms=None,
                               gradient_stats=columns.GRADIENT_STATS):
    """The ``[variables, stats]`` matrix from `reduction_matrix` rows (or `combine_shards`'),
    the dense sizes and, when known, each variable's weight norm; gradient columns
    ``gradient_stats``."""
    stats = _finalize(ops, reductions, sizes)
    if weight_norms is not None:
        nan = ops.constant(np.nan, sizes)
        stats["weight_l2_norm"] = ops.where(sizes == sizes, weight_norms, nan)  # missing: all NaN
    names = columns.stats_for(weight_norms is not None, False, gradient_stats)
    return ops.stack([stats[name] for name in names], axis=1)


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
    column = lambda name: parts[..., _REDUCTION_INDEX[name]]  # noqa: E731
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


# Histogram counts by bit pattern, exact for any float: for a non-negative IEEE float the integer
# with the same bits grows with the value, so ``|x| >= edge`` is ``bits(|x|) >= bits(edge)`` with
# each edge rounded up to the dtype (the smallest float at or above the format's ``10**e``, which
# is how `columns` defines a bin). The top bits of a magnitude (its exponent and
# `_HISTOGRAM_KEY_BITS` mantissa bits: 1/8 of a binary octave) index two small tables: the bin
# where that range starts, and the one edge inside it if any (a half decade spans 1.66 octaves, so
# a range never holds two); one comparison settles the rest. Zero, subnormals (which a CPU that
# flushes them to zero, as TensorFlow's does, would call zero), above, Inf and NaN are ranges of
# bit patterns too. The log10 formula this replaces put values within a rounding of an edge in
# the neighbouring bin, and cost about three times as many passes.
_HISTOGRAM_KEY_BITS = 3


def numpy_float(dtype):
    """np.float64 or np.float32 for a computation dtype of any adapter (each library names its
    float64 its own way; every adapter computes in one of the two)."""
    return np.float64 if "64" in str(dtype) else np.float32


@functools.lru_cache(maxsize=None)
def histogram_bit_tables(float_dtype):
    """``(key shift, first bin, edge)`` for magnitudes of ``float_dtype`` (np.float32/float64):
    a magnitude with bits ``b`` falls in internal bin ``first_bin[k] + (b >= edge[k])`` with
    ``k = b >> key_shift``. Internal bins are the `columns` bins with Inf before NaN (the bits'
    order); `_COLUMN_OF_INTERNAL_BIN` puts them in column order."""
    info = np.finfo(float_dtype)
    int_dtype = np.dtype(f"int{info.bits}")
    key_shift = info.nmant - _HISTOGRAM_KEY_BITS
    edges = 10.0 ** np.array(columns.HISTOGRAM_LOG10_EDGES)
    rounded = edges.astype(float_dtype)
    rounded = np.where(rounded < edges, np.nextafter(rounded, float_dtype(np.inf)), rounded)
    infinity = int(np.array(np.inf, float_dtype).view(int_dtype))
    # A magnitude's internal bin is how many of these bit patterns are at or below its own:
    # (zero) smallest subnormal (below) 1e-20 ... 1e10 (above) Inf (inf) Inf + 1 (NaN).
    thresholds = np.array(
        [1, *rounded.view(int_dtype).tolist(), infinity, infinity + 1],
        dtype=np.int64)
    starts = np.arange(1 << (info.bits - 1 - key_shift), dtype=np.int64) << key_shift
    first_bin = np.searchsorted(thresholds, starts, side="right")
    inside = np.searchsorted(thresholds, starts + (1 << key_shift) - 1, side="right") - first_bin
    if inside.max() > 1:
        raise AssertionError("a key range holds two histogram edges: use more key bits")
    # A range without an edge gets its own start as one (always passed) and its bin minus one:
    # no sentinel pattern that a NaN's bits could reach.
    edge = np.where(inside > 0, thresholds[np.minimum(first_bin, len(thresholds) - 1)], starts)
    return key_shift, (first_bin - (inside == 0)).astype(int_dtype), edge.astype(int_dtype)


_COLUMN_OF_INTERNAL_BIN = np.arange(columns.HISTOGRAM_BINS)
_COLUMN_OF_INTERNAL_BIN[[columns.HIST_NAN, columns.HIST_INF]] = [columns.HIST_INF, columns.HIST_NAN]


def histogram_rows(ops, matrix):
    """``[k, HISTOGRAM_BINS]``: the counts of ``|x|`` of each row of a ``[k, ...]`` matrix (``k``
    arrays of one size, `ArrayOps.rows_matrix`) in the `columns` bins: one pass for the bits, two
    table lookups, one comparison and one count of the bin indices."""
    key_shift, first_bin, edge = histogram_bit_tables(numpy_float(matrix.dtype))
    bits = ops.magnitude_bits(matrix)
    keys = ops.shift_right(bits, key_shift)
    past_edge = bits >= ops.gather(ops.constant(edge, bits), keys)
    bins = ops.gather(ops.constant(first_bin, bits), keys) + ops.indicator(past_edge, bits)
    rows = matrix.shape[0]
    if rows > 1:  # each row counts into its own HISTOGRAM_BINS slots of one count
        offsets = np.arange(rows) * columns.HISTOGRAM_BINS
        bins = bins + ops.constant(
            np.reshape(offsets, (rows,) + (1,) * (len(matrix.shape) - 1)), bits)
    counts = ops.bincount(bins, rows * columns.HISTOGRAM_BINS, like=ops.constant(0, matrix))
    return ops.take_columns(ops.reshape(counts, (rows, columns.HISTOGRAM_BINS)),
                            _COLUMN_OF_INTERNAL_BIN)


def histogram_matrix(ops, gradients, dtype):
    """The ``[variables, HISTOGRAM_BINS]`` counts of one step (`statistics_matrix`'s
    ``gradients``; a missing gradient: all zero; a sparse gradient's absent entries: zeros)."""
    like = ops.to_float(0, dtype)
    implicit_zeros = _implicit_zeros(ops, [g for g in gradients if g is not None], like)
    zero_column = np.eye(1, columns.HISTOGRAM_BINS, columns.HIST_ZERO)

    def present_rows(values):
        counts = ops.grouped_rows(values, lambda matrix: histogram_rows(ops, matrix))
        if implicit_zeros is None:
            return counts
        return counts + ops.reshape(implicit_zeros, (-1, 1)) * ops.constant(zero_column, like)

    return _rows_in_order(ops, gradients, present_rows,
                          ops.constant(np.zeros((1, columns.HISTOGRAM_BINS)), like))


def _implicit_zeros(ops, entries, like):
    """``[len(entries)]``: each ``(values, dense size)`` entry's absent entries (a sparse
    gradient's), or None when no entry has any."""
    sizes = [size for _, size in entries]
    static = [ops.static_size(values) for values, _ in entries]
    if _known_when_traced(sizes + static):
        absent = np.subtract(sizes, static)
        return ops.constant(absent, like) if absent.any() else None
    return ops.stack([ops.constant(size, like) - ops.numel(values) for values, size in entries])


def _known_when_traced(numbers):
    """Whether every one of ``numbers`` is a plain number (a size known before the step runs),
    not a tensor (TensorFlow's sparse sizes) or None (an unknown static size)."""
    return all(isinstance(n, (int, float, np.number)) for n in numbers)


def _rows_in_order(ops, gradients, present_rows, missing_row):
    """One row per variable: ``present_rows(values)`` (``[len(values), C]`` for the given
    gradients' values, in order) with ``missing_row`` (``[1, C]``) where the gradient is None."""
    present = [g[0] for g in gradients if g is not None]
    if len(present) == len(gradients):
        return present_rows(present)
    if not present:
        return ops.concat([missing_row] * len(gradients))
    rows = ops.concat([present_rows(present), missing_row])
    next_present = iter(range(len(present)))
    return ops.take_rows(rows, [len(present) if g is None else next(next_present)
                                for g in gradients])
