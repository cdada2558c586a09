"""The std of a gradient whose entries sit near one value (|mean| >> std) on every adapter.

The naive sqrt(E[x^2] - E[x]^2) keeps no digits there in float32, and the summation order a
compiler picks decided whether it came out 0 (a fresh clone's CI failed on a Keras bias under
XLA). Every writer's statistics go through `statistics` with its own array library: each is
checked here, compiled where the library compiles, against float64 numpy.
"""

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


def numpy_stats(gradient, dense_size):
    return statistics.statistics_matrix(
        statistics.NumpyOps, [(gradient, dense_size)], None, np.float32)


def tensorflow_stats(jit):
    tf = pytest.importorskip("tensorflow")
    from tensorboard_gradients.capture.tensorflow_ops import TensorFlowOps

    @tf.function(jit_compile=jit)
    def compute(gradient, dense_size):
        return statistics.statistics_matrix(
            TensorFlowOps, [(gradient, dense_size)], None, tf.float32)

    return lambda gradient, dense_size: compute(
        tf.constant(gradient), tf.constant(dense_size, tf.int64)).numpy()


def torch_stats(gradient, dense_size):
    torch = pytest.importorskip("torch")
    from tensorboard_gradients.capture.torch import ops_for

    return statistics.statistics_matrix(
        ops_for(torch.device("cpu")), [(torch.tensor(gradient), dense_size)], None,
        torch.float32).numpy()


def jax_stats(gradient, dense_size):
    jax = pytest.importorskip("jax")
    from tensorboard_gradients.capture.jax import JaxOps

    compute = jax.jit(lambda g: statistics.statistics_matrix(
        JaxOps, [(g, dense_size)], None, g.dtype))
    return np.asarray(compute(jax.numpy.asarray(gradient)))


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
    stats = np.asarray(compute(gradient, gradient.size))
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
    stats = np.asarray(compute(present, dense.size))
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
