"""Clipping a PyTorch model's gradients as its sharding needs, for
`GradientMonitor.clip_grad_norm_`: PyTorch's ``clip_grad_norm_`` over the model's parameters
(plain tensors, DDP replicas, and DTensors of FSDP2, HSDP and tensor parallel, whose norms it
reduces over the ranks), or an FSDP1 model's own method (PyTorch's function would see only this
rank's flat shards)."""

import torch


def _fsdp1_type():
    """FSDP1's module class (an empty tuple, which nothing is an instance of, without it)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return ()
    return FullyShardedDataParallel


def clip_grad_norm_(model, max_norm: float, norm_type: float, error_if_nonfinite: bool,
                    foreach) -> torch.Tensor:
    """Clips all of ``model``'s gradients in place, as ``torch.nn.utils.clip_grad_norm_(
    model.parameters(), ...)``; returns the total norm before clipping."""
    if isinstance(model, _fsdp1_type()):
        total = model.clip_grad_norm_(max_norm, norm_type)
        if error_if_nonfinite and not torch.isfinite(total):  # FSDP1's method has no such check
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                               "`parameters` is non-finite, so it cannot be clipped")
        return total
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, norm_type,
                                          error_if_nonfinite, foreach)
