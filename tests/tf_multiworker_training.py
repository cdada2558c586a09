"""One worker of a small MLP trained with `tf.distribute.MultiWorkerMirroredStrategy` and a custom
loop that logs the all-reduced gradients with `tensorboard_gradients.summary.gradients` (run by
tests/test_tf_multiworker.py, one process per worker, TF_CONFIG on loopback).

Every worker builds the same ``GradientWriter(LOGDIR/multiworker)`` (as on a shared file system)
and runs the op at every step; only the chief (worker 0, global replica 0) may write. The step
also returns the same matrix from `summary.gradient_statistics`, which every worker then passes to
`summary.write_statistics` outside ``strategy.run`` (cross-replica, as after an XLA-compiled step)
with a ``GradientWriter(LOGDIR/returned)``: again only the chief may write. Each worker prints one
JSON line ``{"task", "pid", "written", "returned_written"}`` with what the two ops returned.

The chief then trains an unsharded copy of the model, without any strategy, from the same initial
weights on the same global batches, and logs it to ``LOGDIR/reference``: the statistics the
multi-worker run must equal.

Keras ``model.fit`` is not used: on TF 2.21 / Keras 3.15 it cannot run under this strategy with
more than one worker (see the test module).

Usage: tf_multiworker_training.py TASK_INDEX PORT0,PORT1 LOGDIR
"""

import json
import os
import sys

task, ports, logdir = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
    "task": {"type": "worker", "index": task},
})
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorboard_gradients import GradientWriter, summary  # noqa: E402

STEPS, GLOBAL_BATCH, LEARNING_RATE = 3, 8, 0.1


def make_model():
    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(10, activation="tanh", name="hidden"),
        keras.layers.Dense(8, activation="relu", name="middle"),
        keras.layers.Dense(3, name="out"),
    ], name="mlp")


def per_example_loss(model, x, y):
    return tf.reduce_mean(tf.square(model(x, training=True) - y), axis=-1)


rng = np.random.default_rng(1)
inputs = rng.normal(size=(STEPS, GLOBAL_BATCH, 6)).astype("float32")
targets = rng.normal(size=(STEPS, GLOBAL_BATCH, 3)).astype("float32")

strategy = tf.distribute.MultiWorkerMirroredStrategy()
replicas = strategy.num_replicas_in_sync
assert replicas == 2, replicas
keras.utils.set_random_seed(0)
with strategy.scope():
    model = make_model()
    optimizer = keras.optimizers.SGD(LEARNING_RATE)
initial_weights = model.get_weights()
writer = GradientWriter(os.path.join(logdir, "multiworker"))
returned_writer = GradientWriter(os.path.join(logdir, "returned"))


@tf.function
def train_step(x, y, step):
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(per_example_loss(model, x, y),
                                          global_batch_size=GLOBAL_BATCH)
    grads = tape.gradient(loss, model.trainable_variables)
    # The gradient of the global batch's mean loss, the same on every worker.
    summed = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
    written = summary.gradients(summed, model.trainable_variables, step=step, histograms=True,
                                writer=writer)
    stats = summary.gradient_statistics(summed, model.trainable_variables)  # before the update
    optimizer.apply_gradients(zip(grads, model.trainable_variables))  # Keras sums the replicas
    return written, stats


def local_rows(array):
    """Each replica's rows of the global batch (replica ids count across workers)."""
    per_replica = GLOBAL_BATCH // replicas

    def rows(context):
        start = context.replica_id_in_sync_group * per_replica
        return array[start:start + per_replica]

    return strategy.experimental_distribute_values_from_function(rows)


written, returned_written = [], []
for step in range(STEPS):
    written_here, stats = strategy.run(
        train_step,
        args=(local_rows(inputs[step]), local_rows(targets[step]), tf.constant(step + 1, tf.int64)))
    written.append(bool(strategy.experimental_local_results(written_here)[0]))
    # Cross-replica, outside strategy.scope(): the variables tell which strategy decides.
    returned_written.append(bool(summary.write_statistics(
        strategy.experimental_local_results(stats)[0], model.trainable_variables, step=step + 1,
        writer=returned_writer)))
writer.close()
returned_writer.close()
print(json.dumps({"task": task, "pid": os.getpid(), "written": written,
                  "returned_written": returned_written}), flush=True)

if task == 0:  # the unsharded reference: one process, no strategy, the whole global batch
    reference = make_model()
    reference.set_weights(initial_weights)
    reference_optimizer = keras.optimizers.SGD(LEARNING_RATE)
    reference_writer = GradientWriter(os.path.join(logdir, "reference"))

    @tf.function
    def reference_step(x, y, step):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(per_example_loss(reference, x, y))
        grads = tape.gradient(loss, reference.trainable_variables)
        summary.gradients(grads, reference.trainable_variables, step=step, histograms=True,
                          writer=reference_writer)
        reference_optimizer.apply_gradients(zip(grads, reference.trainable_variables))

    for step in range(STEPS):
        reference_step(inputs[step], targets[step], tf.constant(step + 1, tf.int64))
    reference_writer.close()
