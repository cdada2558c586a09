"""Keras (TensorFlow backend) trainers of the validation set, logged by
`tensorboard_gradients.keras.GradientMonitor` at every step of ``model.fit``."""

import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

from tensorboard_gradients.keras import GradientMonitor  # noqa: E402

from validation_models import data  # noqa: E402

STEPS_PER_EPOCH = 20  # several epochs per run: real fits reshuffle and restart epochs


def _fit(model, x, y, steps, batch, log_dir, optimizer, loss=None, seed=0):
    """Compiles and fits ``model`` for ``steps`` optimizer steps, every one logged; the loss of
    the first and last epoch."""
    keras.utils.set_random_seed(seed)
    model.compile(optimizer=optimizer,
                  loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    epochs = max(1, math.ceil(steps / STEPS_PER_EPOCH))
    n = batch * min(steps, STEPS_PER_EPOCH)
    history = model.fit(x[:n], y[:n], batch_size=batch, epochs=epochs, verbose=0, shuffle=True,
                        callbacks=[GradientMonitor(log_dir)])
    losses = history.history["loss"]
    return {"parameters": int(model.count_params()),
            "variables": len(model.trainable_variables),
            "loss": (float(losses[0]), float(losses[-1]))}


def mobilenet_v2(log_dir, steps, seed=0, batch=32, alpha=0.35):
    """`keras.applications.MobileNetV2(weights=None)` on 32x32x3, 10 classes, Adam(1e-3)."""
    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(input_shape=(32, 32, 3), alpha=alpha, weights=None,
                                           classes=10, classifier_activation=None)
    x, y = data.images(batch * STEPS_PER_EPOCH, seed=seed)
    return _fit(model, x, y, steps, batch, log_dir, keras.optimizers.Adam(1e-3), seed=seed)


def mobilenet_v3_small(log_dir, steps, seed=0, batch=32):
    """`keras.applications.MobileNetV3Small(weights=None)` on 32x32x3 (its own preprocessing
    off: the inputs are already in [-1, 1]), 10 classes, Adam(1e-3)."""
    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV3Small(
        input_shape=(32, 32, 3), weights=None, classes=10, classifier_activation=None,
        include_preprocessing=False)
    x, y = data.images(batch * STEPS_PER_EPOCH, seed=seed)
    return _fit(model, x, y, steps, batch, log_dir, keras.optimizers.Adam(1e-3), seed=seed)


def resnet50_v2(log_dir, steps, seed=0, batch=16):
    """`keras.applications.ResNet50V2(weights=None)` (pre-activation residual blocks with batch
    norm) on 32x32x3, 10 classes, SGD(0.01, momentum 0.9): Goyal et al.'s linear scaling of
    0.1 per 256 examples gives 0.006 for batch 16 (0.05 made the loss climb: not a healthy run)."""
    keras.utils.set_random_seed(seed)
    model = keras.applications.ResNet50V2(input_shape=(32, 32, 3), weights=None, classes=10,
                                          classifier_activation=None)
    x, y = data.images(batch * STEPS_PER_EPOCH, seed=seed)
    return _fit(model, x, y, steps, batch, log_dir,
                keras.optimizers.SGD(0.01, momentum=0.9), seed=seed)


def lstm_text(log_dir, steps, seed=0, batch=32, vocabulary=2000, length=40):
    """A text classifier: Embedding(2000, 64) -> LSTM(64) -> Dense(2) on synthetic tokens,
    Adam(1e-3)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((length,), dtype="int32"),
        keras.layers.Embedding(vocabulary, 64, name="embedding"),
        keras.layers.LSTM(64, name="lstm"),
        keras.layers.Dense(2, name="classifier"),
    ], name="lstm_text")
    x, y = data.token_classes(batch * STEPS_PER_EPOCH, length=length, vocabulary=vocabulary,
                              seed=seed)
    return _fit(model, x, y, steps, batch, log_dir, keras.optimizers.Adam(1e-3), seed=seed)


def deep_sigmoid(log_dir, steps, seed=0, batch=64, depth=12, width=64):
    """The classic vanishing case: ``depth`` sigmoid Dense layers (``sig_0`` input side),
    Glorot init, plain SGD(0.1)."""
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((32,))]
    layers += [keras.layers.Dense(width, activation="sigmoid", name=f"sig_{i}")
               for i in range(depth)]
    layers += [keras.layers.Dense(10, name="out")]
    model = keras.Sequential(layers, name="deep_sigmoid")
    x, y = data.features(batch * STEPS_PER_EPOCH, seed=seed)
    return _fit(model, x, y, steps, batch, log_dir, keras.optimizers.SGD(0.1), seed=seed)


def disconnected_branch(log_dir, steps, seed=0, batch=32):
    """A two-branch functional model whose second branch (``branch_a``, ``branch_b``) reaches
    the head only through ``stop_gradient`` (a misplaced detach): its variables never get a
    gradient. The main branch trains normally (Adam)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((32,))
    main = keras.layers.Dense(64, activation="relu", name="main_a")(inputs)
    main = keras.layers.Dense(64, activation="relu", name="main_b")(main)
    branch = keras.layers.Dense(32, activation="relu", name="branch_a")(inputs)
    branch = keras.layers.Dense(32, activation="relu", name="branch_b")(branch)
    branch = keras.layers.Lambda(keras.ops.stop_gradient, name="detach")(branch)
    merged = keras.layers.Concatenate(name="merge")([main, branch])
    outputs = keras.layers.Dense(10, name="head")(merged)
    model = keras.Model(inputs, outputs, name="disconnected_branch")
    x, y = data.features(batch * STEPS_PER_EPOCH, seed=seed)
    return _fit(model, x, y, steps, batch, log_dir, keras.optimizers.Adam(1e-3), seed=seed)
