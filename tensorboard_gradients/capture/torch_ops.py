"""`TorchOps`: the `format.statistics` adapter for PyTorch, with the kernels it runs fast.

Shared by the PyTorch monitor (`capture.torch`) and the Keras recorder on the torch backend
(`capture.keras_torch`). Where PyTorch has a faster way to a pass than the generic one
(multi-tensor norms, `aminmax`, BLAS dot products on the CPU, histograms binned in place into
kept buffers), it overrides that pass; the measurements behind each choice are in
benchmarks/NOTES.md.
"""

import functools
import threading

import torch

from tensorboard_gradients.format import columns, statistics


class TorchOps(statistics.ArrayOps):
    """`statistics` adapter for PyTorch on one device (`ops_for` makes one per device)."""

    device = torch.device("cpu")

    @staticmethod
    def computation_dtype(dtypes):
        return torch.float64 if torch.float64 in dtypes else torch.float32

    @classmethod
    def to_float(cls, x, dtype):
        return torch.as_tensor(x, device=cls.device).to(dtype)

    @staticmethod
    def constant(value, like):
        return torch.as_tensor(value, dtype=like.dtype, device=like.device)

    numel = staticmethod(lambda x: torch.tensor(x.numel(), dtype=x.dtype, device=x.device))
    static_size = staticmethod(lambda x: x.numel())
    reshape = staticmethod(torch.reshape)
    concat = staticmethod(torch.cat)
    # The index made once per order (the same at every step): a tensor from Python numbers is a
    # host-to-device copy, and on the CPU a dispatch with cold caches (see `_counts`).
    take_rows = staticmethod(lambda matrix, indices: torch.index_select(
        matrix, 0, _indices(tuple(int(i) for i in indices), matrix.device)))
    sum = staticmethod(lambda x, axis=None: torch.sum(x) if axis is None else torch.sum(x, axis))
    count = staticmethod(lambda mask, like, axis=None: (
        mask.sum() if axis is None else mask.sum(axis)).to(like.dtype))

    @staticmethod
    def max(x, initial, axis=None):
        if axis is None:
            return torch.maximum(x.max(), initial) if x.numel() else initial
        if x.numel() == 0:  # amax has no empty case
            return initial.expand(x.shape[0])
        return torch.maximum(torch.amax(x, axis), initial)

    @staticmethod
    def min(x, initial, axis=None):
        if axis is None:
            return torch.minimum(x.min(), initial) if x.numel() else initial
        if x.numel() == 0:
            return initial.expand(x.shape[0])
        return torch.minimum(torch.amin(x, axis), initial)

    abs = staticmethod(torch.abs)
    sqrt = staticmethod(torch.sqrt)
    isnan = staticmethod(torch.isnan)
    isfinite = staticmethod(torch.isfinite)
    where = staticmethod(torch.where)
    maximum = staticmethod(torch.maximum)
    minimum = staticmethod(torch.minimum)
    all = staticmethod(torch.all)
    take_columns = staticmethod(lambda matrix, indices: matrix[:, indices])

    @staticmethod
    def cond(predicate, true_fn, false_fn):
        return true_fn() if bool(predicate) else false_fn()  # one host sync per logged step

    joins_histograms = True

    @staticmethod
    def joined_histograms(arrays, like):
        """``[len(arrays), HISTOGRAM_BINS]``: the counts of `statistics.histogram_rows`'
        internal bins of arrays of any sizes (one float dtype), in ``like``'s dtype: their
        entries joined in runs of at most `statistics.GROUP_MAX_ENTRIES`
        (`statistics.entry_batches`), each run binned in one pass (`_internal_bins`)."""
        sizes = [a.numel() for a in arrays]
        counts = []
        for batch in statistics.entry_batches(sizes):
            batch_sizes = [sizes[i] for i in batch]
            bins = _internal_bins([arrays[i] for i in batch], sum(batch_sizes))
            count = counts_per_run if bins.device.type == "cpu" else counts_with_offsets
            counts.append(count(bins, batch_sizes, columns.HISTOGRAM_BINS))
        return (counts[0] if len(counts) == 1 else torch.cat(counts)).to(like.dtype)

    @staticmethod
    def stack(values, axis=0):
        return torch.stack(list(values), dim=axis)

    @classmethod
    def matrix_reductions(cls, matrix, passes):
        # `statistics.array_ops._matrix_reductions` of a stack of small arrays (an array reduced alone
        # goes to `array_reductions`) with the kernels PyTorch's CPU build runs fast along a
        # dimension, measured on the benchmark MLP (benchmarks/NOTES.md "Overhead (issue 19)"):
        # `amin`/`amax` (aminmax along a dimension is 15x slower) and the zero count from the
        # signs of |g| (count_nonzero and boolean sums along a dimension are 4-8x slower).
        if matrix.numel() == 0:  # amin has no empty case; an empty shard is common (FSDP)
            return super().matrix_reductions(matrix, passes)
        rows, entries = matrix.shape
        on_cpu = matrix.device.type == "cpu"
        count = torch.full((rows,), float(entries), dtype=matrix.dtype, device=matrix.device)
        found = {"count": count}
        if "sum" in passes:
            found["sum"] = matrix.sum(1)
        for name, extreme in (("min", torch.amin), ("max", torch.amax)):
            if name in passes:
                found[name] = extreme(matrix, 1)
        if "m2" in passes:
            found["m2"] = (
                # the squares of the deviations from the mean (two-pass), 3x faster on CPU than
                # `torch.var`'s Welford pass; temporaries are cheap in host memory
                cls.sum_of_squares(matrix - (found["sum"] / count)[:, None], 1)
                if on_cpu else torch.var(matrix, dim=1, correction=0) * count)
        # Off the CPU: one kernel each, no gradient-sized temporary on the accelerator.
        magnitude = matrix.abs() if on_cpu and {"sum_abs", "zeros"} & set(passes) else None
        if "sum_abs" in passes:
            found["sum_abs"] = (magnitude.sum(1) if on_cpu
                                else torch.linalg.vector_norm(matrix, 1, dim=1))
        if "zeros" in passes:
            found["zeros"] = count - (magnitude.sign().sum(1) if on_cpu
                                      else torch.count_nonzero(matrix, dim=1).to(count.dtype))
        if "sum_squares" in passes:
            found["sum_squares"] = cls.sum_of_squares(matrix, 1)
        return tuple(found[name] for name in passes)

    @staticmethod
    def sum_of_squares(matrix, axes):
        return torch.linalg.vector_norm(matrix, dim=axes) ** 2  # no squared temporary

    @classmethod
    def pass_rows(cls, values, passes):
        if tuple(passes) == _REQUIRED_PASSES:
            return cls._required_pass_rows(values)
        return super().pass_rows(values, passes)

    @classmethod
    def _rows_of_arrays_alone(cls, arrays, passes):
        # `statistics.ArrayOps`' rows of the arrays reduced one by one, from ONE stack of all
        # their results (and the counts made once) where the generic one stacks them once per
        # pass: five dispatches for the rows instead of ten, each a few microseconds more with
        # the caches cold after `backward` (benchmarks/NOTES.md, "The full steps' numpy in one
        # batch").
        found = [cls.array_reductions(a, passes) for a in arrays]
        measured = [name for name in passes if name != "count"]
        keys = ["nonzeros" if name == "zeros" else name for name in measured]
        rows = torch.stack([f[key] for f in found for key in keys]).reshape(len(arrays), -1)
        counts = _counts(tuple(a.numel() for a in arrays), rows.dtype, rows.device)
        if "zeros" in measured:  # the rows are a new tensor: changed in place
            zeros = measured.index("zeros")
            rows[:, zeros] = counts - rows[:, zeros]
        return torch.cat([counts[:, None], rows], 1) if "count" in passes else rows

    @staticmethod
    def array_reductions(array, passes):
        """`statistics.ArrayOps.array_reductions`, a kernel each. On CPU: the deviations'
        squares, the sum of |x| and the nonzero count as BLAS dot products (sign(x).x and
        sign(x).sign(x): exact products, and the count an exact integer sum up to 2**24 entries
        in float32; 8 us each for 65k entries, where abs().sum() takes 31 us and
        count_nonzero 42)."""
        flat = array.reshape(-1)  # a view of a contiguous gradient
        on_cpu = flat.device.type == "cpu"
        entries = flat.numel()
        found = {}
        if "sum" in passes:
            found["sum"] = flat.sum()
        if "min" in passes or "max" in passes:
            found["min"], found["max"] = torch.aminmax(flat)
        if "m2" in passes:
            if on_cpu:  # two-pass (see `statistics`); 10x faster on CPU than torch.var's Welford
                deviations = torch.sub(flat, found["sum"], alpha=1 / entries,  # one kernel
                                       out=_scratch(entries, flat.dtype, flat.device, 0))
                found["m2"] = torch.dot(deviations, deviations)
            else:  # one kernel, no gradient-sized temporary on the accelerator
                found["m2"] = torch.var(flat, correction=0) * entries
        if {"sum_abs", "zeros"} & set(passes):
            exact_count = on_cpu and entries <= 2 / torch.finfo(flat.dtype).eps  # 2**24 in float32
            signs = (torch.sign(flat, out=_scratch(entries, flat.dtype, flat.device, 1))
                     if on_cpu else None)
            if "sum_abs" in passes:
                found["sum_abs"] = (torch.dot(signs, flat) if on_cpu
                                    else torch.linalg.vector_norm(flat, 1))
            if "zeros" in passes:
                found["nonzeros"] = (torch.dot(signs, signs) if exact_count
                                     else torch.count_nonzero(flat).to(flat.dtype))
        if "sum_squares" in passes:
            found["sum_squares"] = torch.dot(flat, flat)
        return found

    @classmethod
    def _required_pass_rows(cls, values):
        # The required stats alone (squares, min, max), stacked once: 0.4-0.5 ms for the
        # benchmark MLP's 28 gradients on CPU, against 1.0-1.1 ms through the grouped path,
        # whose fixed cost per group (a stack, a count, a concat) outweighs the passes there
        # (benchmarks/NOTES.md "stats="). On the CPU, each gradient's `aminmax` and then its
        # squares as a BLAS dot product while it is in the cache: 0.56 ms in the training loop
        # where one multi-tensor norm after all the `aminmax` took 0.64 (NOTES, "The full
        # steps' numpy in one batch"); elsewhere one multi-tensor norm, one kernel for all.
        like = values[0]
        sizes = tuple(v.numel() for v in values)
        on_cpu = like.device.type == "cpu"
        lows, highs, squares = [], [], []
        for v, size in zip(values, sizes):
            low, high = torch.aminmax(v) if size else _empty_extremes(like.dtype, like.device)
            lows.append(low)
            highs.append(high)
            if on_cpu:
                flat = v.reshape(-1)  # a view of a contiguous gradient
                squares.append(torch.dot(flat, flat))
        found = {
            "count": _counts(sizes, like.dtype, like.device),
            "min": torch.stack(lows),
            "max": torch.stack(highs),
            "sum_squares": (torch.stack(squares) if on_cpu
                            else torch.stack(torch._foreach_norm(values, 2)) ** 2),
        }
        return torch.stack([found[name] for name in _REQUIRED_PASSES], dim=1)

    @staticmethod
    def square_sums(arrays):
        return torch.stack(list(torch._foreach_norm(arrays, 2))) ** 2


