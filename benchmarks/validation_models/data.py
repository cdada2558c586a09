"""Seeded synthetic data with a learnable signal (a healthy run's loss must fall)."""

import numpy as np


def images(n, size=32, channels=3, classes=10, seed=0, noise=0.6):
    """``(x float32 [n, size, size, channels] in about [-1, 1], y int64 [n])``: one smooth random
    template per class (4x4 noise upsampled) plus pixel noise."""
    rng = np.random.default_rng(seed)
    coarse = rng.normal(size=(classes, 4, 4, channels))
    templates = np.kron(coarse, np.ones((1, size // 4, size // 4, 1)))
    y = rng.integers(0, classes, size=n)
    x = 0.5 * templates[y] + noise * rng.normal(size=(n, size, size, channels))
    return np.tanh(x).astype("float32"), y.astype("int64")


def features(n, dim=32, classes=10, seed=0, noise=1.0):
    """``(x float32 [n, dim], y int64 [n])``: Gaussian classes around random centres."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim))
    y = rng.integers(0, classes, size=n)
    x = centres[y] + noise * rng.normal(size=(n, dim))
    return x.astype("float32"), y.astype("int64")


def token_classes(n, length=40, vocabulary=2000, classes=2, keywords=20, seed=0):
    """``(tokens int32 [n, length], y int64 [n])``: random tokens; each sequence carries 3 of
    its class's ``keywords`` key tokens at random positions (a bag-of-keywords task)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(keywords * classes, vocabulary, size=(n, length))
    y = rng.integers(0, classes, size=n)
    for i in range(n):
        positions = rng.choice(length, size=3, replace=False)
        x[i, positions] = y[i] * keywords + rng.integers(0, keywords, size=3)
    return x.astype("int32"), y.astype("int64")


def markov_text(n, length=64, vocabulary=256, seed=0):
    """``int64 [n, length]`` from a sparse random Markov chain (each token has 4 likely
    successors): next-token prediction a small language model can learn."""
    rng = np.random.default_rng(seed)
    successors = rng.integers(0, vocabulary, size=(vocabulary, 4))
    out = np.empty((n, length), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocabulary, size=n)
    for t in range(1, length):
        pick = successors[out[:, t - 1], rng.integers(0, 4, size=n)]
        noise = rng.integers(0, vocabulary, size=n)
        out[:, t] = np.where(rng.random(n) < 0.9, pick, noise)
    return out
