"""``stats=``: every writer logs the stats it was asked for, plus the required ones, and each
logged number is the one the full set gives (same data, same formulas, fewer passes); weight
(and update) norms only when named.

The Keras monitor's ``stats=`` is checked on all three backends by `keras_backend_training`
(``fewer_stats``), against the gradients SGD applied.
"""

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format import columns
from tensorboard_gradients.format.writer import GradientWriter

NORM_ONLY = ("l2_norm",)
REQUIRED_IN_ORDER = ("l2_norm", "min", "max", "abs_max", "nan_count", "inf_count", "size")


def gradients_with_trouble(seed=0):
    """Model-like gradients: kernels, a bias, a vanishing kernel whose squares underflow, exact
    zeros, a NaN and an Inf (which the masked pass handles), a missing gradient."""
    rng = np.random.default_rng(seed)
    nonfinite = rng.standard_normal(50).astype(np.float32)
    nonfinite[[3, 7]] = [np.nan, -np.inf]
    return {
        "dense/kernel": rng.standard_normal((40, 30)).astype(np.float32),
        "dense/bias": rng.standard_normal(30).astype(np.float32) * 1e-3,
        "vanishing/kernel": (rng.standard_normal((20, 10)) * 1e-24).astype(np.float32),
        "dead/kernel": np.zeros((10, 10), np.float32),
        "broken/kernel": nonfinite,
        "unused/kernel": None,
    }


def assert_same_columns(reduced, full, names):
    """The reduced matrix's columns ``names`` are the full matrix's, NaN where it is NaN. Both
    come from the same float32 entries by the same formula; only the passes differ (the sum of
    squares squared directly instead of M2 + sum * mean, abs_max from |x| instead of min and
    max), so they agree to a few float32 roundings of the sum of squares: (n + 8) u for n <=
    1200 entries here is 7.2e-5 relative, and the counts and extremes are exact."""
    for column, name in enumerate(names):
        got, want = reduced[..., column], full[..., columns.GRADIENT_STATS.index(name)]
        np.testing.assert_allclose(got, want, rtol=8e-5, atol=0, equal_nan=True, err_msg=name)


def test_gradient_stats_adds_the_required_ones_in_the_format_order():
    assert columns.gradient_stats() == columns.GRADIENT_STATS
    assert columns.selected_stats() == columns.GRADIENT_STATS + ("weight_l2_norm",
                                                                 "update_l2_norm", "adam_rms")
    assert columns.selected_stats(NORM_ONLY) == REQUIRED_IN_ORDER
    assert columns.selected_stats(["update_l2_norm"]) == REQUIRED_IN_ORDER + ("update_l2_norm",)
    assert columns.gradient_stats(["update_l2_norm"]) == REQUIRED_IN_ORDER
    assert columns.gradient_stats(NORM_ONLY) == REQUIRED_IN_ORDER
    assert columns.gradient_stats("zero_fraction") == (
        "l2_norm", "min", "max", "abs_max", "zero_fraction", "nan_count", "inf_count", "size")
    assert columns.gradient_stats(["size", "std", "mean"]) == (
        "l2_norm", "mean", "std", "min", "max", "abs_max", "nan_count", "inf_count", "size")


@pytest.mark.parametrize("bad", [("l2",), ("l2_norm", "grad_weight_ratio"), 3, [["mean"]]])
def test_an_unknown_stat_is_refused_naming_the_known_ones(bad):
    with pytest.raises(ValueError, match="gradient stats"):
        columns.gradient_stats(bad)
    with pytest.raises(ValueError, match="gradient stats"):
        GradientWriter("unused", stats=bad)


def test_the_numpy_writer_logs_what_it_was_asked_for(tmp_path):
    steps = [gradients_with_trouble(seed) for seed in range(3)]
    for name, stats in (("full", None), ("norms", NORM_ONLY), ("weights", ["weight_l2_norm"])):
        with GradientWriter(str(tmp_path), name=name, stats=stats) as writer:
            for step, gradients in enumerate(steps):
                weights = {n: np.ones((3, 3)) if g is None else np.ones_like(g)
                           for n, g in gradients.items()}
                writer.write(step, gradients, weights=weights)
    run = tg.read_logdir(str(tmp_path))["."]
    full, norms = run["full"], run["norms"]
    assert full.stat_names == columns.GRADIENT_STATS + ("weight_l2_norm",)
    assert norms.stat_names == REQUIRED_IN_ORDER  # weights given, their norms not asked for
    assert run["weights"].stat_names == REQUIRED_IN_ORDER + ("weight_l2_norm",)
    np.testing.assert_array_equal(run["weights"].stat("weight_l2_norm"),
                                  full.stat("weight_l2_norm"))
    assert_same_columns(norms.values, full.values, REQUIRED_IN_ORDER)
    broken = norms.variables.index("broken/kernel")
    assert norms.stat("nan_count")[0, broken] == 1 and norms.stat("inf_count")[0, broken] == 1
    vanishing = norms.variables.index("vanishing/kernel")
    assert 1e-24 < norms.stat("l2_norm")[0, vanishing] < 1e-21  # not read as 0
    assert np.isnan(norms.stat("size")[:, norms.variables.index("unused/kernel")]).all()


