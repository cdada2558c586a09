"""Public entry point `tensorboard_gradients.transformers`; the implementation and its
documentation live in `tensorboard_gradients.capture.transformers` (this module's docstring is
that one's)."""

from tensorboard_gradients.capture import transformers as _implementation
from tensorboard_gradients.capture.transformers import GradientMonitorCallback

__doc__ = _implementation.__doc__
__all__ = ["GradientMonitorCallback"]
