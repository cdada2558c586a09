"""Per-layer gradient statistics for TensorBoard: writers, reader, diagnosis and the plugin.

Importing this package never imports TensorFlow or PyTorch. The TensorFlow summary op lives in
`tensorboard_gradients.summary` and the Keras callback in `tensorboard_gradients.keras`; both are
imported on first attribute access.
"""

import importlib

from tensorboard_gradients.analysis import Alert, Thresholds, classify, diagnose
from tensorboard_gradients.format.metadata import UnsupportedFormatError
from tensorboard_gradients.format.reader import (
    LogdirReport,
    Problem,
    read_logdir,
    read_logdir_report,
)
from tensorboard_gradients.format.series import GradientHistograms, GradientSeries
from tensorboard_gradients.format.writer import GradientWriter

__version__ = "0.1.0"

__all__ = [
    "Alert",
    "GradientHistograms",
    "GradientSeries",
    "GradientWriter",
    "LogdirReport",
    "Problem",
    "Thresholds",
    "UnsupportedFormatError",
    "classify",
    "diagnose",
    "keras",
    "read_logdir",
    "read_logdir_report",
    "summary",
]

# Submodules that import a framework: loaded only when used.
_FRAMEWORK_MODULES = ("summary", "keras")


def __getattr__(name):
    if name in _FRAMEWORK_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
