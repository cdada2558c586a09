"""Window maths along the step axis of ``[steps, ...]`` arrays, with no knowledge of any rule.

Everything is vectorised over whole arrays (a 1,000-variable x 10,000-step run is 10 million
cells): no Python loop runs per cell or per step.
"""

import heapq

import numpy as np

# 1.4826 * MAD estimates the standard deviation of normally distributed data.
MAD_TO_SIGMA = 1.4826


def all_in_window(flags: np.ndarray, length: int) -> np.ndarray:
    """``out[t] = all(flags[t : t + length])`` along axis 0 (``length - 1`` shorter than flags).

    Doubling the covered span each pass: O(log length) boolean passes, no integer cumsums.
    """
    return _reduced_in_window(np.logical_and, flags, length)


def min_in_window(values: np.ndarray, length: int) -> np.ndarray:
    """``out[t] = min(values[t : t + length])`` along axis 0 (``length - 1`` shorter than
    values; NaN wins), in O(log length) passes as `all_in_window`."""
    return _reduced_in_window(np.minimum, values, length)


def _reduced_in_window(ufunc, values: np.ndarray, length: int) -> np.ndarray:
    """``ufunc`` (associative and idempotent: and, min, max) over each window of ``length``
    rows: windows overlap as the covered span doubles, which such a ufunc does not mind."""
    result, span = values, 1
    while span < length:
        shift = min(span, length - span)
        result = ufunc(result[:-shift], result[shift:])
        span += shift
    return result


def sustained(flags: np.ndarray, length: int) -> np.ndarray:
    """True where a cell lies in a run of at least ``length`` consecutive True along axis 0."""
    steps = flags.shape[0]
    if length <= 1:
        return flags.copy()
    if steps < length:
        return np.zeros_like(flags)
    run_starts = all_in_window(flags, length)
    padding = np.zeros((length - 1,) + flags.shape[1:], dtype=bool)
    # Cell t is covered when a full run starts in [t - length + 1, t].
    return ~all_in_window(~np.concatenate([padding, run_starts, padding]), length)


def sustained_on(flags: np.ndarray, rows: np.ndarray, length: int) -> np.ndarray:
    """`sustained` judged on the steps ``rows`` (``bool[steps]``) only, as if the others were not
    there: a run of ``length`` of those steps in a row; False at the other steps."""
    if rows.all():
        return sustained(flags, length)
    covered = np.zeros_like(flags)
    covered[rows] = sustained(flags[rows], length)
    return covered


