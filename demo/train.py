"""Demo: train two small networks with a custom TF loop and log their gradients.

  sigmoid_deep  12 sigmoid layers, Glorot init, SGD: the input-side layers' gradients vanish
  relu_he       the same depth with ReLU and He init: gradient norms stay within a few x

Data is a fixed synthetic classification problem made with numpy (nothing is downloaded).
Afterwards the per-layer gradient norms are read back with `tensorboard_gradients.read_logdir`
and printed; `--serve` then starts TensorBoard on the logdir until Ctrl-C.

    python demo/train.py --logdir runs/demo [--steps 300] [--serve]
"""

import argparse
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

DEPTH = 12
WIDTH = 64


def make_data(samples=2048, features=32, classes=4, seed=0):
    """Gaussian blobs around random class centres, with label noise: learnable but not trivial."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=1.5, size=(classes, features))
    labels = rng.integers(0, classes, size=samples)
    x = centres[labels] + rng.normal(size=(samples, features))
    return x.astype(np.float32), labels.astype(np.int32)


def build(name, activation, initializer, features, classes):
    import keras

    layers = [keras.Input((features,))]
    for index in range(DEPTH):
        layers.append(
            keras.layers.Dense(
                WIDTH, activation=activation, kernel_initializer=initializer, name=f"dense_{index:02d}"
            )
        )
    layers.append(keras.layers.Dense(classes, name="logits"))
    return keras.Sequential(layers, name=name)


SCENARIOS = {
    "sigmoid_deep": dict(activation="sigmoid", initializer="glorot_uniform", learning_rate=0.1),
    "relu_he": dict(activation="relu", initializer="he_normal", learning_rate=0.01),
}


def train(run_dir, activation, initializer, learning_rate, steps, batch_size=128, histogram_every=25):
    import keras
    import tensorflow as tf

    from tensorboard_gradients import summary

    keras.utils.set_random_seed(0)
    x, y = make_data()
    model = build(os.path.basename(run_dir), activation, initializer, x.shape[1], int(y.max()) + 1)
    optimizer = keras.optimizers.SGD(learning_rate)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    writer = tf.summary.create_file_writer(run_dir)
    dataset = (
        tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).repeat().batch(batch_size)
    )

    @tf.function
    def train_step(features, labels, step):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        with writer.as_default(step=step):
            summary.gradients(
                grads, model.trainable_variables, histograms=step % histogram_every == 0
            )
            tf.summary.scalar("loss", loss)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    progress = keras.utils.Progbar(steps, stateful_metrics=["loss"])
    for step, (features, labels) in enumerate(dataset.take(steps)):
        loss = train_step(features, labels, tf.constant(step, tf.int64))
        progress.update(step + 1, [("loss", float(loss))])
    writer.close()


def report(logdir):
    """Per-layer kernel gradient norm (median over the run) from what was logged."""
    import tensorboard_gradients as tg

    runs = tg.read_logdir(logdir)
    for run in sorted(runs):
        series = runs[run]["gradients"]
        norms = np.nanmedian(series.stat("l2_norm"), axis=0)
        print(f"\n{run}: {len(series.steps)} steps, median gradient L2 norm per kernel")
        for variable, norm in zip(series.variables, norms):
            if variable.endswith("kernel"):
                print(f"  {variable:30s} {norm:10.3e}  {'#' * max(1, int(12 + np.log10(norm)))}")
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/demo")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--serve", action="store_true", help="then run TensorBoard until Ctrl-C")
    parser.add_argument("--port", type=int, default=6006)
    args = parser.parse_args()

    for name, scenario in SCENARIOS.items():
        print(f"\n== {name} ==")
        train(os.path.join(args.logdir, name), steps=args.steps, **scenario)
    report(args.logdir)
    print(f"\nLogs written to {os.path.abspath(args.logdir)}")
    if args.serve:
        print(f"TensorBoard at http://localhost:{args.port}/ (Ctrl-C to stop)")
        try:
            subprocess.run(
                [sys.executable, "-m", "tensorboard.main", "--logdir", args.logdir, "--port", str(args.port)],
                check=False,
            )
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