_REQUIRED_PASSES = statistics.passes_for(columns.REQUIRED_STATS)


def _internal_bins(arrays, entries):
    """The internal histogram bin (`statistics.histogram_bit_tables`) of each of the
    ``entries`` of ``arrays`` (float32 or float64, one device) in order, as integers of their
    width: ``first_bin[k] + 1``, less one where the bits are below the key's edge (the sign bit
    of ``bits - edge[k]``, both under 2**(width-1): no overflow).

    Written into three buffers, in place, where the generic formula makes a new array per
    operation: in the benchmark MLP's training loop on a CPU (808k entries) a histogram step
    takes ~3.5 ms this way against ~7 ms by the generic grouping, most of that the first touch
    of fresh megabytes (page faults; benchmarks/NOTES.md, "The histograms joined")."""
    key_shift, first_bin_past_edge, edge = _bin_tables(arrays[0].dtype, arrays[0].device)
    integer = edge.dtype
    bits, keys, below = (_scratch(entries, integer, arrays[0].device, index)
                         for index in range(3))
    torch.cat([a.reshape(-1).view(integer) for a in arrays], out=bits)
    bits &= torch.iinfo(integer).max
    torch.bitwise_right_shift(bits, key_shift, out=keys)
    torch.index_select(edge, 0, keys, out=below)
    torch.sub(bits, below, out=below)
    below >>= torch.iinfo(integer).bits - 1  # -1 below the edge, 0 at or past it
    torch.index_select(first_bin_past_edge, 0, keys, out=bits)  # the bits are read: reused
    bits += below
    return bits


