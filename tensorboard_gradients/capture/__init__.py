"""Capture: where gradients are taken from a framework and turned into statistics rows.

One module per framework, each with its array-ops adapter (`format.statistics.ArrayOps`):
`keras` (the `GradientMonitor` callback) with `keras_recorder` (its on-device recorder) and
`keras_probe` (its fixed-batch probe),
`summary` (the TensorFlow summary op) over `tensorflow_ops` (the one TensorFlow adapter, shared
with the Keras recorder), `torch`, `jax`; `options` checks the arguments the monitors share.
Users import these as `tensorboard_gradients.keras`, `.summary`, `.torch` and `.jax`.
Framework modules are imported only when used: `import tensorboard_gradients` stays TF-free.
"""
