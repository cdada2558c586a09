"""`ArrayOps`: the tiny adapter the statistics are written over, and its numpy implementation.

Each array library (numpy here, TensorFlow, PyTorch, JAX in `capture/`) names its elementwise
ops and reductions once; the work over the entries is written here once over them: the passes
of the fast path (`MATRIX_REDUCTIONS`, the ones the logged stats need), one reduction each for
a large array (`ArrayOps.array_reductions`, the results of all of them stacked once per pass),
small arrays of one size stacked and reduced as one matrix (`size_groups`), and one row per
variable in model order with missing gradients in place (`rows_in_order`). What the statistics
make of the passes is `formulas`; the histograms are `histograms`.
"""

import numpy as np


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


def size_groups(sizes, grouped=True, largest_grouped=None):
    """Index lists partitioning ``range(len(sizes))``: arrays of one static size up to
    ``largest_grouped`` entries (`GROUPED_ARRAY_MAX_ENTRIES` when None) share a group of at most
    `GROUP_MAX_ENTRIES` entries (first occurrence order); any other array (larger, of unknown
    size (None), empty, or all when ``grouped`` is false) is a group of its own."""
    largest = GROUPED_ARRAY_MAX_ENTRIES if largest_grouped is None else largest_grouped
    groups, open_group = [], {}
    for index, size in enumerate(sizes):
        if not grouped or size is None or size > largest or size == 0:
            groups.append([index])
            continue
        members = open_group.get(size)
        if members is None or (len(members) + 1) * size > GROUP_MAX_ENTRIES:
            members = open_group[size] = []
            groups.append(members)
        members.append(index)
    return groups


def entry_batches(sizes):
    """Index lists partitioning ``range(len(sizes))`` into runs of consecutive arrays of at most
    `GROUP_MAX_ENTRIES` entries in all (an array larger than that: a run of its own)."""
    batches, total = [], 0
    for index, size in enumerate(sizes):
        if not batches or total + size > GROUP_MAX_ENTRIES:
            batches.append([])
            total = 0
        batches[-1].append(index)
        total += size
    return batches


class ArrayOps:
    """Base of the array-library adapters: the elementwise ops and reductions are each library's
    own (see `NumpyOps`; reductions take an optional ``axis``); the grouped reductions below are
    written once over them. ``groups_arrays``: whether small arrays of one size are stacked and
    reduced together (`size_groups`); off where a compiler fuses every array's reductions anyway
    (JAX's jit), so a stack would only add a copy. ``joins_histograms``: whether the adapter
    counts the histograms of arrays of any sizes itself, joined (``joined_histograms``, eager
    PyTorch), instead of `histograms.histogram_rows` per `grouped_rows` group."""

    groups_arrays = True
    joins_histograms = False

    @classmethod
    def rows_matrix(cls, arrays):
        """``[k, n]``: ``k`` arrays of ``n`` entries each, one per row (a view for one array)."""
        if len(arrays) == 1:
            return cls.reshape(arrays[0], (1, -1))
        if len({tuple(a.shape) for a in arrays}) == 1:  # one reshape, not one per array
            return cls.reshape(cls.stack(arrays), (len(arrays), -1))
        return cls.stack([cls.reshape(a, (-1,)) for a in arrays])

    @classmethod
    def grouped_rows(cls, arrays, reduce_matrix, largest_grouped=None):
        """``[len(arrays), C]``: ``reduce_matrix`` (``[k, n]`` -> ``[k, C]``; a ``[1, ...]``
        array for one array of its own where the adapter keeps its shape) applied to every
        `size_groups` group of ``arrays`` (``largest_grouped``: theirs), rows in the order of
        ``arrays``."""
        groups = size_groups([cls.static_size(a) for a in arrays], cls.groups_arrays,
                             largest_grouped)
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


# The reductions of the fast pass, one ``[k]`` vector each per group (`_matrix_reductions`): the
# entry count, then one pass over the entries each. `formulas.passes_for` picks the ones the
# logged stats need; `formulas.fast_reductions` derives the rest once for all arrays.
MATRIX_REDUCTIONS = ("count", "sum", "min", "max", "m2", "sum_abs", "zeros", "sum_squares")


def row_axes(matrix):
    """The axes a row of a ``[k, ...]`` matrix reduces over (a ``[1, ...]`` array: its own)."""
    return tuple(range(1, len(matrix.shape)))


def row_counts(ops, matrix, like):
    """``[k]``: the entries of each row of a ``[k, ...]`` matrix, in ``like``'s dtype."""
    rows = matrix.shape[0]
    return ops.numel(matrix) / rows + ops.constant(np.zeros(rows), like)


def per_row(ops, vector, matrix):
    """A ``[k]`` vector shaped to broadcast over the ``[k, ...]`` ``matrix`` row by row."""
    return ops.reshape(vector, (matrix.shape[0],) + (1,) * len(row_axes(matrix)))


def _matrix_reductions(ops, matrix, passes):
    """The `MATRIX_REDUCTIONS` named in ``passes`` of each row of a ``[k, n]`` matrix (k arrays
    of n entries, or one array with a leading axis), in that order: sum, min, max, the deviations
    from the mean (two-pass M2), |x|, the zero count, squares. No masking or scaling:
    any NaN/Inf entry or overflowing sum shows up as a non-finite result, which
    `formulas.checked_fast_rows` checks."""
    axes = row_axes(matrix)
    like = ops.constant(0, matrix)
    infinity = ops.constant(np.inf, like)
    count = row_counts(ops, matrix, like)
    found = {"count": count}
    if "sum" in passes:
        found["sum"] = ops.sum(matrix, axis=axes)
    if "min" in passes:
        found["min"] = ops.min(matrix, initial=infinity, axis=axes)
    if "max" in passes:
        found["max"] = ops.max(matrix, initial=-infinity, axis=axes)
    if "m2" in passes:
        mean = found["sum"] / ops.maximum(count, ops.constant(1, like))
        found["m2"] = ops.sum_of_squares(matrix - per_row(ops, mean, matrix), axes)
    if "sum_abs" in passes:
        found["sum_abs"] = ops.sum(ops.abs(matrix), axis=axes)
    if "zeros" in passes:
        found["zeros"] = ops.zero_count(matrix, axes, like)
    if "sum_squares" in passes:
        found["sum_squares"] = ops.sum_of_squares(matrix, axes)
    return tuple(found[name] for name in passes)


def numpy_float(dtype):
    """np.float64 or np.float32 for a computation dtype of any adapter (each library names its
    float64 its own way; every adapter computes in one of the two)."""
    return np.float64 if "64" in str(dtype) else np.float32


def known_when_traced(numbers):
    """Whether every one of ``numbers`` is a plain number (a size known before the step runs),
    not a tensor (TensorFlow's sparse sizes) or None (an unknown static size)."""
    return all(isinstance(n, (int, float, np.number)) for n in numbers)


def rows_in_order(ops, gradients, present_rows, missing_row):
    """One row per variable: ``present_rows(values)`` (``[len(values), C]`` for the given
    gradients' values, in order) with ``missing_row()`` (``[1, C]``, made only when a gradient
    is None) where the gradient is None."""
    present = [g[0] for g in gradients if g is not None]
    if len(present) == len(gradients):
        return present_rows(present)
    if not present:
        return ops.concat([missing_row()] * len(gradients))
    rows = ops.concat([present_rows(present), missing_row()])
    next_present = iter(range(len(present)))
    return ops.take_rows(rows, [len(present) if g is None else next(next_present)
                                for g in gradients])
