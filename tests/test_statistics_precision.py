"""The std of a gradient whose entries sit near one value (|mean| >> std) on every adapter.

The naive sqrt(E[x^2] - E[x]^2) keeps no digits there in float32, and the summation order a
compiler picks decided whether it came out 0 (a fresh clone's CI failed on a Keras bias under
XLA). Every writer's statistics go through `statistics` with its own array library: each is
checked here, compiled where the library compiles, against float64 numpy.
"""

import functools

import numpy as np
import pytest

from tensorboard_gradients.format import columns, statistics

from conftest import reference_stats, stat_tolerances

STD = columns.GRADIENT_STATS.index("std")
MEAN = columns.GRADIENT_STATS.index("mean")


def offset_gradient(ratio, size=64, seed=0):
    """float32 entries with |mean| / std = ratio."""
    rng = np.random.default_rng(seed)
    return (0.37 + (0.37 / ratio) * rng.standard_normal(size)).astype(np.float32)


def _matrix(norms_only):
    """What a writer computes at a full step, or at a norms-only one (format 1.6)."""
    return statistics.norms_only_statistics if norms_only else statistics.statistics_matrix


# Each computes the gradient stats ``stats`` (all by default) of ``entries`` in float32, of a
# norms-only step with ``norms_only``.
def numpy_stats(entries, stats=columns.GRADIENT_STATS, norms_only=False):
    return _matrix(norms_only)(statistics.NumpyOps, entries, None, np.float32, stats)


# The compiled functions are kept per stats and group cap (read when traced), so that arrays of
# the same shapes run the graph already compiled, as a training step's later steps do: the
# arrays with and without a NaN, and the three mean / std ratios. Compiling is most of these
# tests' time (10-20 s a graph under XLA on 2 cores), not what they check.
@functools.lru_cache(maxsize=None)
def _tensorflow_function(jit, stats, group_max_entries, norms_only):
    import tensorflow as tf

    from tensorboard_gradients.capture.tensorflow_ops import TensorFlowOps

    @tf.function(jit_compile=jit)
    def traced(gradients, dense_sizes):
        return _matrix(norms_only)(
            TensorFlowOps, list(zip(gradients, dense_sizes)), None, tf.float32, stats)

    return traced


def tensorflow_stats(jit):
    tf = pytest.importorskip("tensorflow")

    def compute(entries, stats=columns.GRADIENT_STATS, norms_only=False):
        traced = _tensorflow_function(jit, tuple(stats), statistics.array_ops.GROUP_MAX_ENTRIES,
                                      norms_only)
        return traced([tf.constant(g) for g, _ in entries],
                      [tf.constant(size, tf.int64) for _, size in entries]).numpy()

    return compute


def torch_stats(entries, stats=columns.GRADIENT_STATS, norms_only=False):
    torch = pytest.importorskip("torch")
    from tensorboard_gradients.capture.torch_ops import ops_for

    return _matrix(norms_only)(
        ops_for(torch.device("cpu")),
        [None if entry is None else (torch.tensor(entry[0]), entry[1]) for entry in entries],
        None, torch.float32, stats).numpy()


@functools.lru_cache(maxsize=None)
def _jax_function(sizes, stats, group_max_entries, norms_only):
    import jax

    from tensorboard_gradients.capture.jax import JaxOps

    return jax.jit(lambda gradients: _matrix(norms_only)(
        JaxOps, list(zip(gradients, sizes)), None, jax.numpy.float32, stats))


def jax_stats(entries, stats=columns.GRADIENT_STATS, norms_only=False):
    jax = pytest.importorskip("jax")

    compute = _jax_function(tuple(size for _, size in entries), tuple(stats),
                            statistics.array_ops.GROUP_MAX_ENTRIES, norms_only)
    return np.asarray(compute([jax.numpy.asarray(g) for g, _ in entries]))


ADAPTERS = {
    "numpy": lambda: numpy_stats,
    "tensorflow": lambda: tensorflow_stats(jit=False),
    "tensorflow-xla": lambda: tensorflow_stats(jit=True),
    "torch": lambda: torch_stats,
    "jax-jit": lambda: jax_stats,
}


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("ratio", [1e2, 1e4, 1e6])
def test_std_is_exact_to_rounding_when_the_mean_dwarfs_it(adapter, ratio):
    compute = ADAPTERS[adapter]()
    gradient = offset_gradient(ratio)
    expected = reference_stats(gradient)
    stats = np.asarray(compute([(gradient, gradient.size)]))
    tolerance = stat_tolerances(expected, np.float32)["std"]
    assert abs(stats[0, STD] - expected["std"]) <= tolerance, (stats[0, STD], expected["std"])
    if ratio == 1e4:  # the bound is tight enough to catch the naive formula, off by far more
        naive = np.sqrt(max(np.mean(gradient * gradient) - np.mean(gradient) ** 2, 0.0))
        assert abs(naive - expected["std"]) > 10 * tolerance


