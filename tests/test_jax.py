"""`tensorboard_gradients.jax.log_gradients` on real JAX gradients (CPU)."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.jax import log_gradients, named_leaves  # noqa: E402

from conftest import assert_row_matches, reference_histogram, reference_stats  # noqa: E402


def mlp_params(depth, width=32, features=16, classes=4, seed=0):
    """Flax-style parameters: {"Dense_0": {"kernel", "bias"}, ...}, Glorot-uniform kernels."""
    key = jax.random.PRNGKey(seed)
    sizes = [features] + [width] * depth + [classes]
    params = {}
    for index, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        limit = np.sqrt(6 / (fan_in + fan_out))
        kernel = jax.random.uniform(jax.random.fold_in(key, index), (fan_in, fan_out),
                                    minval=-limit, maxval=limit)
        params[f"Dense_{index}"] = {"kernel": kernel, "bias": jnp.zeros(fan_out)}
    return params


def sigmoid_mlp_loss(params, x, y):
    layers = [params[f"Dense_{i}"] for i in range(len(params))]
    for layer in layers[:-1]:
        x = jax.nn.sigmoid(x @ layer["kernel"] + layer["bias"])
    logits = x @ layers[-1]["kernel"] + layers[-1]["bias"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def test_statistics_and_histograms_match_the_reference_nan_inf_included(tmp_path):
    params = mlp_params(depth=2)
    grads = jax.tree_util.tree_map(lambda p: 0.01 * p + 1e-3, params)
    grads["Dense_1"]["kernel"] = grads["Dense_1"]["kernel"].at[0, 0].set(jnp.nan).at[1, 1].set(jnp.inf)
    grads["Dense_2"]["bias"] = jnp.array([3e38, -1e38, 0.0, 0.0])  # squares overflow float32
    with tg.GradientWriter(str(tmp_path)) as writer:
        for step in range(3):
            log_gradients(writer, grads, step, params=params, histograms=step == 1)
    series = tg.read_logdir(str(tmp_path))["."]["gradients"]
    names = [name for name, _ in named_leaves(grads)]
    assert series.variables == tuple(names)
    assert series.layers[:2] == ("Dense_0", "Dense_0")
    weights = dict(named_leaves(params))
    for name, leaf in named_leaves(grads):
        assert_row_matches(series, 2, name, reference_stats(np.asarray(leaf), np.asarray(weights[name])))
    assert series.histograms.steps.tolist() == [1]
    row = series.variables.index("Dense_1/kernel")
    np.testing.assert_array_equal(series.histograms.counts[0, row],
                                  reference_histogram(np.asarray(grads["Dense_1"]["kernel"])))


def test_leaves_are_named_by_path_in_natural_model_order():
    tree = {"Dense_10": {"kernel": jnp.ones(1)}, "Dense_2": {"kernel": jnp.ones(1)},
            "blocks": [{"w": jnp.ones(1)}, {"w": jnp.ones(1)}]}
    assert [name for name, _ in named_leaves(tree)] == [
        "Dense_2/kernel", "Dense_10/kernel", "blocks/0/w", "blocks/1/w"]


def test_bad_trees_are_clear_errors(tmp_path):
    with tg.GradientWriter(str(tmp_path)) as writer:
        with pytest.raises(ValueError, match="at least one gradient leaf"):
            log_gradients(writer, {}, 0)
        with pytest.raises(ValueError, match="params has no leaves"):
            log_gradients(writer, {"a": jnp.ones(2)}, 0, params={"b": jnp.ones(2)})


def test_a_vanishing_jax_mlp_is_diagnosed_in_training(tmp_path, plugin_client):
    params = mlp_params(depth=12)
    key = jax.random.PRNGKey(1)
    x = jax.random.normal(key, (128, 16))
    y = jax.random.randint(jax.random.fold_in(key, 1), (128,), 0, 4)
    grad_fn = jax.jit(jax.value_and_grad(sigmoid_mlp_loss))
    with tg.GradientWriter(str(tmp_path / "jax_sigmoid")) as writer:
        for step in range(30):
            _, grads = grad_fn(params, x, y)
            log_gradients(writer, grads, step, params=params, histograms=step % 10 == 0)
            params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    series = tg.read_logdir(str(tmp_path))["jax_sigmoid"]["gradients"]
    assert series.variables[0] == "Dense_0/bias" and series.variables[-1] == "Dense_12/kernel"
    alerts = tg.diagnose(series)
    vanishing = {a.layer for a in alerts if a.kind == "vanishing"}
    assert {"Dense_0", "Dense_1", "Dense_2"} <= vanishing and "Dense_12" not in vanishing
    served = json.loads(plugin_client(str(tmp_path)).get(
        "/data/plugin/gradients/alerts?run=jax_sigmoid&tag=gradients").get_data())
    assert len(served["alerts"]) == len(alerts)


def test_the_jax_paths_never_import_tensorflow_or_torch(tmp_path):
    script = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class NoTensorFlow(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("tensorflow", "keras", "torch"):
                    raise ImportError("blocked for this test: " + name)

        sys.meta_path.insert(0, NoTensorFlow())
        import jax.numpy as jnp, optax
        from tensorboard_gradients import GradientWriter
        from tensorboard_gradients.jax import gradient_monitor, log_gradients
        with GradientWriter({str(tmp_path / "plain")!r}) as writer:
            log_gradients(writer, {{"Dense_0": {{"kernel": jnp.ones((2, 2))}}}}, 0)
        tx = optax.chain(gradient_monitor({str(tmp_path / "optax")!r}), optax.sgd(0.1))
        params = {{"w": jnp.ones(3)}}
        tx.update(params, tx.init(params), params)
        assert "tensorflow" not in sys.modules and "torch" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]  # the optax writer closed at exit
    runs = tg.read_logdir(str(tmp_path))
    steps = [runs[run]["gradients"].steps.tolist() for run in ("plain", "optax")]
    assert steps == [[0], [0]]
