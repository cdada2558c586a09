"""model.fit step time with GradientMonitor vs without, vs the recipe users copy today.

Variants, all on the same model, data and seed, measured side by side and interleaved (rounds), so
the ratios are robust to this machine's noise:

* ``none``: plain ``model.fit``;
* ``monitor``: ``GradientMonitor`` statistics every step;
* ``monitor_every_10``: statistics every 10th step;
* ``monitor_histograms``: statistics and log10|g| histograms every step;
* ``recipe``: the common hand-written callback: after every batch, a second forward/backward pass
  with ``GradientTape`` on a sample batch, then per-variable ``.numpy()`` and numpy statistics,
  written as one ``tf.summary.scalar`` per variable.

Step time = median time between consecutive ``on_train_batch_end`` calls (each forces the step to
finish by reading the loss), after the first steps of each ``fit`` (tracing) are dropped.

Usage: ``python benchmarks/keras_overhead.py [--steps 60] [--rounds 3] [--models mlp,cnn,lstm]``
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tensorboard_gradients.keras import GradientMonitor  # noqa: E402

BATCH = 64
WARMUP_STEPS = 5


def mlp():
    layers = [keras.Input((256,))]
    layers += [keras.layers.Dense(256, activation="tanh") for _ in range(14)]
    layers += [keras.layers.Dense(10)]
    return keras.Sequential(layers, name="mlp14"), (256,), None


def cnn():
    model = keras.Sequential(
        [
            keras.Input((32, 32, 3)),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.Conv2D(32, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
            keras.layers.Conv2D(64, 3, activation="relu", padding="same"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ],
        name="cnn",
    )
    return model, (32, 32, 3), None


def lstm():
    model = keras.Sequential(
        [
            keras.Input((50,), dtype="int32"),
            keras.layers.Embedding(1000, 64),
            keras.layers.LSTM(128),
            keras.layers.Dense(10),
        ],
        name="lstm",
    )
    return model, (50,), 1000


MODELS = {"mlp": mlp, "cnn": cnn, "lstm": lstm}


class RecipeCallback(keras.callbacks.Callback):
    """What users paste today: a shadow tape pass on a sample batch + numpy stats per variable."""

    def __init__(self, log_dir, sample):
        super().__init__()
        self._writer = tf.summary.create_file_writer(log_dir)
        self._x, self._y = sample
        self._step = 0

    def on_train_batch_end(self, batch, logs=None):
        with tf.GradientTape() as tape:
            predictions = self.model(self._x, training=True)
            loss = self.model.compute_loss(x=self._x, y=self._y, y_pred=predictions)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self._step += 1
        with self._writer.as_default(step=self._step):
            for variable, gradient in zip(self.model.trainable_variables, grads):
                values = tf.convert_to_tensor(gradient).numpy()
                stats = (np.linalg.norm(values), values.mean(), values.std(), values.min(), values.max())
                tf.summary.scalar(variable.path + "/grad_norm", stats[0])


class StepTimer(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.times = []

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])  # wait for the step
        self.times.append(time.perf_counter())

    def step_times(self):
        return np.diff(self.times[WARMUP_STEPS:])


def build(name):
    keras.utils.set_random_seed(0)
    model, input_shape, vocabulary = MODELS[name]()
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, input_shape, vocabulary


def data(input_shape, vocabulary, steps):
    rng = np.random.default_rng(0)
    n = BATCH * steps
    if vocabulary:
        x = rng.integers(0, vocabulary, size=(n,) + input_shape).astype("int32")
    else:
        x = rng.normal(size=(n,) + input_shape).astype("float32")
    return x, rng.integers(0, 10, size=(n,)).astype("int32")


def callbacks_for(variant, log_dir, sample):
    if variant == "none":
        return []
    if variant == "monitor":
        return [GradientMonitor(log_dir)]
    if variant == "monitor_every_10":
        return [GradientMonitor(log_dir, every_n_steps=10)]
    if variant == "monitor_histograms":
        return [GradientMonitor(log_dir, histograms_every_n_steps=1)]
    if variant == "recipe":
        return [RecipeCallback(log_dir, sample)]
    raise ValueError(variant)


VARIANTS = ("none", "monitor", "monitor_every_10", "monitor_histograms", "recipe")


def run(model_name, steps, rounds, log_root):
    models = {v: build(model_name) for v in VARIANTS}
    _, input_shape, vocabulary = models["none"]
    x, y = data(input_shape, vocabulary, steps)
    sample = (x[:BATCH], y[:BATCH])
    medians = {v: [] for v in VARIANTS}
    for round_index in range(rounds):
        for variant in VARIANTS:
            model = models[variant][0]
            timer = StepTimer()
            log_dir = os.path.join(log_root, f"{model_name}_{variant}_{round_index}")
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                      callbacks=callbacks_for(variant, log_dir, sample) + [timer])
            medians[variant].append(np.median(timer.step_times()))
    base = np.median(medians["none"])
    params = models["none"][0].count_params()
    variables = len(models["none"][0].trainable_variables)
    print(f"\n{model_name}: {params:,} parameters, {variables} variables, batch {BATCH}, "
          f"{steps} steps x {rounds} rounds; median step of 'none' {base * 1e3:.2f} ms")
    for variant in VARIANTS:
        ms = np.median(medians[variant]) * 1e3
        ratios = ", ".join(f"{m / b:.3f}" for m, b in zip(medians[variant], medians["none"]))
        print(f"  {variant:20s} {ms:8.2f} ms  {ms / (base * 1e3):6.3f}x   (per round: {ratios})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default="mlp,cnn,lstm")
    args = parser.parse_args()
    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__}, devices "
          f"{[d.device_type for d in tf.config.list_logical_devices()]}")
    with tempfile.TemporaryDirectory() as log_root:
        for name in args.models.split(","):
            run(name, args.steps, args.rounds, log_root)


if __name__ == "__main__":
    main()
