"""Run by test_write_failures in a fresh process: trains while the log disk is full for a while.

``python full_disk_training.py FRAMEWORK LOGDIR STRICT`` (framework: torch | keras | tensorflow
(a custom loop) | jax). The process
may write at most ``FILE_LIMIT`` bytes to any one file (RLIMIT_FSIZE): past it the kernel refuses
writes part way (EFBIG; a full disk answers ENOSPC the same way), as a full disk does. After
``FULL_UNTIL`` training steps the limit is lifted, like an operator freeing space. Prints one
JSON line: the steps trained, the monitor's dropped-step count.
"""

import json
import os
import resource
import signal
import sys

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np  # noqa: E402

FRAMEWORK, LOGDIR, STRICT = sys.argv[1], sys.argv[2], sys.argv[3] == "strict"
STEPS, FULL_FROM, FULL_UNTIL = 30, 5, 20
FILE_LIMIT = 1 << 30
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of a kill


def disk(step, settle=lambda: None):
    """Fills the disk at FULL_FROM (no file may grow past its current size) and frees it at
    FULL_UNTIL. Called before each training step with its 1-based number. ``settle`` writes
    what the writer's background thread still holds first: the steps before FULL_FROM are on
    disk, and their file exists, before its size is taken; the steps logged while the disk is
    full are tried on it before it is freed (the thread writes in batches, every second: a loop
    this fast would otherwise be past FULL_UNTIL before the thread tried them)."""
    if step == FULL_FROM:
        settle()
        # Every file this process writes is under LOGDIR: the largest is the monitor's.
        sizes = [os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(LOGDIR) for f in fs]
        limit = max(sizes) + 100  # room for part of a record, not a whole one: a torn write
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    if step == FULL_UNTIL:
        settle()
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


rng = np.random.default_rng(0)
x = rng.normal(size=(8, 16)).astype("float32")
y = rng.normal(size=(8, 1)).astype("float32")

if FRAMEWORK == "torch":
    import torch

    from tensorboard_gradients.torch import GradientMonitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    monitor = GradientMonitor(model, LOGDIR, histograms_every_n_steps=3, strict=STRICT)
    # The monitor's writer (private: the PyTorch monitor has no flush of its own; made at the
    # first logged step).
    for step in range(1, STEPS + 1):
        disk(step, lambda: monitor._writer.flush())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(torch.tensor(x)), torch.tensor(y)).backward()
        monitor.step(step)
        optimizer.step()
    monitor.close()
    trained = STEPS
elif FRAMEWORK == "tensorflow":
    import tensorflow as tf

    from tensorboard_gradients import GradientWriter, summary

    tf.random.set_seed(0)
    kernel = tf.Variable(tf.random.normal((16, 1)), name="dense/kernel")
    monitor = GradientWriter(LOGDIR, strict=STRICT)

    @tf.function
    def train_step(step):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.constant(x) @ kernel - y) ** 2)
        grads = tape.gradient(loss, [kernel])
        summary.gradients(grads, [kernel], step=step, histograms=step % 3 == 1, writer=monitor)
        kernel.assign_sub(0.01 * grads[0])

    for step in range(1, STEPS + 1):
        disk(step, monitor.flush)
        train_step(tf.constant(step, tf.int64))
    trained = STEPS
elif FRAMEWORK == "jax":
    import jax

    from tensorboard_gradients import GradientWriter
    from tensorboard_gradients.jax import log_gradients

    params = {"dense": {"kernel": jax.numpy.asarray(rng.normal(size=(16, 1)), "float32")}}
    loss = lambda p: jax.numpy.mean((x @ p["dense"]["kernel"] - y) ** 2)  # noqa: E731
    monitor = GradientWriter(LOGDIR, strict=STRICT)
    for step in range(1, STEPS + 1):
        disk(step, monitor.flush)
        grads = jax.grad(loss)(params)
        log_gradients(monitor, grads, step, params=params, histograms=step % 3 == 1)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    trained = STEPS
else:
    import keras

    from tensorboard_gradients.keras import GradientMonitor

    class Disk(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            disk(batch + 1, lambda: monitor._writer.flush())  # private: no flush of its own

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    monitor = GradientMonitor(LOGDIR, histograms_every_n_steps=3, strict=STRICT)
    data = np.repeat(x, STEPS, axis=0), np.repeat(y, STEPS, axis=0)
    history = model.fit(*data, batch_size=8, epochs=1, shuffle=False, verbose=0,
                        callbacks=[Disk(), monitor])
    trained = int(model.optimizer.iterations.numpy())

print(json.dumps({"trained": trained, "dropped": monitor.dropped_steps}))