@functools.lru_cache(maxsize=None)
def _bin_tables(dtype, device):
    """``(key shift, first bin + 1, edge)`` of `statistics.histogram_bit_tables` for the float
    ``dtype``, the tables on ``device`` as integers of its width."""
    key_shift, first_bin, edge = statistics.histogram_bit_tables(statistics.numpy_float(dtype))
    integer = torch.int64 if dtype == torch.float64 else torch.int32
    return (key_shift, torch.as_tensor(first_bin + 1, dtype=integer, device=device),
            torch.as_tensor(edge, dtype=integer, device=device))


_kept = threading.local()  # per thread: each training thread writes into its own


def _scratch(entries, dtype, device, index):
    """A 1-D ``dtype`` tensor of ``entries`` on ``device`` for a temporary, the ``index``-th
    of its kind (the temporaries alive at once have distinct indices). On the CPU, a view of a
    buffer kept for the thread, grown to the largest request of at most
    `statistics.GROUP_MAX_ENTRIES` entries (16 MiB in float32; a larger one gets a new tensor):
    a fresh tensor of megabytes is mapped anew at every step, and its first touch, a page fault
    per 4 KiB, cost more than the work written into it (a histogram step took twice as long;
    benchmarks/NOTES.md, "The histograms joined"). Elsewhere a new one (PyTorch's caching
    allocator reuses the memory)."""
    if device.type != "cpu" or entries > statistics.GROUP_MAX_ENTRIES:
        return torch.empty(entries, dtype=dtype, device=device)
    kept = _kept.__dict__.setdefault("buffers", {})
    key = (dtype, index)
    if key not in kept or kept[key].numel() < entries:
        kept[key] = torch.empty(entries, dtype=dtype)
    return kept[key][:entries]


