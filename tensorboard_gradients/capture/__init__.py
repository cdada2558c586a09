"""Capture: where gradients are taken from a framework and turned into statistics rows.

One module per framework, each with its array-ops adapter (`format.statistics.ArrayOps`):
`keras` (the `GradientMonitor` callback, any Keras 3 backend) with one on-device recorder per
backend behind `keras_hooks` (what they share): `keras_recorder` (TensorFlow), `keras_jax`,
`keras_torch`, and `keras_probe` (its fixed-batch probe, TensorFlow's);
`summary` (the TensorFlow summary op) over `tensorflow_ops` (the one TensorFlow adapter, shared
with the Keras recorder); `torch` (the PyTorch monitor) over `torch_ops` (the one PyTorch adapter,
shared with the Keras recorder on torch) and `torch_distributed` (DDP, and the sharded engines:
each rank reduces its pieces, rank 0 combines them), with the integrations that drive it,
`lightning` (a Lightning callback) and `transformers` (a Trainer callback); `jax` (pytrees and the
optax `gradient_monitor`); `options` checks the arguments the monitors share.
Users import these as `tensorboard_gradients.keras`, `.summary`, `.torch`, `.lightning`,
`.transformers` and `.jax`. Framework modules are imported only when used: `import
tensorboard_gradients` stays TF-free.
"""
