"""Public entry point `tensorboard_gradients.keras`; the implementation and its documentation live
in `tensorboard_gradients.capture.keras` (this module's docstring is that one's)."""

from tensorboard_gradients.capture import keras as _implementation
from tensorboard_gradients.capture.keras import GradientMonitor

__doc__ = _implementation.__doc__
__all__ = ["GradientMonitor"]
