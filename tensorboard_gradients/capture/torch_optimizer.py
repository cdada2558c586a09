"""What a PyTorch optimizer's step did to each watched parameter, read after the step from the
optimizer itself: the L2 norm of the update (``w_after - w_before``: the ``update_l2_norm``
column) and, for Adam and AdamW, the RMS of ``g / (sqrt(v_hat) + eps)`` (``adam_rms``).

Without a copy of the weights. Taking ``w_before`` would hold a second copy of every watched
weight across the step (a quarter more memory for an Adam model); instead the update is
rebuilt, after the step, from what the optimizer keeps (its moments or momentum buffer, its step
count, the hyper-parameters of the parameter's group) and the weights after the step, by the
update formulas of `torch.optim.SGD`, `torch.optim.Adam` and `torch.optim.AdamW` (their
``_single_tensor_*`` implementations; the foreach and fused ones compute the same). Weight decay
is undone exactly: a decoupled decay scaled ``w_before`` by ``1 - lr * wd`` and an L2 decay
added ``wd * w_before`` to the gradient, and ``w_before`` follows from ``w_after`` and the
update. The work is a few element-wise passes per parameter, one parameter at a time, on the
steps that are logged. The result equals ``w_after - w_before`` up to rounding
(`tests/test_torch_optimizer.py` compares it with copies taken around real steps).

Other optimizers have other formulas (and their subclasses may change them): their updates are
not rebuilt, and the monitor says so once (`GradientMonitor`).
"""

import math
from typing import Optional

import numpy as np
import torch

# Exact types: a subclass may override ``step`` with another update.
ADAM_FAMILY = (torch.optim.Adam, torch.optim.AdamW)
REBUILT = ADAM_FAMILY + (torch.optim.SGD,)
_NAN = torch.tensor(math.nan, dtype=torch.float64)


def rebuilds_updates(optimizer) -> bool:
    """Whether `OptimizerReader` rebuilds this optimizer's updates."""
    return type(optimizer) in REBUILT


def reads_adam_moments(optimizer) -> bool:
    """Whether the optimizer keeps Adam's second moment (``adam_rms`` can be read)."""
    return type(optimizer) in ADAM_FAMILY


def _real(tensor):
    """A complex tensor's entries as real pairs (torch.optim does the same), else itself."""
    return torch.view_as_real(tensor) if tensor is not None and tensor.is_complex() else tensor


def _value(number):
    """A hyper-parameter or step count that may be a (capturable, device) tensor, as a float."""
    return float(number.item() if isinstance(number, torch.Tensor) else number)


class OptimizerReader:
    """Reads, after each optimizer step, the update and (Adam) preconditioned-gradient RMS of the
    watched ``parameters`` (in the monitor's order)."""

    def __init__(self, optimizer, parameters, adam=True):
        self.optimizer = optimizer
        self._adam_family = reads_adam_moments(optimizer)
        self.adam = adam and self._adam_family  # adam_rms logged
        self.readable = True  # False: its state holds pieces of the parameters (sharding)
        self._parameters = list(parameters)
        groups = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        self._groups = [groups.get(id(p)) for p in self._parameters]

    def columns(self, dtype) -> np.ndarray:
        """``[parameters, 2]`` on the host, in ``dtype``: per parameter the update's L2 norm and
        the Adam RMS (NaN for a parameter the optimizer does not hold or did not step, and for
        the RMS of a non-Adam optimizer)."""
        # ``optimizer.state`` is a defaultdict: ``get`` leaves it as it was.
        rows = []
        for parameter, group in zip(self._parameters, self._groups):
            state = self.optimizer.state.get(parameter, {}) if group is not None else None
            # Stepped: it had a gradient (Adam has state from its first step; SGD without
            # momentum keeps none).
            if state is None or parameter.grad is None or (self._adam_family and "step" not in state):
                rows.append(torch.stack([_NAN, _NAN]))
                continue
            # Half precision is widened: the update is a small difference of moments.
            compute = torch.promote_types(_real(parameter).dtype, torch.float32)
            if self._adam_family:
                update, rms = self._adam(parameter, group, state, compute)
            else:
                update, rms = self._sgd(parameter, group, state, compute), _NAN
            norm = torch.linalg.vector_norm(update.to(torch.float64))
            rows.append(torch.stack([norm, rms.to(norm.device)]))
        # One copy to the host (a model split over devices is gathered on the first).
        device = next((row.device for row in rows if row.device.type != "cpu"), "cpu")
        return torch.stack([row.to(device) for row in rows]).cpu().numpy().astype(dtype)

    @staticmethod
    def _adam(parameter, group, state, compute):
        """(update tensor, RMS of g / (sqrt(v_hat) + eps)) of Adam / AdamW's last step."""
        as_compute = lambda t: _real(t).to(compute)  # noqa: E731 (four uses, one line)
        weight, gradient = as_compute(parameter.detach()), as_compute(parameter.grad.detach())
        moment = as_compute(state["exp_avg"])
        second = as_compute(state["max_exp_avg_sq" if group["amsgrad"] else "exp_avg_sq"])
        step = _value(state["step"])
        beta1, beta2 = (_value(b) for b in group["betas"])
        lr, eps, decay = _value(group["lr"]), _value(group["eps"]), _value(group["weight_decay"])
        denominator = second.sqrt() / math.sqrt(1 - beta2**step) + eps
        adam_step = moment / denominator * (lr / (1 - beta1**step))
        decoupled = group.get("decoupled_weight_decay", False)
        shrink = lr * decay if decoupled else 0.0
        # w_after = (1 - shrink) * w_before - adam_step, so the update w_after - w_before is
        # -(adam_step + shrink * w_after) / (1 - shrink).
        update = (adam_step + shrink * weight) / (1 - shrink)
        rms = torch.sqrt(torch.mean((gradient / denominator).to(torch.float64) ** 2))
        return update, rms

    @staticmethod
    def _sgd(parameter, group, state, compute):
        """The update tensor (its sign aside) of SGD's last step."""
        weight = _real(parameter.detach()).to(compute)
        lr, decay = _value(group["lr"]), _value(group["weight_decay"])
        momentum = _value(group["momentum"])
        buffer = state.get("momentum_buffer")
        if momentum and buffer is not None and not group["nesterov"]:
            return lr * _real(buffer).to(compute)  # the buffer holds the decay's term already
        gradient = _real(parameter.grad.detach()).to(compute)
        if group["maximize"]:
            gradient = -gradient
        if momentum and buffer is not None:  # Nesterov: g + wd w_before + momentum * buffer
            gradient = gradient + momentum * _real(buffer).to(compute)
        # lr * (g' + wd * w_before), with w_before = w_after + that update.
        return lr * (gradient + decay * weight) / (1 - lr * decay)


def optimizer_note(optimizer) -> Optional[str]:
    """Why the updates of ``optimizer`` are not logged (None: they are)."""
    if rebuilds_updates(optimizer):
        return None
    return (f"the updates of {type(optimizer).__name__} are not logged: they are rebuilt from "
            f"the optimizer's state for torch.optim.SGD, Adam and AdamW only; its gradients and "
            f"weights are")