@pytest.mark.parametrize("adapter", ["numpy", "tensorflow-xla", "torch", "jax-jit"])
def test_absent_sparse_rows_join_the_moments_by_the_parallel_formula(adapter):
    """Present rows near 0.37 and 3x as many absent (zero) rows: mean and std of the whole."""
    compute = ADAPTERS[adapter]()
    present = offset_gradient(1e4, size=1000)
    dense = np.concatenate([present, np.zeros(3000, np.float32)])  # std ~ mean: well conditioned
    expected = reference_stats(dense)
    stats = np.asarray(compute([(present, dense.size)]))
    tolerances = stat_tolerances(expected, np.float32)
    assert abs(stats[0, MEAN] - expected["mean"]) <= tolerances["mean"]
    assert abs(stats[0, STD] - expected["std"]) <= tolerances["std"]


def test_combine_moments_equals_the_moments_of_the_union():
    rng = np.random.default_rng(1)
    a, b = 5 + rng.standard_normal(300), -2 + 3 * rng.standard_normal(700)
    moments = lambda x: (np.float64(x.size), x.mean(), np.sum((x - x.mean()) ** 2))  # noqa: E731
    count, mean, m2 = statistics.combine_moments(statistics.NumpyOps, moments(a), moments(b))
    union = np.concatenate([a, b])
    assert count == 1000
    # float64, 1000 terms: (n + 8) u = 1.1e-13 relative.
    np.testing.assert_allclose([mean, m2], moments(union)[1:], rtol=1.2e-13)
    empty = (np.float64(0), np.float64(0), np.float64(0))
    assert statistics.combine_moments(statistics.NumpyOps, empty, moments(a))[2] == moments(a)[2]


def mixed_gradients(rng):
    """Arrays that share reduction groups (`statistics.size_groups`) yet must not mix: one size
    at scales 1e-20 to 1e15, an offset one (|mean| / std = 1e4), one size in two shapes, exact
    zeros, a scalar, an empty array and three just over the grouped size (one with exact zeros:
    reduced alone by the fast pass, by other kernels than a group; two of one size at scales
    1 and 1e-30, which the masked pass stacks); all-equal entries whose squares underflow
    (1e-25: the sum of squares would read 0) and a scalar like them."""
    gradients = [(scale * rng.standard_normal(256)).astype(np.float32)
                 for scale in (1e-20, 1e-3, 1.0, 1e15)]
    gradients += [offset_gradient(1e4, size=256), rng.standard_normal((16, 16)).astype(np.float32),
                  np.where(rng.random(256) < 0.3, 0, rng.standard_normal(256)).astype(np.float32),
                  np.float32(rng.standard_normal()), np.zeros(0, np.float32),
                  rng.standard_normal(statistics.GROUPED_ARRAY_MAX_ENTRIES + 1).astype(np.float32),
                  np.where(rng.random(statistics.GROUPED_ARRAY_MAX_ENTRIES + 7) < 0.3, 0,
                           rng.standard_normal(statistics.GROUPED_ARRAY_MAX_ENTRIES + 7)
                           ).astype(np.float32),
                  (1e-30 * rng.standard_normal(statistics.GROUPED_ARRAY_MAX_ENTRIES + 1)
                   ).astype(np.float32),
                  rng.standard_normal(10).astype(np.float32),
                  np.full(3, 1e-25, np.float32), np.float32(-3e-30)]
    return gradients


# The stats a writer may be asked for (`columns.gradient_stats`): all (six passes), the required
# ones (three: squares, min, max), and sets between (the sum of squares then from M2 or not).
STAT_SETS = {
    "all": columns.GRADIENT_STATS,
    "required": columns.gradient_stats(()),
    "zeros": columns.gradient_stats(("zero_fraction",)),
    "std-mean_abs": columns.gradient_stats(("std", "mean_abs")),
}


