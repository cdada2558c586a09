"""Clipping a PyTorch model's gradients as its sharding needs, for
`GradientMonitor.clip_grad_norm_`: PyTorch's ``clip_grad_norm_`` over the model's parameters
(plain tensors, DDP replicas, and DTensors of FSDP2, HSDP and tensor parallel, whose norms it
reduces over the ranks), or an FSDP1 model's own method (PyTorch's function would see only this
rank's flat shards).

For plain tensors the clip is done in two halves (`tensor_norms`, then `PendingClip.run`), the
very operations of ``torch.nn.utils.clip_grad_norm_`` in its order (its ``_get_total_norm`` and
``_clip_grads_with_norm_``): the same bits, and the per-tensor L2 norms of its pass are what the
monitor logs at a norms-only step, so clipping and logging take one pass over the gradients.
The scaling reuses the pass's grouping by device and dtype, and the monitor its list of the
model's parameters, where PyTorch's function walks the modules and groups the gradients twice
per call: its Python, about 0.15 ms a call on the benchmark MLP, pays for the monitor's own
(benchmarks/NOTES.md, "Clip and norms below the clip recipe").

For gradients in pieces (`ShardedClip`: DTensors, FSDP1's shards) the total norm comes with the
logged step: every rank sends its pieces' squared norms in the monitor's gather of that step,
made an all-gather, and computes the total from the distinct pieces, so clipping and logging
share ONE collective where PyTorch's clip and the monitor's gather took two; every rank then
scales its own pieces as ``clip_grads_with_norm_`` does. The total is the same number on every
rank, equal to PyTorch's up to the order of float32 rounding (PyTorch reduces per-rank norms).
"""

import dataclasses
import functools
import types
from typing import Optional

import numpy as np
import torch
from torch.utils._foreach_utils import (
    _device_has_foreach_support, _has_foreach_support)


@functools.lru_cache(maxsize=None)  # asked at every clip
def _fsdp1_type():
    """FSDP1's module class (an empty tuple, which nothing is an instance of, without it)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return ()
    return FullyShardedDataParallel


def is_fsdp1(model) -> bool:
    """Whether ``model`` is an FSDP1 module, which clips by its own method."""
    return isinstance(model, _fsdp1_type())


def clip_grad_norm_(model, parameters, max_norm: float, norm_type: float,
                    error_if_nonfinite: bool, foreach) -> torch.Tensor:
    """Clips the gradients of ``parameters`` in place, as ``torch.nn.utils.clip_grad_norm_(
    parameters, ...)``, or an FSDP1 ``model`` by its own method (all of its parameters);
    returns the total norm before clipping."""
    if is_fsdp1(model):
        total = model.clip_grad_norm_(max_norm, norm_type)
        if error_if_nonfinite and not torch.isfinite(total):  # FSDP1's method has no such check
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from "
                               "`parameters` is non-finite, so it cannot be clipped")
        return total
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite,
                                          foreach)


def tensor_norms(gradients, norm_type: float, foreach):
    """``(total norm, norms, positions, groups)`` of ``gradients`` (plain tensors), computed
    exactly as ``torch.nn.utils.get_total_norm`` computes the total: the same grouping by device
    and dtype, the same multi-tensor (or per-tensor) norms, stacked in the same order into
    ``norms`` (the vector whose norm is the total, on the first gradient's device, in the
    groups' promoted dtype); ``positions[i]`` is gradient i's place in it; ``groups``: per
    group ``(device, its gradients, whether they take the multi-tensor kernels)``, the very
    groups ``torch.nn.utils.clip_grads_with_norm_`` scales (`PendingClip.run`). Raises
    RuntimeError as it does for ``foreach=True`` where the device has no multi-tensor
    kernels."""
    if not gradients:
        return torch.tensor(0.0), torch.zeros(0), [], []
    first_device = gradients[0].device
    norms, order, groups = [], [], []
    # PyTorch's grouping without its Python wrapper's grad-mode switch: grouping records nothing.
    grouped = torch._C._group_tensors_by_device_and_dtype([gradients], True)
    for (device, _), ([tensors], indices) in grouped.items():
        multi_tensor = (foreach is None and _has_foreach_support(tensors, device)) or (
            foreach and _device_has_foreach_support(device))
        if multi_tensor:
            norms.extend(torch._foreach_norm(tensors, norm_type))
        elif foreach:
            raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on "
                               f"{device.type} tensors")
        else:
            norms.extend([torch.linalg.vector_norm(g, norm_type) for g in tensors])
        order.extend(indices)
        groups.append((device, tensors, bool(multi_tensor)))
    if len(groups) == 1:  # one group keeps the gradients' order, on their device
        positions = order
    else:
        norms = [n.to(first_device) for n in norms]
        positions = [0] * len(gradients)
        for place, gradient_index in enumerate(order):
            positions[gradient_index] = place
    stacked = torch.stack(norms)
    return torch.linalg.vector_norm(stacked, norm_type), stacked, positions, groups


def watched_places(parameters, watched):
    """Per ``watched`` (name, parameter) pair its parameter's index in ``parameters``, or None."""
    index = {id(parameter): i for i, parameter in enumerate(parameters)}
    return [index.get(id(parameter)) for _, parameter in watched]


def host_norm(total_norm) -> float:
    """A norm ``clip_grad_norm_`` returned, as a number (a DTensor's value: the whole norm)."""
    if type(total_norm) is not torch.Tensor and hasattr(total_norm, "full_tensor"):
        total_norm = total_norm.full_tensor()
    return float(total_norm)


def check_finite(total, norm_type: float) -> None:
    """PyTorch's ``error_if_nonfinite`` check of a total norm, with its message."""
    if torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is "
            "non-finite, so it cannot be clipped. To disable this error and scale the gradients "
            "by the non-finite norm anyway, set `error_if_nonfinite=False`")


