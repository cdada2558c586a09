"""Public entry point `tensorboard_gradients.summary`; the implementation and its documentation live
in `tensorboard_gradients.capture.summary` (this module's docstring is that one's)."""

from tensorboard_gradients.capture import summary as _implementation
from tensorboard_gradients.capture.summary import gradients, gradient_statistics, write_statistics

__doc__ = _implementation.__doc__
__all__ = ["gradients", "gradient_statistics", "write_statistics"]
