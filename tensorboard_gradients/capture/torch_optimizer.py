"""What a PyTorch optimizer's step did to each watched parameter, read after the step from the
optimizer itself: the L2 norm of the update (``w_after - w_before``: the ``update_l2_norm``
column) and, for Adam and AdamW, the RMS of ``g / sqrt(v_hat)`` (``adam_rms``,
`statistics.adam_rms`).

Without a copy of the weights. Taking ``w_before`` would hold a second copy of every watched
weight across the step (a quarter more memory for an Adam model); instead the update is
rebuilt, after the step, from what the optimizer keeps (its moments or momentum buffer, its step
count, the hyper-parameters of the parameter's group) and the weights after the step, by the
update formulas of `torch.optim.SGD`, `torch.optim.Adam` and `torch.optim.AdamW` (their
``_single_tensor_*`` implementations; the foreach and fused ones compute the same). Weight decay
is undone exactly: a decoupled decay scaled ``w_before`` by ``1 - lr * wd`` and an L2 decay
added ``wd * w_before`` to the gradient, and ``w_before`` follows from ``w_after`` and the
update. The work is a few multi-tensor (``torch._foreach_*``) passes over the parameters that
share a group and step count, on the steps that are logged: about twice the optimizer's own
step (benchmarks/NOTES.md). The result equals ``w_after - w_before`` up to rounding
(`tests/test_torch_optimizer.py` compares it with copies taken around real steps).

Other optimizers have other formulas (and their subclasses may change them): their updates are
not rebuilt, and the monitor says so once (`GradientMonitor`).
"""

import math
from typing import Optional

import numpy as np
import torch

from tensorboard_gradients.capture.torch_ops import TorchOps
from tensorboard_gradients.format import statistics

# Exact types: a subclass may override ``step`` with another update.
ADAM_FAMILY = (torch.optim.Adam, torch.optim.AdamW)
REBUILT = ADAM_FAMILY + (torch.optim.SGD,)


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
        # Parameters of one group, step count, device and dtype share every scalar of the
        # formula: each such bucket takes a few multi-tensor (``torch._foreach_*``) operations,
        # as the optimizers' own foreach implementations do.
        buckets = {}
        for index, (parameter, group) in enumerate(zip(self._parameters, self._groups)):
            # ``optimizer.state`` is a defaultdict: ``get`` leaves it as it was.
            state = self.optimizer.state.get(parameter, {}) if group is not None else None
            # Stepped: it had a gradient (Adam has state from its first step; SGD without
            # momentum keeps none).
            if state is None or parameter.grad is None or (
                    self._adam_family and "step" not in state):
                continue
            step = _value(state["step"]) if self._adam_family else None
            # Half precision is widened: the update is a small difference of moments.
            compute = torch.promote_types(_real(parameter).dtype, torch.float32)
            key = (id(group), step, parameter.device, compute)
            buckets.setdefault(key, (group, step, compute, []))[3].append((index, parameter, state))
        norms = torch.full((len(self._parameters), 2), math.nan, dtype=torch.float64)
        for group, step, compute, members in buckets.values():
            rebuild = self._adam if self._adam_family else self._sgd
            update_norms, rms = rebuild(group, step, compute, members)
            rows = [index for index, _, _ in members]
            norms[rows, 0] = torch.stack(update_norms).to("cpu", torch.float64)
            if rms is not None:
                norms[rows, 1] = rms.to("cpu", torch.float64)
        return norms.numpy().astype(dtype)

    @staticmethod
    def _adam(group, step, compute, members):
        """The update norms and RMS of g / sqrt(v_hat) (`statistics.adam_rms`) of Adam /
        AdamW's last step."""
        def as_compute(tensors):
            return [_real(t.detach()).to(compute) for t in tensors]
        weights = as_compute(p for _, p, _ in members)
        gradients = as_compute(p.grad for _, p, _ in members)
        moments = as_compute(state["exp_avg"] for _, _, state in members)
        seconds = as_compute(state["max_exp_avg_sq" if group["amsgrad"] else "exp_avg_sq"]
                             for _, _, state in members)
        beta1, beta2 = (_value(b) for b in group["betas"])
        lr, eps, decay = _value(group["lr"]), _value(group["eps"]), _value(group["weight_decay"])
        correction = 1 - beta2**step
        rms = statistics.adam_rms(TorchOps, gradients, seconds, torch.tensor(
            correction, dtype=compute, device=weights[0].device))
        denominators = torch._foreach_sqrt(seconds)
        torch._foreach_div_(denominators, math.sqrt(correction))
        torch._foreach_add_(denominators, eps)
        updates = torch._foreach_div(moments, denominators)
        torch._foreach_mul_(updates, lr / (1 - beta1**step))
        shrink = lr * decay if group.get("decoupled_weight_decay", False) else 0.0
        if shrink:
            # w_after = (1 - shrink) * w_before - adam_step, so the update w_after - w_before
            # is -(adam_step + shrink * w_after) / (1 - shrink).
            torch._foreach_add_(updates, weights, alpha=shrink)
            torch._foreach_div_(updates, 1 - shrink)
        return torch._foreach_norm(updates), rms

    @staticmethod
    def _sgd(group, step, compute, members):
        """The update norms of SGD's last step (and no RMS)."""
        lr, decay = _value(group["lr"]), _value(group["weight_decay"])
        momentum = _value(group["momentum"])
        buffers = [state.get("momentum_buffer") for _, _, state in members]
        if momentum and not group["nesterov"] and all(b is not None for b in buffers):
            # The buffer holds the decay's term already: the update is lr times it.
            return [lr * norm for norm in torch._foreach_norm(
                [_real(b).to(compute) for b in buffers])], None
        directions = [_real(p.grad.detach()).to(compute) for _, p, _ in members]
        if group["maximize"]:
            directions = torch._foreach_neg(directions)
        if momentum:  # Nesterov: g + wd w_before + momentum * buffer
            directions = torch._foreach_add(
                directions, [_real(b).to(compute) for b in buffers], alpha=momentum)
        if decay:
            directions = torch._foreach_add(
                directions, [_real(p.detach()).to(compute) for _, p, _ in members], alpha=decay)
        # lr * (g' + wd * w_before), with w_before = w_after + that update.
        scale = lr / (1 - lr * decay)
        return [scale * norm for norm in torch._foreach_norm(directions)], None


def optimizer_note(optimizer) -> Optional[str]:
    """Why the updates of ``optimizer`` are not logged (None: they are)."""
    if rebuilds_updates(optimizer):
        return None
    return (f"the updates of {type(optimizer).__name__} are not logged: they are rebuilt from "
            f"the optimizer's state for torch.optim.SGD, Adam and AdamW only; its gradients and "
            f"weights are")
