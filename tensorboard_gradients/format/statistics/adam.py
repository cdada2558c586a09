"""The ``adam_rms`` column's formula, written once over `array_ops.ArrayOps` for every writer
that reads an Adam-family optimizer (PyTorch's `capture.torch_optimizer`, the three Keras
recorders, optax's `capture.optax_monitor.gradient_monitor`).

Per variable, the RMS over its entries of ``g / sqrt(v_hat)``: ``g`` the gradient Adam was given
this step, ``v_hat = v / (1 - beta2^t)`` its bias-corrected second moment, which includes this
step's ``g^2``. As Wortsman et al. define it (arXiv 2304.13013, section 3.4), without Adam's
``eps``: optax's state does not say its ``eps``, and without it the value is the same whichever
framework wrote it. Because ``v >= (1 - beta2) g^2`` (this step's share), each entry's
``g^2 / v_hat`` is at most ``(1 - beta2^t) / (1 - beta2)``: the RMS is bounded (31.6 at beta2
0.999) and well conditioned. An entry whose ``v`` is 0 has had only zero gradients: it counts as
0.
"""

import numpy as np

from tensorboard_gradients.format.statistics.array_ops import numpy_float


def adam_rms(ops, gradients, seconds, correction):
    """``[len(gradients)]``: per variable, ``sqrt(mean(g^2 / v_hat))`` (see the module).

    Args:
      ops: the `ArrayOps` of the arrays.
      gradients: per variable, the gradient ``g`` Adam was given (an array), or None for a
        variable the optimizer did not step (its row is NaN).
      seconds: per variable, Adam's second moment ``v`` (not bias-corrected) after the step, as
        the optimizer divides by it (AMSGrad's running maximum), in the dtype of ``gradients``.
      correction: ``1 - beta2^t`` at the step's count ``t``: a scalar array of that dtype.
    """
    # v = 0 only where every gradient so far was 0: g / sqrt(tiny) is then 0, not 0 / 0.
    tiny = ops.constant(np.finfo(numpy_float(correction.dtype)).tiny, correction)
    present = [i for i, g in enumerate(gradients) if g is not None]
    ratios = [gradients[i] / ops.sqrt(ops.maximum(seconds[i], tiny)) for i in present]
    sums = ops.square_sums(ratios) if ratios else None
    rows = [ops.constant(np.nan, correction)] * len(gradients)
    for k, i in enumerate(present):
        # The moment's static shape is the variable's (a densified sparse gradient's may not be).
        size = ops.constant(max(1, ops.static_size(seconds[i])), correction)
        rows[i] = sums[k] / size
    return ops.sqrt(ops.stack(rows) * correction)
