"""Public entry point `tensorboard_gradients.jax`; the implementation and its documentation live
in `tensorboard_gradients.capture.jax` (this module's docstring is that one's)."""

from tensorboard_gradients.capture import jax as _implementation
from tensorboard_gradients.capture.jax import (
    GradientMonitorState, StatsNames, gradient_monitor, log_gradients, named_leaves)

__doc__ = _implementation.__doc__
__all__ = ["GradientMonitorState", "StatsNames", "gradient_monitor", "log_gradients",
           "named_leaves"]
