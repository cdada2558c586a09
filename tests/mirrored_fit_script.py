"""Run by test_keras_monitor in a fresh process: two logical CPUs must be set before TF starts."""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import tensorboard_gradients as tg
from tensorboard_gradients.keras import GradientMonitor

logdir = sys.argv[1]
# Four global batches of 16, each split across the two replicas.
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = (x @ rng.normal(size=(6, 1))).astype("float32")
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
keras.utils.set_random_seed(0)
with strategy.scope():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh", name="hidden"), keras.layers.Dense(1, name="out")], name="m")
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[GradientMonitor(logdir, histograms_every_n_steps=2)])
series = tg.read_logdir(logdir)["train"]["gradients"]
reference = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh"), keras.layers.Dense(1)])
reference.set_weights(model.get_weights())
expected = []
for b in range(4):
    xb, yb = x[b * 16:(b + 1) * 16], y[b * 16:(b + 1) * 16]
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(reference(xb) - yb))
    expected.append([np.linalg.norm(g) for g in tape.gradient(loss, reference.trainable_variables)])



np.testing.assert_allclose(series.stat("l2_norm"), np.array(expected), rtol=1e-5)
assert "update_l2_norm" not in series.stat_names
assert series.histograms.steps.tolist() == [1, 3]
print("OK", series.steps.tolist())