def _assert_rows_match_float64(stats, gradients, names):
    """Each row equals float64 numpy's statistics of its gradient within the row's own rounding
    bound (`stat_tolerances`); a stat NaN in the reference (or missing gradient) is NaN."""
    for row, gradient in zip(stats, gradients):
        if gradient is None:
            assert np.isnan(row).all()
            continue
        expected = reference_stats(gradient)
        tolerances = stat_tolerances(expected, np.float32)
        for column, name in enumerate(names):
            if np.isnan(expected[name]):
                assert np.isnan(row[column]), (gradient.shape, name, row[column])
                continue
            # The smallest float32 step on top: a stored 1e-20 * 1e-20 is not a float32.
            bound = tolerances[name] + np.finfo(np.float32).smallest_subnormal
            assert abs(row[column] - expected[name]) <= bound, (
                gradient.shape, name, row[column], expected[name])


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("case", ["ordinary", "underflowing", "non_finite", "overflowing"])
def test_a_norms_only_step_logs_the_norms_exact_to_rounding_in_one_pass(adapter, case,
                                                                          monkeypatch):
    """`statistics.norms_only_statistics` (the Keras recorders' norms-only step): the
    every-step stats as the full step computes them, the others NaN; one sum of squares per
    gradient when every norm is trusted, the masked pass otherwise (counted where eager)."""
    masked = []
    masked_reduction_matrix = statistics.formulas.masked_reduction_matrix
    monkeypatch.setattr(statistics.formulas, "masked_reduction_matrix",
                        lambda *args: masked.append(1) or masked_reduction_matrix(*args))
    gradients = mixed_gradients(np.random.default_rng(5))
    if case == "ordinary":  # no square lost to underflow, every norm finite
        gradients = [g for g in gradients if g.size == 0 or np.abs(g).max() > 1e-15]
    elif case == "non_finite":
        gradients[2] = gradients[2].copy()
        gradients[2][[5, 9]] = [np.nan, np.inf]
    elif case == "overflowing":  # finite entries whose squares overflow float32
        gradients = [gradients[1], np.float32(3e19) * gradients[2]]
    stats = np.asarray(ADAPTERS[adapter]()([(g, g.size) for g in gradients],
                                           columns.GRADIENT_STATS, norms_only=True))
    names = columns.stats_for(False, False, columns.GRADIENT_STATS)
    every_step = [name in columns.EVERY_STEP_STATS for name in names]
    assert np.isnan(stats[:, ~np.array(every_step)]).all()
    _assert_rows_match_float64(stats[:, every_step], gradients,
                               [n for n, kept in zip(names, every_step) if kept])
    if adapter in ("numpy", "torch"):  # traced ones trace both branches
        assert bool(masked) == (case != "ordinary")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_python_float_trust_check_equals_trusted_norms(dtype):
    """`trusted_norm_floats` (the PyTorch monitor's norms-only step, on Python floats) trusts
    exactly the norms `trusted_norms` does: NaN, Inf, 0, the least trusted norm of each size and
    the floats of ``dtype`` on each side of it, a missing gradient (NaN size)."""
    sizes = np.array([1, 1000, 2**20, np.nan])
    least = statistics.least_trusted_norms(sizes, dtype)
    edges = [np.nan, np.inf, 0.0, 1.0, float(np.finfo(dtype).max)]
    for size_index in range(len(sizes) - 1):
        at = dtype(least[size_index])  # the float of dtype nearest the least: either side
        edges += [float(at), float(np.nextafter(at, dtype(0))), float(np.nextafter(at, dtype(1)))]
    for norm in edges:
        norms = np.full(len(sizes), norm, dtype)
        as_floats = [None if np.isnan(size) else value
                     for size, value in zip(sizes, norms.tolist())]
        assert statistics.trusted_norm_floats(as_floats, least.tolist()) == (
            statistics.trusted_norms(norms, sizes).tolist()), (norm, norms)