def clip_scalars(total_norm, max_norm: float) -> dict:
    """The scalars of a clip: the total norm it returned and what the gradients were
    multiplied by, ``min(1, max_norm / (total + 1e-6))`` (NaN for a NaN total, as PyTorch's
    clamp gives)."""
    before = host_norm(total_norm)
    coefficient = max_norm / (before + 1e-6)
    return {"global_norm_before_clipping": before,
            "clip_coefficient": 1.0 if coefficient >= 1.0 else coefficient}  # NaN kept


def step_scalars(total_norm, scaler, clip) -> dict:
    """The scalars of a logged step known on the training thread (the global norms come with
    its matrix): a `PendingClip`'s (`clip_scalars`), the norm a clip outside the monitor
    returned (``total_norm``) and an enabled AMP ``scaler``'s loss scale."""
    scalars = clip_scalars(clip.total, clip.max_norm) if clip else {}
    if total_norm is not None:
        scalars["global_norm_before_clipping"] = host_norm(total_norm)
    if scaler is not None and scaler.is_enabled():
        scalars["loss_scale"] = float(scaler.get_scale())
    return scalars


@dataclasses.dataclass
class PendingClip:
    """A clip whose step `GradientMonitor` is logging (`GradientMonitor.clip_and_log`): the
    per-tensor norms of its pass, which a norms-only step logs (``norms``, the vector PyTorch's
    total is the norm of; ``watched``: per watched parameter its place in it, None without a
    gradient), and its scaling of the ``clipped`` parameters' gradients, run once (`run`) as
    soon as the step's gradients are read, before the write: so they are logged as the model
    produced them, and scaled while still in the cache. ``refused``: the total is not finite
    and ``error_if_nonfinite`` asked to raise instead of scaling."""

    norms: Optional[torch.Tensor]
    watched: Optional[list]  # None: the norms are not the monitor's (`shared`)
    clipped: list
    max_norm: float
    total: torch.Tensor
    foreach: object
    refused: bool
    clipped_norm: bool  # also log the watched gradients' norm after clipping
    done: bool = False
    groups: list = None  # `tensor_norms`' groups, which `run` scales

    @classmethod
    def shared(cls, parameters, watched, max_norm, norm_type, error_if_nonfinite, foreach,
               clipped_norm, places=None) -> Optional["PendingClip"]:
        """The clip of the dense gradients of ``parameters`` (a list) whose pass
        (`tensor_norms`) gives the ``watched`` (name, parameter) pairs' norms, under the
        caller's ``no_grad``; None where the monitor leaves the clip to PyTorch's own call: a
        sparse gradient, a norm other than L2 (the monitor logs L2 norms). ``places``: the
        `watched_places` of these ``parameters`` if known (computed at every clip if not)."""
        gradients = [p.grad for p in parameters]
        clipped = parameters
        if any(g is None for g in gradients):
            clipped = [p for p, g in zip(parameters, gradients) if g is not None]
            gradients = [g for g in gradients if g is not None]
            places = None  # among those with a gradient
        if norm_type != 2.0 or any(g.is_sparse for g in gradients):
            return None
        total, norms, _, groups = tensor_norms(gradients, norm_type, foreach)
        # Gradients of several dtypes or devices: their norms, stacked in a promoted dtype,
        # are not what the monitor would compute; it computes its own. One group keeps the
        # gradients' order: a parameter's place in the norms is its place among ``clipped``.
        if len(groups) > 1:
            places = None
        elif places is None:
            places = watched_places(clipped, watched)
        return cls(norms, places, clipped, max_norm, total, foreach,
                   error_if_nonfinite and not bool(torch.isfinite(total)), clipped_norm,
                   groups=groups)

    @property
    def logged_norms(self):
        """``(norms, watched)``, what a norms-only step logs, or None (see ``watched``)."""
        return None if self.watched is None else (self.norms, self.watched)

    def run(self) -> None:
        if not (self.done or self.refused):
            self._scale()
        self.done = True

    def _scale(self) -> None:
        """``torch.nn.utils.clip_grads_with_norm_(clipped, max_norm, total, foreach)``: its
        arithmetic on the groups of the pass (`tensor_norms`), not a second grouping."""
        coefficient = torch.clamp(self.max_norm / (self.total + 1e-6), max=1.0)
        for device, gradients, multi_tensor in self.groups:
            if multi_tensor:
                torch._foreach_mul_(gradients, coefficient.to(device))
            else:
                on_device = coefficient.to(device)
                for gradient in gradients:
                    gradient.mul_(on_device)

    @property
    def returned_total(self):
        """The total norm as ``clip_grad_norm_`` returns it."""
        return self.total


