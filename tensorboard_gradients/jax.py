"""Public entry point `tensorboard_gradients.jax`; the implementation and its documentation live
in `tensorboard_gradients.capture.jax` (this module's docstring is that one's) and
`tensorboard_gradients.capture.optax_monitor` (the optax transformations)."""

from tensorboard_gradients.capture import jax as _implementation
from tensorboard_gradients.capture.jax import log_gradients, named_leaves
from tensorboard_gradients.capture.optax_monitor import (
    GradientMonitorState, StatsNames, clip_by_global_norm, gradient_monitor)

__doc__ = _implementation.__doc__
__all__ = ["GradientMonitorState", "StatsNames", "clip_by_global_norm", "gradient_monitor",
           "log_gradients", "named_leaves"]
