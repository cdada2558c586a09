"""Every writer counts each |g| in the bin the format defines, exactly, on every adapter.

A histogram column is the set of magnitudes in ``[10**lo, 10**hi)`` (`columns`); the counts come
from the magnitudes' bit patterns (`statistics.histogram_rows`). The values that decide whether
that is exact are the floats next to each edge (a log10 formula put some in the neighbouring
bin), subnormals (TensorFlow's CPU kernels read them as zero), signed zeros, Inf and NaN of
either sign, and the largest float. The reference compares each value with the edges in float64
(`conftest.reference_histogram`), so an equal count is the only pass: no tolerance applies.
"""

import numpy as np
import pytest

from tensorboard_gradients.format import columns, statistics

from conftest import reference_bins, reference_histogram


def edge_values(dtype):
    """The three floats below, at and three above every edge as rounded to ``dtype``, and the
    special values, of both signs."""
    values = []
    for edge in (10.0 ** np.array(columns.HISTOGRAM_LOG10_EDGES)).astype(dtype):
        value = edge
        for _ in range(3):
            value = np.nextafter(value, dtype(0))
        for _ in range(7):
            values.append(value)
            value = np.nextafter(value, dtype(np.inf))
    info = np.finfo(dtype)
    values += [0.0, np.nan, np.inf, info.smallest_subnormal, info.tiny / 2, info.tiny, info.max,
               1.0, 10.0, 1e-30]
    values = np.array(values, dtype)
    # NaN with every payload bit set: the largest magnitude bit pattern there is.
    full_nan = np.array([-1], f"int{info.bits}").view(dtype)
    return np.concatenate([values, -values, full_nan])


def gradients(dtype):
    """Edge values alone and in small arrays that share a group (`statistics.size_groups`),
    random magnitudes over 37 decades, an empty array, a scalar and one array over the grouped
    size; each as ``(values, dense size)``, one with absent sparse entries and one missing."""
    rng = np.random.default_rng(7)
    edges = edge_values(dtype)
    spread = lambda *shape: (rng.standard_normal(shape)  # noqa: E731
                             * 10 ** rng.uniform(-25, 12, shape)).astype(dtype)
    arrays = [edges, edges[:256].reshape(16, 16), spread(256), spread(256), np.zeros(0, dtype),
              np.asarray(spread(1)[0]), spread(statistics.GROUPED_ARRAY_MAX_ENTRIES + 3)]
    entries = [(array, array.size) for array in arrays]
    return entries + [(arrays[2], arrays[2].size + 44), None]


def expected_counts(entries):
    rows = []
    for entry in entries:
        if entry is None:
            rows.append(np.zeros(columns.HISTOGRAM_BINS))
            continue
        values, size = entry
        absent = np.zeros(size - values.size, values.dtype)
        rows.append(reference_histogram(np.concatenate([values.reshape(-1), absent])))
    return np.stack(rows)


def numpy_counts(entries, dtype):
    return statistics.histogram_matrix(statistics.NumpyOps, entries, dtype)


def tensorflow_counts(how):
    tf = pytest.importorskip("tensorflow")
    from tensorboard_gradients.capture import tensorflow_ops

    def count(entries, dtype):
        dtype = tf.as_dtype(dtype)
        # The sparse entry's dense size as a tensor, as `statistics_inputs` gives it.
        tensors = [None if entry is None else (
            tf.constant(entry[0]),
            tf.constant(entry[1], tf.int64) if entry[1] != entry[0].size else entry[1])
            for entry in entries]
        if how == "op by op":
            return statistics.histogram_matrix(tensorflow_ops.TensorFlowOps, tensors, dtype)
        if how == "compiled":  # the library's split: static shapes in one XLA function
            return tensorflow_ops.histogram_matrix(tensors, dtype)
        return tf.function(lambda: tensorflow_ops.histogram_matrix(tensors, dtype),
                           jit_compile=True)()  # inside a step compiled with XLA

    return lambda entries, dtype: count(entries, dtype).numpy()


def torch_counts(entries, dtype):
    torch = pytest.importorskip("torch")
    from tensorboard_gradients.capture.torch_ops import ops_for

    torch_dtype = torch.float64 if dtype == np.float64 else torch.float32
    return statistics.histogram_matrix(
        ops_for(torch.device("cpu")),
        [None if entry is None else (torch.tensor(entry[0]), entry[1]) for entry in entries],
        torch_dtype).numpy()


