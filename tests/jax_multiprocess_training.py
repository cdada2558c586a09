"""Multi-process JAX on CPU: 2 processes x 4 host devices = one global 8-device mesh (data x
model axes; the data axis spans the processes), gradients of global arrays logged with
`log_gradients` by the same code on every process (run by tests/test_jax_multiprocess.py).

Usage:
  jax_multiprocess_training.py PROCESS_ID PORT LOGDIR   one of the 2 processes (coordinator on
      127.0.0.1:PORT, cross-process collectives over gloo); writes LOGDIR/sharded and
      LOGDIR/process_<PROCESS_ID> (only process 0 may create either)
  jax_multiprocess_training.py reference LOGDIR         the same model, global batch and weights
      unsharded in one single-device process; writes LOGDIR/reference

Each prints one JSON line: what `log_gradients` returned per step, the process's view of the
mesh and, for the 2 processes, the all-gathers compiled into the statistics (0: none).
"""

import json
import os
import sys

import jax

PROCESSES, LOCAL_DEVICES, STEPS = 2, 4, 3
reference = sys.argv[1] == "reference"
# Before any JAX computation: the device count is fixed when the CPU backend starts.
jax.config.update("jax_num_cpu_devices", 1 if reference else LOCAL_DEVICES)
if not reference:
    process_id, port, logdir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    # CPU collectives across processes: gloo is this JAX's default
    # (jax_cpu_collectives_implementation), named here so that a change of default shows.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                               num_processes=PROCESSES, process_id=process_id,
                               initialization_timeout=120)
else:
    logdir = sys.argv[2]

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

from tensorboard_gradients import GradientWriter  # noqa: E402
from tensorboard_gradients.capture import jax as capture_jax  # noqa: E402
from tensorboard_gradients.jax import log_gradients  # noqa: E402

# The same global weights and batch on every process (and in the reference): one seed.
rng = np.random.default_rng(0)
params = {
    "dense_0": {"kernel": rng.normal(size=(16, 32)).astype(np.float32) * 0.3,
                "bias": rng.normal(size=32).astype(np.float32) * 0.1},
    "dense_1": {"kernel": rng.normal(size=(32, 4)).astype(np.float32) * 0.3,
                "bias": np.zeros(4, np.float32)},
}
x = rng.normal(size=(16, 16)).astype(np.float32)
y = rng.normal(size=(16, 4)).astype(np.float32)


def loss(params, x, y):
    hidden = jax.nn.relu(x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"])
    return jnp.mean((hidden @ params["dense_1"]["kernel"] + params["dense_1"]["bias"] - y) ** 2)


grad_fn = jax.jit(jax.grad(loss))


def train_and_log(run, params, x, y):
    """STEPS logged steps (histograms at all but step 1) to `run`; (what log_gradients returned
    at each step, the last gradients)."""
    returned = []
    with GradientWriter(os.path.join(logdir, run)) as writer:
        for step in range(STEPS):
            grads = grad_fn(params, x * (step + 1), y)
            returned.append(log_gradients(writer, grads, step, params=params,
                                          histograms=step != 1))
    return returned, grads


if reference:
    returned, _ = train_and_log("reference", params, x, y)
    print(json.dumps({"returned": returned, "devices": jax.device_count()}))
    sys.exit(0)

assert jax.process_count() == PROCESSES and jax.device_count() == PROCESSES * LOCAL_DEVICES
# jax.devices() lists process 0's devices first: each row of the mesh is one process.
mesh = Mesh(np.array(jax.devices()).reshape(PROCESSES, LOCAL_DEVICES), ("data", "model"))
placement = {  # dense_0/kernel sharded on both axes (FSDP + tensor parallel): across processes
    "dense_0": {"kernel": PartitionSpec("data", "model"), "bias": PartitionSpec("model")},
    "dense_1": {"kernel": PartitionSpec("model", None), "bias": PartitionSpec()},
}
global_params = jax.tree_util.tree_map(
    lambda value, spec: jax.make_array_from_callback(
        value.shape, NamedSharding(mesh, spec), lambda index, value=value: value[index]),
    params, placement)
batch = NamedSharding(mesh, PartitionSpec("data", None))
rows = x.shape[0] // PROCESSES  # this process's rows of the global batch
local = slice(process_id * rows, (process_id + 1) * rows)
global_x = jax.make_array_from_process_local_data(batch, x[local], x.shape)
global_y = jax.make_array_from_process_local_data(batch, y[local], y.shape)
assert not global_params["dense_0"]["kernel"].is_fully_addressable

# Every process runs the same code with the same run directory, as SPMD programs do.
returned, grads = train_and_log("sharded", global_params, global_x, global_y)
# A run directory per process: only process 0's may exist afterwards.
with GradientWriter(os.path.join(logdir, f"process_{process_id}")) as writer:
    log_gradients(writer, grads, STEPS, params=global_params, histograms=True)

# The result matrices come out replicated (read locally); a matrix split across processes
# would be gathered by a collective: check that path on a global array split over both axes.
kernel_grad = grads["dense_0"]["kernel"]
gathered = capture_jax._host_matrix(kernel_grad, writes=process_id == 0)
expected = np.asarray(grad_fn(params, x * STEPS, y)["dense_0"]["kernel"])  # one local device
# The gradient itself, reduced over the batch in another order: float32 rounding apart.
gather_ok = gathered is None if process_id else bool(np.allclose(
    gathered, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max()))
leaves = [leaf for _, leaf in capture_jax.named_leaves(grads)]
weights = [leaf for _, leaf in capture_jax.named_leaves(global_params)]
stats, counts = capture_jax._matrices(leaves, weights, True)  # what log_gradients computed
compiled = capture_jax._matrices.lower(leaves, weights, True).compile().as_text()
print(json.dumps({
    "process": jax.process_index(), "processes": jax.process_count(), "pid": os.getpid(),
    "devices": jax.device_count(), "local_devices": jax.local_device_count(),
    "returned": returned, "matrices_replicated": stats.is_fully_replicated and
    counts.is_fully_replicated, "gather_ok": gather_ok,
    # All-gathers XLA compiled into the statistics and histograms of the global gradients.
    "all_gathers": compiled.count(" all-gather(") + compiled.count(" all-gather-start("),
}))
