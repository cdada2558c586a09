"""Public entry point `tensorboard_gradients.lightning`; the implementation and its documentation
live in `tensorboard_gradients.capture.lightning` (this module's docstring is that one's)."""

from tensorboard_gradients.capture import lightning as _implementation
from tensorboard_gradients.capture.lightning import GradientMonitor

__doc__ = _implementation.__doc__
__all__ = ["GradientMonitor"]