def nanmedian(values: np.ndarray) -> np.ndarray:
    """Median over the last axis ignoring NaN (NaN where all are NaN).

    Sorting short rows is several times faster than `np.nanmedian` on these shapes.
    """
    ordered = np.sort(values, axis=-1)  # NaN sorts last
    count = np.sum(~np.isnan(ordered), axis=-1)
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[..., None], -1)[..., 0]
    high = np.take_along_axis(ordered, np.minimum(count // 2, ordered.shape[-1] - 1)[..., None], -1)
    return np.where(count > 0, (low + high[..., 0]) / 2, np.nan)


def forward_filled(blocks: np.ndarray) -> np.ndarray:
    """Each NaN entry along axis 0 replaced by the last non-NaN entry before it (NaN if none)."""
    positions = np.arange(len(blocks)).reshape((-1,) + (1,) * (blocks.ndim - 1))
    index = np.where(np.isnan(blocks), -1, positions)
    last = np.maximum.accumulate(index, axis=0)
    filled = np.take_along_axis(blocks, np.maximum(last, 0), axis=0)
    return np.where(last >= 0, filled, np.nan)


def robust_zscores(values: np.ndarray, window: int, min_sigma: float, exclude=None,
                   first_row: int = 0, start: int = 0, reference=None):
    """(robust z-score, excess over the running median, references) of each cell of
    ``[steps, ...]`` values.

    The reference of step t is the median and MAD of the latest complete block of ``window``
    steps before t's block that had usable cells (a blocked rolling median: O(cells), not
    O(cells x window)). ``exclude``d cells and NaN ones are not usable; a block with none is
    skipped, so the reference is then the last block before it that had some. The sigma is
    ``MAD_TO_SIGMA * MAD``, at least ``min_sigma``. NaN where there is no reference yet (always
    for the first ``window`` steps of a run). float32: the callers' log-norms need no more.

    Streaming (`analysis.stream`): ``values[0]`` is the run's logged step number ``first_row``,
    blocks start at row ``start`` (``first_row + start`` is a multiple of ``window``: blocks
    stay the run's), and ``reference`` is ``(median, mad, median, mad, ...)``: the reference of
    the block starting there, then those of the blocks before it, latest first (None: nothing
    yet). Rows before ``start`` are context, scored against their own blocks' references (NaN
    where none was given): a z-score never depends on how the run was cut into calls.

    ``references(block_start, blocks)``, the third result, gives that tuple for the block
    starting at the run's row ``block_start`` (a multiple of ``window``, at most the end of the
    last complete block) and ``blocks - 1`` blocks before it: what a later call continues from.
    """
    steps = values.shape[0]
    offset = start
    assert (first_row + start) % window == 0, "blocks must stay aligned to the run's"
    blocks = max(0, (steps - offset) // window)
    columns = values.shape[1:]
    unknown = np.full(columns, np.nan, np.float32)
    reference = tuple(reference or (unknown, unknown))
    usable = np.isfinite(values)
    if exclude is not None:
        usable &= ~exclude
    inside = slice(offset, offset + blocks * window)
    healthy = np.where(usable[inside], values[inside], np.float32(np.nan))
    # [blocks, ..., window]: each block's window contiguous for the sort.
    blocked = np.ascontiguousarray(
        healthy.reshape((blocks, window) + columns).swapaxes(1, -1)
    )
    median = nanmedian(blocked).astype(np.float32, copy=False)
    mad = nanmedian(np.abs(blocked - median[..., None])).astype(np.float32, copy=False)
    # chain[j]: the reference of the j-th block starting in `values` (the last usable block
    # before it, or the one given); chain[blocks]: of the steps after the last complete block.
    medians = np.concatenate([np.asarray(reference[0])[None], median])
    mads = np.concatenate([np.asarray(reference[1])[None], np.where(np.isnan(median), np.nan,
                                                                    mad)])
    chain_median, chain_mad = forward_filled(medians), forward_filled(mads)
    sigma = np.maximum(np.float32(MAD_TO_SIGMA) * chain_mad, np.float32(min_sigma))
    block_of_row = np.clip((np.arange(steps) - offset) // window, 0, blocks)
    excess = np.full(values.shape, np.nan, dtype=np.float32)
    z = np.full(values.shape, np.nan, dtype=np.float32)
    earlier = reference[2:]  # the context rows' blocks, latest first
    with np.errstate(invalid="ignore"):
        np.subtract(values[offset:], chain_median[block_of_row[offset:]], out=excess[offset:])
        z[offset:] = excess[offset:] / sigma[block_of_row[offset:]]
        for back in range(min(len(earlier) // 2, -(-offset // window))):
            rows = slice(max(0, offset - (back + 1) * window), offset - back * window)
            median_before, mad_before = earlier[2 * back], earlier[2 * back + 1]
            excess[rows] = values[rows] - median_before
            z[rows] = excess[rows] / np.maximum(np.float32(MAD_TO_SIGMA) * mad_before,
                                                np.float32(min_sigma))

    def references(block_start: int, blocks: int = 1):
        kept = []
        for back in range(blocks):
            index = (block_start - back * window - first_row - offset) // window
            if index >= 0:
                kept += [chain_median[index], chain_mad[index]]
            else:  # a block before this call's: its reference was given
                given = 2 * (-index - 1)
                kept += list(earlier[given:given + 2]) or [unknown, unknown]
        return tuple(kept)

    return z, excess, references


def trailing_medians(values: np.ndarray, length: int, rows=None) -> np.ndarray:
    """``out[t]`` = the median of the finite ``values[t - length : t]`` (1-D), NaN for the first
    ``length`` rows (no full history yet) and where none of them is finite: what each step is
    compared with when nothing after it may be known. ``rows`` (a bool mask): only those rows
    are computed (NaN elsewhere), in O(rows x length)."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full(len(values), np.nan)
    if len(values) <= length:
        return out
    wanted = np.arange(length, len(values))
    if rows is not None:
        wanted = wanted[np.asarray(rows)[length:]]
    history = np.lib.stride_tricks.sliding_window_view(
        np.where(np.isfinite(values), values, np.nan), length)
    out[wanted] = nanmedian(history[wanted - length])
    return out


def trailing_robust_sigmas(values: np.ndarray, length: int, rows) -> np.ndarray:
    """``out[t]`` = ``MAD_TO_SIGMA`` x the median absolute deviation of the finite
    ``values[t - length : t]`` from their median, at the ``rows`` (a bool mask) from row
    ``length`` on; NaN elsewhere."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full(len(values), np.nan)
    if len(values) <= length:
        return out
    wanted = np.arange(length, len(values))[np.asarray(rows)[length:]]
    history = np.lib.stride_tricks.sliding_window_view(
        np.where(np.isfinite(values), values, np.nan), length)[wanted - length]
    median = nanmedian(history)
    out[wanted] = MAD_TO_SIGMA * nanmedian(np.abs(history - median[:, None]))
    return out


def trailing_minima(values: np.ndarray, length: int) -> np.ndarray:
    """``out[t]`` = the least finite value of ``values[t - length : t]`` (1-D; +inf where none is
    finite or fewer than ``length`` rows precede), in O(rows x log length)."""
    values = np.asarray(values, dtype=np.float64)
    out = np.full(len(values), np.inf)
    if len(values) > length:
        finite = np.where(np.isfinite(values), values, np.inf)
        out[length:] = min_in_window(finite, length)[:len(values) - length]
    return out


def first_expanding_median(values: np.ndarray, holds, from_row: int = 0) -> int:
    """The first row ``k >= from_row`` where ``holds(median of the non-NaN values[:k + 1])``
    (``np.nanmedian``'s median: the mean of the two middle values of an even count); the last
    row when none. Two heaps, O(k log k): the median a stream reports after each step."""
    values = np.asarray(values)
    typed = values.dtype.type  # the mean of the middle two in the values' precision, as numpy
    low, high = [], []  # max-heap (negated) of the lower half, min-heap of the upper half
    for row, value in enumerate(values.tolist()):
        if value == value:  # not NaN
            if low and value > -low[0]:
                heapq.heappush(high, value)
            else:
                heapq.heappush(low, -value)
            if len(low) > len(high) + 1:
                heapq.heappush(high, -heapq.heappop(low))
            elif len(high) > len(low):
                heapq.heappush(low, -heapq.heappop(high))
        if row >= from_row and low:
            median = (-low[0] if len(low) > len(high)
                      else (typed(-low[0]) + typed(high[0])) / typed(2))
            if holds(median):
                return row
    return len(values) - 1
