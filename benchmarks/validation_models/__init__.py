"""The models of `benchmarks/validation.py`: each trainer builds one network from a real package's
code or config (Keras applications, `transformers.GPT2Config`, torchvision's ResNet-18 layout),
trains it on seeded synthetic data and logs every step with the project's own monitors.

``keras_cases`` imports TensorFlow/Keras, ``torch_cases`` PyTorch (and `transformers` for the
GPT-2 case); each is imported only when a case of its framework runs. Every trainer has the
signature ``train(log_dir, steps, seed=0, **options) -> dict`` (what it reports about the run:
parameters, final loss) and writes the gradients of run ``log_dir``'s one series ``gradients``.
Nothing is downloaded: ``weights=None`` everywhere, the data is numpy's.
"""
