"""The statistics' formulas: the per-variable reductions of one step and the stats made of them.

Written once over `array_ops.ArrayOps`, they run on numpy (TF-free writer), TensorFlow (summary
op, on device, inside `tf.function`), PyTorch and JAX (their monitors, on device). Keeping one
formula is what makes the writers agree to float tolerance. The common step takes the fast
path: only the passes the logged stats need (`passes_for`), all the work over the entries in
`pass_matrix`, the rest derived on the small matrix (`fast_reductions`) and trusted where
`checked_fast_rows` says so; the rare step with NaN/Inf, overflow or underflowing squares takes
the masked pass (`masked_reduction_matrix`).

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
import math

import numpy as np

from tensorboard_gradients.format import columns
from tensorboard_gradients.format.statistics.array_ops import (
    MATRIX_REDUCTIONS, known_when_traced, numpy_float, per_row, row_axes, row_counts,
    rows_in_order)


# Per-variable reductions (one small vector each) that `_finalize` turns into the stats of all
# variables at once: a few big reductions per variable, the arithmetic on [variables] vectors.
# Found by name (`stack_reductions`, `_column`), never by position: an adapter with its own fast
# path (PyTorch) names each one it computes. Shards of a variable combine them: `shards`.
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


def _fast_reductions(ops, raw, passes):
    """``[arrays, REDUCTIONS]`` from the ``[arrays, passes]`` of `array_ops.MATRIX_REDUCTIONS`, for the
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