def jax_counts(entries, dtype):
    jax = pytest.importorskip("jax")
    from tensorboard_gradients.capture.jax import JaxOps

    with jax.enable_x64(dtype == np.float64):
        sizes = [None if entry is None else entry[1] for entry in entries]
        compute = jax.jit(lambda values: statistics.histogram_matrix(
            JaxOps, [None if v is None else (v, size) for v, size in zip(values, sizes)],
            jax.numpy.dtype(dtype)))
        return np.asarray(compute(
            [None if entry is None else jax.numpy.asarray(entry[0]) for entry in entries]))


ADAPTERS = {
    "numpy": lambda: numpy_counts,
    "tensorflow": lambda: tensorflow_counts("op by op"),
    "tensorflow-compiled": lambda: tensorflow_counts("compiled"),
    "tensorflow-xla": lambda: tensorflow_counts("inside xla"),
    "torch": lambda: torch_counts,
    "jax-jit": lambda: jax_counts,
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_value_is_counted_in_the_bin_its_magnitude_falls_in(adapter, dtype):
    entries = gradients(dtype)
    counts = np.asarray(ADAPTERS[adapter]()(entries, dtype))
    np.testing.assert_array_equal(counts, expected_counts(entries))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_no_key_range_of_the_bit_tables_holds_two_edges(dtype):
    """The tables' premise, for any edges `columns` may define: a key range (1/8 of a binary
    octave) holds at most one edge, so one comparison finds the bin; checked against every
    finite key range's first and last bit pattern."""
    key_shift, first_bin, edge = statistics.histogram_bit_tables(dtype)
    integer = np.dtype(f"int{np.finfo(dtype).bits}")
    starts = np.arange(first_bin.size, dtype=np.int64) << key_shift
    ends = starts + (1 << key_shift) - 1
    for bits in (starts, ends, starts + (ends - starts) // 2):
        magnitudes = bits.astype(integer).view(dtype)
        counted = first_bin + (bits >= edge)
        with np.errstate(invalid="ignore"):  # NaN payloads met on the way to float64
            in_order = reference_bins(magnitudes)
        # Internal bins hold Inf before NaN, the order of their bits; columns the other way.
        in_order = np.where(in_order == columns.HIST_NAN, columns.HIST_INF,
                            np.where(in_order == columns.HIST_INF, columns.HIST_NAN, in_order))
        np.testing.assert_array_equal(counted, in_order)


def test_arrays_are_joined_in_batches_of_bounded_entries():
    # GROUP_MAX_ENTRIES bounds a batch; a larger array is a batch of its own, empty ones join.
    cap = statistics.GROUP_MAX_ENTRIES
    assert statistics.entry_batches([cap // 2, cap // 2, 1, 0, cap + 1, 3]) == [
        [0, 1], [2, 3], [4], [5]]
    assert statistics.entry_batches([]) == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_torch_counts_exactly_across_several_batches(monkeypatch, dtype):
    """PyTorch joins the arrays of any sizes in batches (`TorchOps.joined_histograms`); a bound
    of 300 entries splits these gradients into many, one array over it alone."""
    from tensorboard_gradients.format.statistics import array_ops

    monkeypatch.setattr(array_ops, "GROUP_MAX_ENTRIES", 300)
    entries = gradients(dtype)
    np.testing.assert_array_equal(torch_counts(entries, dtype), expected_counts(entries))


@pytest.mark.parametrize("count", ["counts_per_run", "counts_with_offsets"])
def test_both_torch_run_counts_count_each_run(count):
    """The CPU's count per run and the accelerators' one offset count (run here on the CPU, the
    only device CI has) agree with numpy's count of each run, empty runs included."""
    torch = pytest.importorskip("torch")
    from tensorboard_gradients.capture import torch_ops

    sizes = [5, 0, 1, 300, 0, 17]
    indices = np.random.default_rng(3).integers(0, columns.HISTOGRAM_BINS, sum(sizes))
    counted = getattr(torch_ops, count)(torch.tensor(indices, dtype=torch.int32), sizes,
                                        columns.HISTOGRAM_BINS)
    runs = np.split(indices, np.cumsum(sizes)[:-1])
    np.testing.assert_array_equal(
        counted.numpy(), [np.bincount(run, minlength=columns.HISTOGRAM_BINS) for run in runs])
