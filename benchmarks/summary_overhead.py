"""Cost of logging gradient statistics every step from a TF custom training loop.

A 14-layer ReLU MLP (28 variables) trains with Adam in `tf.function`; four variants of the same
step run interleaved in one process, so machine noise hits them alike:

  none          no gradient logging
  ours          tensorboard_gradients.summary.gradients: all stats of all variables, one summary
  ours_every_10 the same under tf.summary.record_if(step % 10 == 0)
  histograms    tf.summary.histogram per variable (TensorBoard's Histograms tab)
  scalar_norms  tf.summary.scalar(tf.norm(g)) per variable (the hand-written callback recipe)

Prints a markdown table of median step times and the ratio to `none`. Run by hand:

    python benchmarks/summary_overhead.py [--quick] [--width 256] [--batch 256]
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

from tensorboard_gradients import summary  # noqa: E402

LAYERS = 14


def build(width, features):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((features,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(LAYERS - 1)]
    layers += [keras.layers.Dense(10)]
    return keras.Sequential(layers)


def make_step(model, optimizer, log, writer):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    @tf.function
    def step(x, y, step):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        with writer.as_default(step=step):
            log(grads, variables, step)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return step


def every_10_steps(grads, variables, step):
    with tf.summary.record_if(step % 10 == 0):
        summary.gradients(grads, variables)


VARIANTS = {
    "none": lambda grads, variables, step: None,
    "ours": lambda grads, variables, step: summary.gradients(grads, variables),
    "ours_every_10": every_10_steps,
    "histograms": lambda grads, variables, step: [
        tf.summary.histogram(v.path, g) for g, v in zip(grads, variables)
    ],
    "scalar_norms": lambda grads, variables, step: [
        tf.summary.scalar(v.path + "/norm", tf.norm(g)) for g, v in zip(grads, variables)
    ],
}


def run(width, batch, features, rounds, steps_per_round):
    x = tf.random.normal((batch, features))
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32)
    tmp = tempfile.mkdtemp()
    steps = {}
    for name, log in VARIANTS.items():
        model = build(width, features)
        writer = tf.summary.create_file_writer(os.path.join(tmp, name))
        steps[name] = make_step(model, keras.optimizers.Adam(1e-4), log, writer)
    counter = tf.Variable(0, dtype=tf.int64)
    for fn in steps.values():  # trace and warm up
        for _ in range(3):
            fn(x, y, counter).numpy()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            start = time.perf_counter()
            for _ in range(steps_per_round):
                loss = fn(x, y, counter)
                counter.assign_add(1)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / steps_per_round)
    return {name: statistics.median(t) for name, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke run")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--features", type=int, default=64)
    args = parser.parse_args()
    rounds, per_round = (3, 5) if args.quick else (15, 20)
    medians = run(args.width, args.batch, args.features, rounds, per_round)
    base = medians["none"]
    params = sum(int(np.prod(v.shape)) for v in build(args.width, args.features).trainable_variables)
    print(
        f"14-layer MLP, width {args.width}, batch {args.batch}, {params:,} parameters, "
        f"{2 * LAYERS} variables; TF {tf.__version__}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs; median of {rounds} rounds x {per_round} steps\n"
    )
    print("| variant | ms / step | vs none |")
    print("|---|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds * 1e3:.2f} | {seconds / base:.3f}x |")


if __name__ == "__main__":
    main()