def _masked_reductions(ops, matrix):
    """``[k, REDUCTIONS]``: the reductions of each row of a ``[k, n]`` matrix (or of a
    ``[1, ...]`` array, over its own axes) over its finite entries, sums of values / the row's
    abs_max: correct for any input."""
    axes = row_axes(matrix)
    like = ops.constant(0, matrix)
    finite = ops.isfinite(matrix)
    x = ops.where(finite, matrix, like)
    abs_max = ops.max(ops.abs(x), initial=like, axis=axes)
    # Multiplied twice by 1/sqrt(abs_max), not divided by abs_max: XLA (JAX, TF's jit) divides
    # by multiplying with the reciprocal, and 1/3e38 is subnormal, which XLA flushes to zero
    # (it would also fold two divisions into one); 1/sqrt(3e38) = 6e-20 is a normal float.
    inverse_root = per_row(ops, ops.constant(1, like) / ops.sqrt(
        ops.where(abs_max > like, abs_max, ops.constant(1, like))), matrix)
    scaled = x * inverse_root * inverse_root
    infinity = ops.constant(np.inf, like)
    finite_count = ops.count(finite, like=like, axis=axes)
    total = ops.sum(scaled, axis=axes)
    mean = per_row(ops, total / ops.maximum(finite_count, ops.constant(1, like)), matrix)
    deviations = ops.where(finite, scaled - mean, like)
    return stack_reductions(
        ops,
        axis=1,
        present=row_counts(ops, matrix, like),
        nan=ops.count(ops.isnan(matrix), like=like, axis=axes),
        finite=finite_count,
        abs_max=abs_max,
        sum=total,
        sum_squares=ops.sum(scaled * scaled, axis=axes),
        sum_abs=ops.sum(ops.abs(scaled), axis=axes),
        min=ops.min(ops.where(finite, matrix, infinity), initial=infinity, axis=axes),
        max=ops.max(ops.where(finite, matrix, -infinity), initial=-infinity, axis=axes),
        zeros=ops.count(matrix == like, like=like, axis=axes),
        m2=ops.sum(deviations * deviations, axis=axes),
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
    passes = pass_matrix(ops, gradients, dtype, gradient_stats)
    sizes = _dense_sizes(ops, gradients, ops.to_float(0, dtype))
    scaled, trusted = checked_fast_rows(ops, passes, sizes, dtype, gradient_stats)
    # The masked pass runs only on steps with NaN/Inf, overflow or underflow: the rare ones.
    return ops.cond(trusted, lambda: scaled,
                    lambda: masked_reduction_matrix(ops, gradients, dtype)), sizes


def pass_matrix(ops, gradients, dtype, gradient_stats=columns.GRADIENT_STATS):
    """``[variables, passes]``: the `MATRIX_REDUCTIONS` that ``gradient_stats`` need
    (`passes_for`) of every variable, a NaN row for a missing gradient: all the work over the
    entries. `fast_reductions` derives the rest from this small matrix, on the device or, for a
    caller that copies it to the host anyway (the PyTorch monitor: one copy, no host sync
    deciding the masked pass on the device), there. Nothing else: each array op is a dispatch
    on the PyTorch monitor's training thread, where the first ones after ``backward`` run with
    cold caches (the dense sizes and the NaN row took 0.1 ms there; benchmarks/NOTES.md, "The
    full steps' numpy in one batch")."""
    passes = passes_for(tuple(gradient_stats))
    return rows_in_order(
        ops, gradients, lambda values: ops.pass_rows(values, passes),
        lambda: ops.reshape(ops.stack([ops.to_float(np.nan, dtype)] * len(passes)), (1, -1)))


def _dense_sizes(ops, gradients, like):
    """``[variables]``: each gradient's dense size, NaN for a missing one."""
    given = [np.nan if g is None else g[1] for g in gradients]
    if known_when_traced(given):
        return ops.constant(np.array(given, dtype=np.float64), like)  # one constant, not one each
    # Sizes only known when the step runs (TensorFlow's sparse gradients).
    return ops.stack([ops.constant(size, like) for size in given])


def fast_reductions(ops, passes, gradient_stats=columns.GRADIENT_STATS):
    """``[variables, REDUCTIONS]`` (sums unscaled) from a `pass_matrix` of ``gradient_stats``,
    to be scaled and trusted only where `checked_fast_rows` says so."""
    return _fast_reductions(ops, passes, passes_for(tuple(gradient_stats)))


def checked_fast_rows(ops, passes, sizes, dtype, gradient_stats=columns.GRADIENT_STATS):
    """``(scaled rows, trusted)``: the `fast_reductions` of ``passes`` (a `pass_matrix` of
    ``gradient_stats`` computed in ``dtype``) with their sums scaled (`scaled_sums`), and
    whether they are exact to rounding: no non-finite or overflowing sum, no lost squares
    (`_no_square_underflows`); missing rows (NaN ``sizes``) aside."""
    rows = fast_reductions(ops, passes, gradient_stats)
    scaled = scaled_sums(ops, rows)
    checked = ops.stack([_column(scaled, name) for name in _CHECKED_REDUCTIONS], axis=1)
    deviations = "m2" in passes_for(tuple(gradient_stats))
    return scaled, ops.all(
        (ops.all(ops.isfinite(checked), axis=1)
         & _no_square_underflows(ops, rows, dtype, deviations))
        | ops.isnan(sizes))


def surely_trusted_passes(pass_rows, sizes, dtype, gradient_stats=columns.GRADIENT_STATS):
    """Whether `checked_fast_rows` is sure to trust the `fast_reductions` of ``pass_rows`` (a
    `pass_matrix` of ``gradient_stats`` in the numpy float ``dtype``, as Python lists;
    ``sizes``: None for a missing gradient), decided in Python floats: no numpy call, for the
    PyTorch monitor's training thread, where numpy's calls on a few dozen numbers run with
    cold caches right after ``backward`` (`capture.torch_statistics`). False is no verdict: the
    caller runs `checked_fast_rows`.

    The same arithmetic as the check, in float64 with room to spare, so that no rounding of the
    check's own (in ``dtype``) can turn a True. Every value the check tests finite is a pass,
    abs_max, the mean's part of the sum of squares, that sum, or one of them divided once or
    twice by the row's scale, so at most their magnitudes' sum ``M`` plus ``M / scale**2``:
    kept 16x below the dtype's largest float. The sums of squares it tests for underflow are
    kept at least twice the least it keeps (`_no_square_underflows`). A negative M2 (no real
    gradient has one) is no verdict: its sum with the mean's part could cancel. A test holds
    the implication on every kind of gradient and on random rows of any values."""
    (count_at, min_at, max_at, sum_at, m2_at, squares_at), largest, least_square = (
        _surely_trusted_constants(np.dtype(dtype), tuple(gradient_stats)))
    for row, size in zip(pass_rows, sizes):
        if size is None:
            continue
        count, low, high = row[count_at], row[min_at], row[max_at]
        m2 = 0.0 if m2_at is None else row[m2_at]
        if not m2 >= 0:  # NaN too
            return False
        total = 0.0 if sum_at is None else row[sum_at]
        mean_part = total * (total / max(count, 1.0))
        squares = m2 + mean_part if squares_at is None else row[squares_at]
        abs_max = max(-low, high, 0.0)
        scale = abs_max if abs_max > 0 else 1.0
        magnitudes = sum(map(abs, row)) + mean_part + abs(squares)
        if not magnitudes + magnitudes / scale / scale <= largest:  # NaN, Inf: False
            return False
        least = count * least_square
        if (abs_max > 0 and squares < least) or (m2_at is not None and m2 < least
                                                 and low != high):
            return False
    return True


@functools.lru_cache(maxsize=None)
def _surely_trusted_constants(dtype, gradient_stats):
    """`surely_trusted_passes`' columns (count, min, max, sum, M2, sum of squares: None where
    not a pass), its largest magnitude and its least sum of squares per entry."""
    passes = passes_for(gradient_stats)
    columns_at = tuple(passes.index(name) if name in passes else None
                       for name in ("count", "min", "max", "sum", "m2", "sum_squares"))
    return (columns_at, float(np.finfo(dtype).max) / 16,
            2 * _least_square(numpy_float(dtype)))


def masked_reduction_matrix(ops, gradients, dtype):
    """The `reduction_matrix` rows by the masked pass: right for any input (NaN/Inf entries,
    sums that would overflow or underflow). Gradients of one size, however large, are stacked
    and reduced as one matrix (`ArrayOps.grouped_rows`, groups of at most `GROUP_MAX_ENTRIES`
    entries): on this rare path a stack's copy costs little, while each reduction is an
    operation that TensorFlow traces on every step (its ``cond`` traces both branches). One
    variable at a time, ~30 operations each, this branch was half the Keras monitor's tracing
    (4.9 of 10.7 s of the demo MLP's first ``fit`` under a profiler; benchmarks/NOTES.md)."""
    return rows_in_order(
        ops, gradients,
        lambda values: ops.grouped_rows(values, lambda matrix: _masked_reductions(ops, matrix),
                                        largest_grouped=math.inf),
        lambda: ops.reshape(_missing_row(ops, ops.to_float(0, dtype)), (1, -1)))


def _missing_row(ops, like):
    """The `REDUCTIONS` row of a variable without a gradient: all NaN."""
    return ops.stack([ops.constant(np.nan, like)] * len(REDUCTIONS))


def _least_square(dtype) -> float:
    """``tiny / u`` of a numpy float ``dtype``: a sum of ``n`` squares at least ``n`` times this
    lost less than its own rounding to squares that underflowed (`_no_square_underflows`)."""
    info = np.finfo(dtype)
    return float(info.tiny / (info.eps / 2))


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
    column = lambda name: _column(rows, name)  # noqa: E731
    zero = ops.constant(0, column("m2"))
    least_sum = column("present") * ops.constant(_least_square(numpy_float(dtype)), zero)
    kept = (column("sum_squares") >= least_sum) | (column("abs_max") == zero)
    if deviations:
        kept = kept & ((column("m2") >= least_sum) | (column("min") == column("max")))
    return kept


def trusted_norms(norms, sizes):
    """``[variables]``: whether each plain L2 norm (``norms``, NaN for a missing gradient, in
    the gradients' dtype) gives its `norms_only_matrix` row exact to rounding, as
    `checked_fast_rows` trusts the fast pass: a finite norm proves no entry NaN or Inf, and a
    norm whose square is at least ``n * tiny / u`` lost no underflowing squares
    (`_no_square_underflows`); missing rows are trusted. Rows not trusted (a non-finite norm, a
    tiny or zero one) are for the caller to take from the masked pass, as the fast path does:
    rare, and one variable each."""
    norms = np.asarray(norms)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.isnan(sizes) | (np.isfinite(norms) & (norms >= least_trusted_norms(
            sizes, norms.dtype)))


def trusted_norm_floats(norms, least):
    """`trusted_norms` of Python floats, one comparison each and no numpy call: ``norms`` (None
    for a missing gradient: trusted) against ``least``, the `least_trusted_norms` of their sizes
    as a list. For the PyTorch monitor's norms-only step, where numpy's calls on a few dozen
    numbers run with cold caches right after ``backward`` (`capture.torch_statistics`); a test
    keeps the two equal on the edge values (NaN, Inf, 0, each side of the least)."""
    return [norm is None or low <= norm < math.inf  # NaN: False
            for norm, low in zip(norms, least)]


def least_trusted_norms(sizes, dtype):
    """``[variables]`` float64: the least norm `trusted_norms` trusts for a gradient of each
    dense size in ``dtype`` (a norm is trusted when finite and at least this)."""
    return np.sqrt(np.asarray(sizes, np.float64) * _least_square(np.dtype(dtype)))


def norms_only_matrix(norms, sizes, weight_norms=None, gradient_stats=columns.GRADIENT_STATS):
    """The matrix of a norms-only step (format 1.6), on the host: the
    `statistics_from_reductions` columns with `columns.EVERY_STEP_STATS` filled from each
    variable's plain L2 norm (``norms``, NaN for a missing gradient, computed in the gradients'
    dtype), 0 NaN and Inf entries, the dense ``sizes`` and the ``weight_norms``; every other
    column NaN. Exact where `trusted_norms`."""
    norms = np.asarray(norms)
    present = ~np.isnan(sizes)
    names = columns.stats_for(weight_norms is not None, False, gradient_stats)
    matrix = np.full((len(norms), len(names)), np.nan, dtype=norms.dtype)
    zeros = np.where(present, 0, np.nan)
    known = {"l2_norm": norms, "nan_count": zeros, "inf_count": zeros, "size": sizes,
             "weight_l2_norm": np.where(present, weight_norms, np.nan)
             if weight_norms is not None else None}
    for position, name in enumerate(names):
        if known.get(name) is not None:
            matrix[:, position] = known[name]
    return matrix


def norms_only_statistics(ops, gradients, weights, dtype, gradient_stats=columns.GRADIENT_STATS,
                          every_step=columns.EVERY_STEP_STATS):
    """A norms-only step's `statistics_matrix` (format 1.6; same arguments and columns, only
    ``every_step`` not NaN: the tag's `columns.every_step_stats`, the weight norms computed only
    when named there) over ``ops``, on the device, inside a traced step too:
    ONE pass per gradient (its sum of squares) where the other steps take three, trusted as
    `trusted_norms` trusts a norm (finite: no NaN or Inf entry; a square sum of at least
    ``n * tiny / u``: no square lost to underflow). A step with any norm not trusted (rare) takes
    the masked pass of every gradient, as `reduction_matrix` does."""
    like = ops.to_float(0, dtype)
    sizes = _dense_sizes(ops, gradients, like)
    nan = ops.constant(np.nan, like)
    present = [g[0] for g in gradients if g is not None]
    squares = ops.square_sums(present) if present else None  # one pass each, one call
    if len(present) < len(gradients):  # a missing gradient's row: NaN
        found = iter(range(len(present)))
        squares = ops.stack([nan if g is None else squares[next(found)] for g in gradients])
    least_sums = sizes * ops.constant(_least_square(numpy_float(dtype)), like)
    trusted = ops.all(ops.isnan(sizes) | (ops.isfinite(squares) & (squares >= least_sums)))
    names = columns.stats_for(weights is not None, False, gradient_stats)
    weight_norms = (ops.sqrt(ops.square_sums(weights))
                    if weights and "weight_l2_norm" in every_step else None)

    def from_norms():
        zeros = sizes * ops.constant(0, like)  # NaN for a missing gradient, as every column
        known = {"l2_norm": ops.sqrt(squares), "nan_count": zeros, "inf_count": zeros,
                 "size": sizes}
        if weight_norms is not None:
            known["weight_l2_norm"] = ops.where(sizes == sizes, weight_norms, sizes)
        return ops.stack([known.get(name, sizes * nan) for name in names], axis=1)

    def masked():
        computed = columns.stats_for(weight_norms is not None, False, gradient_stats)
        return norms_only_columns(ops, statistics_from_reductions(
            ops, masked_reduction_matrix(ops, gradients, dtype), sizes, weight_norms,
            gradient_stats), computed, names, every_step)

    return ops.cond(trusted, from_norms, masked)


def norms_only_columns(ops, matrix, computed, wanted, every_step):
    """A norms-only step's ``[variables, wanted]`` matrix (format 1.6) from a ``matrix`` of the
    stats ``computed`` (names; the cheapest set a writer computes that step, e.g. the
    `columns.REQUIRED_STATS`): each of ``every_step`` (the tag's `columns.every_step_stats`)
    in ``wanted`` from its column, every other one NaN. Over ``ops``: inside a traced step
    too."""
    first = matrix[:, 0]
    nan = first * ops.constant(np.nan, first)  # a NaN column in any array library
    return ops.stack([
        matrix[:, list(computed).index(name)] if name in every_step else nan
        for name in wanted], axis=1)


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
