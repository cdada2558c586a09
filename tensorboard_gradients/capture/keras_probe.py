"""The Keras `GradientMonitor`'s probe: the statistics of the compiled loss' gradients on one fixed
batch (``probe_data``), computed outside training with the model's state put back afterwards, so
runs with and without the probe train identically.
"""

import numpy as np
import tensorflow as tf

from tensorboard_gradients.capture import tensorflow_ops


def probe_function(model, watched, histograms):
    """A traced function: statistics of the compiled loss' gradients on one fixed batch."""

    @tf.function
    def probe(x, y, sample_weight):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
        grads = tape.gradient(loss, watched)
        if histograms:
            return tensorflow_ops.gradient_statistics(grads, watched, histograms=True)
        return tensorflow_ops.gradient_statistics(grads, watched), None

    return probe


def run_probe(model, function, batch):
    """Runs `probe_function` with the model's states (BatchNorm, RNG seeds, metrics) restored."""
    state = list({id(v): v for v in model.non_trainable_variables + model.metrics_variables}.values())
    saved = [np.array(v) for v in state]
    try:
        stats, counts = function(*batch)
    finally:
        for variable, value in zip(state, saved):
            variable.assign(value)
    return np.asarray(stats), None if counts is None else np.asarray(counts)