def test_the_tensorflow_summary_op_logs_what_it_was_asked_for(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from tensorboard_gradients import summary

    rng = np.random.default_rng(1)
    variables = [tf.Variable(rng.standard_normal((12, 8)).astype(np.float32), name="d/kernel"),
                 tf.Variable(np.zeros(8, np.float32), name="d/bias")]
    x = tf.constant(rng.standard_normal((16, 12)).astype(np.float32))

    @tf.function(jit_compile=True)
    def computed(stats):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(x @ variables[0] + variables[1]) ** 2)
        gradients = tape.gradient(loss, variables)
        return summary.gradient_statistics(gradients, variables, stats=stats)

    reduced, full = computed(("mean", "zero_fraction")).numpy(), computed(None).numpy()
    names = columns.gradient_stats(("mean", "zero_fraction"))
    assert reduced.shape == (2, len(names))  # no weight_l2_norm unless named
    assert_same_columns(reduced, full[:, :-1], names)
    with_weights = computed(("mean", "weight_l2_norm")).numpy()
    np.testing.assert_array_equal(with_weights[:, -1], full[:, -1])
    with tf.summary.create_file_writer(str(tmp_path)).as_default():
        assert summary.write_statistics(reduced, variables, step=1,
                                        logged_stats=("mean", "zero_fraction"))
        with pytest.raises(ValueError, match="logged_stats"):
            summary.write_statistics(reduced, variables, step=2, name="other")
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.tanh(x @ variables[0] + variables[1]) ** 2)
        assert summary.gradients(tape.gradient(loss, variables), variables, step=3,
                                 name="op", stats=NORM_ONLY)
    run = tg.read_logdir(str(tmp_path))["."]
    assert run["gradients"].stat_names == names
    assert run["op"].stat_names == REQUIRED_IN_ORDER


def test_the_pytorch_monitor_logs_what_it_was_asked_for(tmp_path):
    torch = pytest.importorskip("torch")
    from tensorboard_gradients.torch import GradientMonitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4),
                                torch.nn.Linear(4, 4))  # the last one never used: missing
    monitors = [GradientMonitor(model, str(tmp_path), name=name, stats=stats)
                for name, stats in (("full", None), ("norms", NORM_ONLY),
                                    ("weights", ("weight_l2_norm", "zero_fraction")))]
    for _ in range(3):
        model.zero_grad(set_to_none=True)
        model[2](model[1](model[0](torch.randn(8, 16)))).square().mean().backward()
        for monitor in monitors:
            monitor.step()
    for monitor in monitors:
        monitor.close()
    run = tg.read_logdir(str(tmp_path))["."]
    assert run["norms"].stat_names == REQUIRED_IN_ORDER
    assert_same_columns(run["norms"].values, run["full"].values, REQUIRED_IN_ORDER)
    weights = run["weights"]
    assert weights.stat_names == columns.gradient_stats(["zero_fraction"]) + ("weight_l2_norm",)
    np.testing.assert_array_equal(weights.stat("weight_l2_norm"),
                                  run["full"].stat("weight_l2_norm"))
    with pytest.raises(ValueError, match="gradient stats"):
        GradientMonitor(model, str(tmp_path), stats=("norm",))


def test_jax_writers_log_what_they_were_asked_for(tmp_path):
    jax = pytest.importorskip("jax")
    optax = pytest.importorskip("optax")
    from tensorboard_gradients.jax import gradient_monitor, log_gradients

    params = {"dense": {"kernel": jax.numpy.ones((6, 4)), "bias": jax.numpy.zeros(4)}}
    grads = jax.tree.map(lambda p: p * 0.5 + 0.25, params)
    with GradientWriter(str(tmp_path), name="logged") as writer:
        log_gradients(writer, grads, 0, params=params, stats=("std",))
        jax.jit(lambda g, s: log_gradients(writer, g, s, stats=NORM_ONLY))(grads, 1)
        jax.effects_barrier()
    tx = optax.chain(gradient_monitor(None, stats=("mean_abs", "weight_l2_norm")),
                     optax.sgd(0.1))
    state = tx.init(params)
    _, state = jax.jit(tx.update)(grads, state, params)
    assert state[0].columns == columns.gradient_stats(("mean_abs",)) + ("weight_l2_norm",)
    np.testing.assert_allclose(state[0].stat("weight_l2_norm"), [0, np.sqrt(24)])  # bias first
    np.testing.assert_array_equal(state[0].stat("mean_abs"), [0.25, 0.75])
    np.testing.assert_array_equal(state[0].stat("max"), [0.25, 0.75])
    series = tg.read_logdir(str(tmp_path))["."]
    assert series["logged"].stat_names == columns.gradient_stats(("std",))  # params, no norms
    assert series["logged_varset2"].stat_names == REQUIRED_IN_ORDER
    with pytest.raises(ValueError, match="gradient stats"):
        gradient_monitor(None, stats=("variance",))


@pytest.mark.parametrize("integration", ["keras", "lightning", "transformers"])
def test_every_integration_refuses_an_unknown_stat_when_made(integration, tmp_path):
    if integration == "keras":
        pytest.importorskip("keras")
        from tensorboard_gradients.keras import GradientMonitor

        make = lambda stats: GradientMonitor(str(tmp_path), stats=stats)  # noqa: E731
    elif integration == "lightning":
        pytest.importorskip("lightning")
        from tensorboard_gradients.lightning import GradientMonitor

        make = lambda stats: GradientMonitor(stats=stats)  # noqa: E731
    else:
        pytest.importorskip("transformers")
        from tensorboard_gradients.transformers import GradientMonitorCallback

        make = lambda stats: GradientMonitorCallback(stats=stats)  # noqa: E731
    make(("zero_fraction",))
    with pytest.raises(ValueError, match="gradient stats"):
        make(("zeros",))
