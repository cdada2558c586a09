"""Gradients sharded over an 8-device JAX mesh (data x model axes, host CPU devices) logged with
`log_gradients`, next to the same gradients unsharded (run by tests/test_jax_mesh.py in its own
process: the device count is fixed when JAX starts).

Usage: jax_mesh_training.py LOGDIR. Prints one JSON line: {"all_gathers": N,
"all_gathers_with_histograms": M} = the all-gather ops XLA compiled into the statistics of the
sharded gradients, without and with the histogram counts (0: no parameter is gathered).
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from tensorboard_gradients import GradientWriter  # noqa: E402
from tensorboard_gradients.capture import jax as capture_jax  # noqa: E402
from tensorboard_gradients.jax import log_gradients  # noqa: E402

logdir = sys.argv[1]
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
rng = np.random.default_rng(0)
params = {
    "dense_0": {"kernel": rng.normal(size=(16, 32)).astype(np.float32) * 0.3,
                "bias": np.zeros(32, np.float32)},
    "dense_1": {"kernel": rng.normal(size=(32, 4)).astype(np.float32) * 0.3,
                "bias": np.zeros(4, np.float32)},
}
placement = {
    "dense_0": {"kernel": PartitionSpec(None, "model"), "bias": PartitionSpec("model")},
    "dense_1": {"kernel": PartitionSpec("model", None), "bias": PartitionSpec()},
}


def loss(params, x, y):
    hidden = jnp.tanh(x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"])
    return jnp.mean((hidden @ params["dense_1"]["kernel"] + params["dense_1"]["bias"] - y) ** 2)


grad_fn = jax.jit(jax.grad(loss))
x = rng.normal(size=(8, 16)).astype(np.float32)
y = rng.normal(size=(8, 4)).astype(np.float32)
sharded_params = jax.tree_util.tree_map(
    lambda value, spec: jax.device_put(value, NamedSharding(mesh, spec)), params, placement)
sharded_x = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data", None)))
sharded_y = jax.device_put(y, NamedSharding(mesh, PartitionSpec("data", None)))

with GradientWriter(os.path.join(logdir, "sharded")) as writer:
    for step in range(3):
        grads = grad_fn(sharded_params, sharded_x * (step + 1), sharded_y)
        log_gradients(writer, grads, step, params=sharded_params, histograms=True)
with GradientWriter(os.path.join(logdir, "reference")) as writer:
    for step in range(3):
        grads = grad_fn(params, x * (step + 1), y)
        log_gradients(writer, grads, step, params=params, histograms=True)



def train_step(params, x, y, step, log):
    """A jitted step that logs inside (`log`) or not: only its statistics differ."""
    grads = jax.grad(loss)(params, x, y)
    if log:
        log_gradients(writer, grads, step, params=params, histograms=step % 2 == 0)
    return jax.tree_util.tree_map(lambda p, g: p - 0.0 * g, params, grads)


jitted_step = jax.jit(train_step, static_argnames="log")
with GradientWriter(os.path.join(logdir, "inside_jit")) as writer:
    for step in range(3):
        jitted_step(sharded_params, sharded_x * (step + 1), sharded_y, step, log=True)
    jax.effects_barrier()


def step_all_gathers(log):
    compiled = jitted_step.lower(sharded_params, sharded_x, sharded_y, 0, log=log).compile()
    return compiled.as_text().count(" all-gather(") + compiled.as_text().count(" all-gather-start(")


leaves = [leaf for _, leaf in capture_jax.named_leaves(grads)]
sharded_leaves = [leaf for _, leaf in capture_jax.named_leaves(
    grad_fn(sharded_params, sharded_x, sharded_y))]
weights = [leaf for _, leaf in capture_jax.named_leaves(sharded_params)]


def all_gathers(histograms):
    compiled = capture_jax._matrices.lower(sharded_leaves, weights, histograms).compile().as_text()
    return compiled.count(" all-gather(") + compiled.count(" all-gather-start(")


print(json.dumps({"all_gathers": all_gathers(False),
                  "all_gathers_with_histograms": all_gathers(True),
                  "step_all_gathers_logging": step_all_gathers(True),
                  "step_all_gathers_not_logging": step_all_gathers(False)}))
