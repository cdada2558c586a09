"""Public entry point `tensorboard_gradients.torch`; the implementation and its documentation live
in `tensorboard_gradients.capture.torch` (this module's docstring is that one's)."""

from tensorboard_gradients.capture import torch as _implementation
from tensorboard_gradients.capture.torch import GradientMonitor

__doc__ = _implementation.__doc__
__all__ = ["GradientMonitor"]