@dataclasses.dataclass
class ShardedClip(PendingClip):
    """A `PendingClip` of gradients in pieces (see the module): ``clipped`` holds this rank's
    piece of each clipped parameter's gradient (None: none here), scaled in place; ``keys``
    name the pieces (`torch_distributed`'s keys: equal keys are replicas, counted once); the
    total is `settle`\'d from the gather of the logged step, None until then (a step the monitor
    does not log is clipped by PyTorch's own function). ``mesh``: the DTensor gradients' device
    mesh, on which the total is returned replicated (a DTensor, as PyTorch's is), or None."""

    keys: list = None
    error_if_nonfinite: bool = False
    mesh: object = None

    def squared_norms(self) -> torch.Tensor:
        """``[clipped]`` float64 on the CPU: each piece's squared L2 norm (0 where none),
        its norm computed as ``clip_grad_norm_`` computes a tensor's."""
        present = [i for i, piece in enumerate(self.clipped) if piece is not None]
        squares = torch.zeros(len(self.clipped), dtype=torch.float64)
        if present:
            _, norms, positions, _ = tensor_norms([self.clipped[i] for i in present], 2.0,
                                                  self.foreach)
            squares[present] = norms.cpu().to(torch.float64)[positions] ** 2  # one host copy
        return squares

    def settle(self, total: float) -> None:
        """Takes the total norm over the ranks (the same on every rank), in the gradients'
        dtype and on their device, as PyTorch's."""
        present = [piece for piece in self.clipped if piece is not None]
        dtype = functools.reduce(torch.promote_types, [p.dtype for p in present] or [torch.float32])
        device = (present[0].device if present  # a rank holding no piece: the mesh's device
                  else torch.device(self.mesh.device_type if self.mesh else "cpu"))
        self.total = torch.tensor(total, dtype=dtype, device=device)
        self.refused = self.error_if_nonfinite and not np.isfinite(total)

    def _scale(self) -> None:
        # PyTorch's scaling (its arithmetic, its grouping), given the pieces where it reads
        # parameters' ``.grad``.
        torch.nn.utils.clip_grads_with_norm_(
            [types.SimpleNamespace(grad=piece) for piece in self.clipped if piece is not None],
            self.max_norm, self.total, self.foreach)

    @property
    def returned_total(self):
        if self.mesh is None:
            return self.total
        from torch.distributed.tensor import DTensor, Replicate

        return DTensor.from_local(self.total, self.mesh, [Replicate()] * self.mesh.ndim,
                                  run_check=False)