def counts_per_run(indices, sizes, length):
    """``[len(sizes), length]``: the counts of each run of ``sizes`` entries of the flat
    ``indices`` (values below ``length``), a count per run of the views: on the CPU as fast as
    one count of them all, and no per-entry offsets to make."""
    return torch.stack([torch.bincount(run, minlength=length)
                        for run in torch.split(indices, list(sizes))])


def counts_with_offsets(indices, sizes, length):
    """`counts_per_run` in one kernel, each run's indices offset into its own ``length`` slots:
    on an accelerator, where each count syncs with the host (for the size of its output)."""
    offsets = torch.repeat_interleave(
        torch.arange(len(sizes), dtype=indices.dtype, device=indices.device) * length,
        torch.tensor(list(sizes), device=indices.device), output_size=sum(sizes))
    return torch.bincount(indices + offsets, minlength=len(sizes) * length).reshape(
        len(sizes), length)


# Made once: a tensor built from Python numbers is a host-to-device copy (and on the CPU a few
# microseconds that a step after `backward` pays with cold caches); `torch.stack` copies them.
@functools.lru_cache(maxsize=64)
def _indices(indices, device):
    return torch.tensor(indices, dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=64)
def _counts(sizes, dtype, device):
    return torch.tensor([float(size) for size in sizes], dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def _empty_extremes(dtype, device):
    """An empty array's (min, max): +Inf and -Inf, as the masked pass has them."""
    infinity = torch.tensor(float("inf"), dtype=dtype, device=device)
    return infinity, -infinity


@functools.lru_cache(maxsize=None)
def ops_for(device: torch.device):
    """The `TorchOps` whose constants live on `device`."""
    return type(f"TorchOps[{device}]", (TorchOps,), {"device": device})
