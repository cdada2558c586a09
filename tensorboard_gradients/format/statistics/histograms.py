"""The log10|g| histograms of one step, counted from the entries' bit patterns.

The bins are `columns`' (half decades, zero, below, above, NaN, Inf); each adapter counts them
with its own `ArrayOps` in one pass over the entries (on TensorFlow without a GPU inside one
XLA-compiled function, `capture.tensorflow_ops`; eager PyTorch joins the arrays and reuses its
buffers, `TorchOps.joined_histograms`, with these tables).
"""

import functools

import numpy as np

from tensorboard_gradients.format import columns
from tensorboard_gradients.format.statistics.array_ops import (
    known_when_traced, numpy_float, rows_in_order)


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
        counts = (ops.take_columns(ops.joined_histograms(values, like), _COLUMN_OF_INTERNAL_BIN)
                  if ops.joins_histograms
                  else ops.grouped_rows(values, lambda matrix: histogram_rows(ops, matrix)))
        if implicit_zeros is None:
            return counts
        return counts + ops.reshape(implicit_zeros, (-1, 1)) * ops.constant(zero_column, like)

    return rows_in_order(ops, gradients, present_rows,
                          lambda: ops.constant(np.zeros((1, columns.HISTOGRAM_BINS)), like))


def _implicit_zeros(ops, entries, like):
    """``[len(entries)]``: each ``(values, dense size)`` entry's absent entries (a sparse
    gradient's), or None when no entry has any."""
    sizes = [size for _, size in entries]
    static = [ops.static_size(values) for values, _ in entries]
    if known_when_traced(sizes + static):
        absent = np.subtract(sizes, static)
        return ops.constant(absent, like) if absent.any() else None
    return ops.stack([ops.constant(size, like) - ops.numel(values) for values, size in entries])