def _fast_rows_trusted(pass_rows, sizes, dtype, stats):
    """`checked_fast_rows`' verdict on a `pass_matrix` (``sizes``: NaN for a missing row)."""
    with np.errstate(all="ignore"):
        return bool(statistics.checked_fast_rows(statistics.NumpyOps, pass_rows, sizes, dtype,
                                                 stats)[1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stat_set", STAT_SETS)
def test_the_python_float_pre_check_trusts_only_what_the_check_trusts(dtype, stat_set):
    """`surely_trusted_passes` (the PyTorch monitor's full step, on Python floats) never trusts
    a pass matrix that `checked_fast_rows` doubts, on each gradient of `mixed_gradients` (every
    scale, tiny, huge, constant, empty), the same with NaN, Inf and squares that overflow, and
    on 6,000 random rows of any values, magnitudes up to the dtype's largest and down to its
    subnormals, and those near the pre-check's own bounds; and it does trust ordinary
    gradients, so the monitor's common step does take it."""
    stats = STAT_SETS[stat_set]
    rng = np.random.default_rng(11)
    gradients = [g.astype(dtype) for g in mixed_gradients(rng)]
    gradients += [np.array([np.nan, 1.0], dtype), np.array([np.inf, 1.0], dtype),
                  np.full(4, np.finfo(dtype).max / 3, dtype), np.zeros(5, dtype)]

    def verdicts(pass_matrix, sizes):
        surely = statistics.surely_trusted_passes(
            pass_matrix.tolist(), [None if np.isnan(s) else s for s in sizes], dtype, stats)
        return surely, _fast_rows_trusted(pass_matrix, sizes, dtype, stats)

    ordinary = [(rng.standard_normal(n) * scale).astype(dtype)
                for n, scale in ((65536, 1e-3), (256, 1.0), (10, 1e3))]
    passes = statistics.pass_matrix(
        statistics.NumpyOps, [(g, g.size) for g in ordinary] + [None], dtype, stats)
    sizes = np.array([g.size for g in ordinary] + [np.nan], dtype)
    assert verdicts(passes, sizes) == (True, True)
    for gradient in gradients:
        with np.errstate(all="ignore"):  # the NaN, Inf and overflowing ones
            passes = statistics.pass_matrix(
                statistics.NumpyOps, [(gradient, gradient.size)], dtype, stats)
        sizes = np.array([gradient.size], dtype)
        surely, trusted = verdicts(passes, sizes)
        assert trusted or not surely, gradient
    # Random rows: log-uniform magnitudes over the dtype's whole range, random signs, exact
    # zeros, NaN and Inf; every fifth row scaled to sit at a pre-check bound.
    info = np.finfo(dtype)
    width = len(statistics.passes_for(tuple(stats)))
    exponents = rng.uniform(np.log10(info.smallest_subnormal), np.log10(info.max), (6000, width))
    rows = rng.choice([-1, 1, 1, 1], (6000, width)) * 10.0 ** exponents
    rows[rng.random(rows.shape) < 0.05] = 0
    rows[rng.random(rows.shape) < 0.002] = np.nan
    rows[rng.random(rows.shape) < 0.002] = np.inf
    rows[:, 0] = np.round(10.0 ** rng.uniform(0, 7, len(rows)))  # the count: an integer
    near = rng.random(len(rows)) < 0.2
    with np.errstate(all="ignore"):
        rows[near] *= np.sqrt(info.tiny / info.eps) / np.maximum(np.abs(rows[near, 1:2]), info.tiny)
    with np.errstate(all="ignore"):
        rows = rows.astype(dtype)
    if "m2" in statistics.passes_for(tuple(stats)):
        # Impossible rows the check's float32 cancels to a sum of squares of 0 and float64
        # does not: all entries equal, yet a negative M2 against the mean's part.
        names = statistics.passes_for(tuple(stats))
        for count, total in ((3, 5), (7, 3), (11, 13)):
            row = dict.fromkeys(names, 0.0) | {"count": count, "sum": total, "min": 1.0,
                                                "max": 1.0, "m2": -total * total / count}
            rows = np.concatenate([rows, np.array([[row[name] for name in names]], dtype)])
    taken = 0
    for row in rows:
        surely, trusted = verdicts(row[None, :], np.array([row[0]], dtype))
        assert trusted or not surely, row.tolist()
        taken += surely
    assert taken > 100  # the random rows reach the pre-check's True


@pytest.mark.parametrize("adapter", ["numpy", "torch"])
def test_a_norms_only_step_leaves_a_missing_gradients_row_nan(adapter):
    gradient = np.arange(6, dtype=np.float32)
    stats = ADAPTERS[adapter]()([None, (gradient, 6)], columns.GRADIENT_STATS, norms_only=True)
    names = columns.stats_for(False, False, columns.GRADIENT_STATS)
    assert np.isnan(stats[0]).all()
    assert stats[1, names.index("l2_norm")] == pytest.approx(np.linalg.norm(gradient), rel=1e-6)
    assert stats[1, names.index("nan_count")] == 0


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("group_max_entries", [statistics.GROUP_MAX_ENTRIES, 600])
@pytest.mark.parametrize("non_finite", [False, True])
@pytest.mark.parametrize("stat_set", STAT_SETS)
def test_grouped_arrays_each_get_their_own_statistics(
        adapter, group_max_entries, non_finite, stat_set, monkeypatch):
    """Arrays reduced together in one stacked matrix (and, with a small group cap, split over
    several) come out row by row as each alone, within each array's own rounding bound; with a
    NaN and an Inf in one array the masked pass takes over for every row. So for every set of
    stats a writer may log: fewer passes, the same numbers."""
    # Where `size_groups` reads it (statistics re-exports the name: setting it there changes
    # nothing).
    monkeypatch.setattr(statistics.array_ops, "GROUP_MAX_ENTRIES", group_max_entries)
    gradients = mixed_gradients(np.random.default_rng(3))
    if non_finite:
        gradients[2] = gradients[2].copy()
        gradients[2][[5, 9]] = [np.nan, np.inf]
    names = STAT_SETS[stat_set]
    stats = np.asarray(ADAPTERS[adapter]()([(g, g.size) for g in gradients], names))
    assert stats.shape == (len(gradients), len(names))
    _assert_rows_match_float64(stats, gradients, names)
