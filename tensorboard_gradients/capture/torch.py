"""`GradientMonitor` for PyTorch: every parameter's gradient statistics, computed on its device.

```python
from tensorboard_gradients.torch import GradientMonitor

writer = SummaryWriter("logs/run1")              # torch.utils.tensorboard, or a path
with GradientMonitor(model, writer) as monitor:
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        writer.add_scalar("loss", loss.item(), step)
        monitor.step(step)    # after backward, before optimizer.step()
        optimizer.step()
# tensorboard --logdir logs   ->  Gradients tab, run "run1"
```

Steps: pass the number you log the same update's loss at, so the loss and the heatmap line up.
Without one, a step is the number of earlier `step` calls: 0, 1, 2, ..., the numbers of
``enumerate(loader)`` (the rule of every integration: docs/guide/steps.md).

Rows are ``model.named_parameters()`` in registration order (input side first for the usual
``nn.Sequential`` / ``__init__`` order); a row's layer is the owning module's path
(``layer1.0.conv1.weight`` -> ``layer1.0.conv1``). Parameters with ``requires_grad=False`` when
the monitor is created (frozen) are not logged; a watched parameter without a gradient at a step
is logged as missing and warned about once.

The statistics of all parameters are computed on their device (six passes per tensor; small
tensors of one size, such as biases and norm scales, stacked and reduced together; the weight
norms in one multi-tensor ``torch._foreach_norm``), and ONE small matrix per logged step is
copied to the host, which checks whether the fast pass can be trusted (the rare step with
NaN/Inf, overflow or underflowing squares takes a masked pass on the device and a second copy)
and finishes the ``[parameters, stats]`` matrix in numpy: no per-parameter ``.item()`` or
``.cpu()``, no other host sync. TensorFlow is never imported.

Order of calls in the usual recipes:

* AMP (``torch.autocast`` + ``GradScaler``): ``scaler.scale(loss).backward()``,
  ``scaler.unscale_(optimizer)``, ``monitor.step(scaler=scaler)`` (unscaled gradients; the scale
  is logged as ``<name>/loss_scale``), ``scaler.step(optimizer)``, ``scaler.update()``. A step
  the scaler skips has Inf/NaN gradients: they are logged as such.
* Clipping: call ``monitor.step()`` before ``clip_grad_norm_`` to log the gradients the model
  produced (pre-clip), or pass what ``clip_grad_norm_`` returns, ``monitor.step(total_norm=...)``,
  which is logged as ``<name>/global_norm_before_clipping`` next to ``<name>/global_norm``.
* Gradient accumulation: call ``monitor.step()`` once per optimizer step (after the last
  ``backward`` of the accumulation), not per ``backward``.
* ``torch.compile``: compile the model, not the monitor; ``step()`` runs eagerly between
  ``backward`` and ``optimizer.step()``.
* DistributedDataParallel: after ``backward`` the gradients are all-reduced, so every rank holds
  the same ones: only rank 0 computes and writes; the other ranks' ``step()`` returns at once.
* Sharded parameters (DTensor: FSDP2 ``fully_shard``, tensor parallel, HSDP meshes; FSDP1
  ``FullyShardedDataParallel(..., use_orig_params=True)``, full or hybrid sharding): every rank
  reduces its own pieces to a small ``[parameters, k]`` matrix, ONE ``gather`` brings those to
  rank 0, which combines them by each statistic's rule (`statistics.combine_shards`: replicas
  counted once) and writes; no parameter is ever gathered whole. Names are the user's (FSDP1's
  ``_fsdp_wrapped_module.`` and activation checkpointing's prefixes are dropped). Create the
  monitor on the wrapped model (FSDP1 replaces each parameter by a view of this rank's part; a
  monitor made before says so at its first step). With gradient accumulation without sync
  (FSDP2 ``set_requires_gradient_sync(False)``, FSDP1 ``no_sync()``) call ``step()`` after the
  last, synchronising ``backward``. Every rank must call ``step()`` at every optimizer step, as
  in the usual loop: the ranks then agree on the logged steps by construction. A rank that skips
  a call leaves the others waiting in a collective (the monitor's gather or the engine's next
  one) until the process group's timeout (``init_process_group(timeout=...)``; NCCL's watchdog)
  fails the job with a timeout error; ranks that pass different ``step`` numbers are not mixed:
  rank 0 logs an error and leaves that step out.
* DeepSpeed: pass the engine ``deepspeed.initialize`` returns, ``GradientMonitor(engine, ...)``,
  and call ``step()`` after every ``engine.backward`` (before ``engine.step()``), on every rank:
  it logs only at the gradient accumulation boundary. Under ZeRO stages 1-3 each rank reduces
  the gradient fragments it holds (stages 1-2: the optimizer's partition; stage 3:
  ``safe_get_local_grad`` without its padding) and rank 0 combines and writes, as above; with
  ZeRO off the gradients are all-reduced and rank 0 alone computes. Names are the model's own.
  Under fp16 the gradients are divided by the optimizer's loss scale, which DeepSpeed only
  removes in ``engine.step()``. Parameters also split by tensor or expert parallelism are
  refused (their fragments' offsets repeat across ranks).
* The gather runs on the CPU when the process group has a CPU backend (gloo), else on the
  accelerator (an NCCL-only group). Every rank must watch the same parameters: ranks that do
  not (pipeline stages) all fail with a ValueError at the first logged step.
"""

import functools
import logging
import re
from typing import Optional

import numpy as np
import torch

from tensorboard_gradients.capture import options
from tensorboard_gradients.format import columns, metadata, statistics
from tensorboard_gradients.format.layout import Layout, MissingGradientWarnings
from tensorboard_gradients.format.writer import GradientWriter, run_directory

logger = logging.getLogger(__name__)

__all__ = ["GradientMonitor"]


class TorchOps(statistics.ArrayOps):
    """`statistics` adapter for PyTorch on one device (`ops_for` makes one per device)."""

    device = torch.device("cpu")

    @staticmethod
    def computation_dtype(dtypes):
        return torch.float64 if torch.float64 in dtypes else torch.float32

    @classmethod
    def to_float(cls, x, dtype):
        return torch.as_tensor(x, device=cls.device).to(dtype)

    @staticmethod
    def constant(value, like):
        return torch.as_tensor(value, dtype=like.dtype, device=like.device)

    numel = staticmethod(lambda x: torch.tensor(x.numel(), dtype=x.dtype, device=x.device))
    static_size = staticmethod(lambda x: x.numel())
    reshape = staticmethod(torch.reshape)
    concat = staticmethod(torch.cat)
    take_rows = staticmethod(
        lambda matrix, indices: matrix[torch.as_tensor(indices, device=matrix.device)])
    sum = staticmethod(lambda x, axis=None: torch.sum(x) if axis is None else torch.sum(x, axis))
    count = staticmethod(lambda mask, like, axis=None: (
        mask.sum() if axis is None else mask.sum(axis)).to(like.dtype))

    @staticmethod
    def max(x, initial, axis=None):
        if axis is None:
            return torch.maximum(x.max(), initial) if x.numel() else initial
        if x.numel() == 0:  # amax has no empty case
            return initial.expand(x.shape[0])
        return torch.maximum(torch.amax(x, axis), initial)

    @staticmethod
    def min(x, initial, axis=None):
        if axis is None:
            return torch.minimum(x.min(), initial) if x.numel() else initial
        if x.numel() == 0:
            return initial.expand(x.shape[0])
        return torch.minimum(torch.amin(x, axis), initial)

    abs = staticmethod(torch.abs)
    sqrt = staticmethod(torch.sqrt)
    isnan = staticmethod(torch.isnan)
    isfinite = staticmethod(torch.isfinite)
    where = staticmethod(torch.where)
    maximum = staticmethod(torch.maximum)
    minimum = staticmethod(torch.minimum)
    all = staticmethod(torch.all)
    shift_right = staticmethod(torch.bitwise_right_shift)
    # index_select on the flat indices: 43 us for 65k entries on CPU, advanced indexing 113 us.
    gather = staticmethod(lambda table, indices: torch.index_select(
        table, 0, indices.reshape(-1)).reshape(indices.shape))
    take_columns = staticmethod(lambda matrix, indices: matrix[:, indices])

    @staticmethod
    def magnitude_bits(x):
        integer = torch.int64 if x.dtype == torch.float64 else torch.int32
        return x.contiguous().view(integer) & torch.iinfo(integer).max

    @staticmethod
    def cond(predicate, true_fn, false_fn):
        return true_fn() if bool(predicate) else false_fn()  # one host sync per logged step

    @staticmethod
    def bincount(indices, length, like):
        return torch.bincount(indices.reshape(-1), minlength=length).to(like.dtype)

    @staticmethod
    def stack(values, axis=0):
        return torch.stack(list(values), dim=axis)

    @classmethod
    def matrix_reductions(cls, matrix, passes):
        # `statistics._matrix_reductions` of a stack of small arrays (an array reduced alone
        # goes to `array_reductions`) with the kernels PyTorch's CPU build runs fast along a
        # dimension, measured on the benchmark MLP (benchmarks/NOTES.md "Overhead (issue 19)"):
        # `amin`/`amax` (aminmax along a dimension is 15x slower) and the zero count from the
        # signs of |g| (count_nonzero and boolean sums along a dimension are 4-8x slower).
        if matrix.numel() == 0:  # amin has no empty case; an empty shard is common (FSDP)
            return super().matrix_reductions(matrix, passes)
        rows, entries = matrix.shape
        on_cpu = matrix.device.type == "cpu"
        count = torch.full((rows,), float(entries), dtype=matrix.dtype, device=matrix.device)
        found = {"count": count}
        if "sum" in passes:
            found["sum"] = matrix.sum(1)
        for name, extreme in (("min", torch.amin), ("max", torch.amax)):
            if name in passes:
                found[name] = extreme(matrix, 1)
        if "m2" in passes:
            found["m2"] = (
                # the squares of the deviations from the mean (two-pass), 3x faster on CPU than
                # `torch.var`'s Welford pass; temporaries are cheap in host memory
                cls.sum_of_squares(matrix - (found["sum"] / count)[:, None], 1)
                if on_cpu else torch.var(matrix, dim=1, correction=0) * count)
        # Off the CPU: one kernel each, no gradient-sized temporary on the accelerator.
        magnitude = matrix.abs() if on_cpu and {"sum_abs", "zeros"} & set(passes) else None
        if "sum_abs" in passes:
            found["sum_abs"] = (magnitude.sum(1) if on_cpu
                                else torch.linalg.vector_norm(matrix, 1, dim=1))
        if "zeros" in passes:
            found["zeros"] = count - (magnitude.sign().sum(1) if on_cpu
                                      else torch.count_nonzero(matrix, dim=1).to(count.dtype))
        if "sum_squares" in passes:
            found["sum_squares"] = cls.sum_of_squares(matrix, 1)
        return tuple(found[name] for name in passes)

    @staticmethod
    def sum_of_squares(matrix, axes):
        return torch.linalg.vector_norm(matrix, dim=axes) ** 2  # no squared temporary

    @classmethod
    def pass_rows(cls, values, passes):
        if tuple(passes) == _REQUIRED_PASSES:
            return cls._required_pass_rows(values)
        return super().pass_rows(values, passes)

    @staticmethod
    def array_reductions(array, passes):
        """`statistics.ArrayOps.array_reductions`, a kernel each. On CPU: the deviations'
        squares, the sum of |x| and the nonzero count as BLAS dot products (sign(x).x and
        sign(x).sign(x): exact products, and the count an exact integer sum up to 2**24 entries
        in float32; 8 us each for 65k entries, where abs().sum() takes 31 us and
        count_nonzero 42)."""
        flat = array.reshape(-1)  # a view of a contiguous gradient
        on_cpu = flat.device.type == "cpu"
        entries = flat.numel()
        found = {}
        if "sum" in passes:
            found["sum"] = flat.sum()
        if "min" in passes or "max" in passes:
            found["min"], found["max"] = torch.aminmax(flat)
        if "m2" in passes:
            if on_cpu:  # two-pass (see `statistics`); 10x faster on CPU than torch.var's Welford
                deviations = torch.sub(flat, found["sum"], alpha=1 / entries)  # one kernel
                found["m2"] = torch.dot(deviations, deviations)
            else:  # one kernel, no gradient-sized temporary on the accelerator
                found["m2"] = torch.var(flat, correction=0) * entries
        if {"sum_abs", "zeros"} & set(passes):
            exact_count = on_cpu and entries <= 2 / torch.finfo(flat.dtype).eps  # 2**24 in float32
            signs = torch.sign(flat) if on_cpu else None
            if "sum_abs" in passes:
                found["sum_abs"] = (torch.dot(signs, flat) if on_cpu
                                    else torch.linalg.vector_norm(flat, 1))
            if "zeros" in passes:
                found["nonzeros"] = (torch.dot(signs, signs) if exact_count
                                     else torch.count_nonzero(flat).to(flat.dtype))
        if "sum_squares" in passes:
            found["sum_squares"] = torch.dot(flat, flat)
        return found

    @classmethod
    def _required_pass_rows(cls, values):
        # The required stats alone (squares, min, max): one multi-tensor norm for all arrays and
        # one `aminmax` each, stacked once: 0.4-0.5 ms for the benchmark MLP's 28 gradients on
        # CPU, against 1.0-1.1 ms through the grouped path, whose fixed cost per group (a stack,
        # a count, a concat) outweighs the passes there (benchmarks/NOTES.md "stats=").
        like = values[0]
        infinity = torch.tensor(float("inf"), dtype=like.dtype, device=like.device)
        extremes = [torch.aminmax(v) if v.numel() else (infinity, -infinity) for v in values]
        found = {
            "count": torch.tensor([float(v.numel()) for v in values], dtype=like.dtype,
                                  device=like.device),
            "min": torch.stack([low for low, _ in extremes]),
            "max": torch.stack([high for _, high in extremes]),
            "sum_squares": torch.stack(torch._foreach_norm(values, 2)) ** 2,
        }
        return torch.stack([found[name] for name in _REQUIRED_PASSES], dim=1)

    @staticmethod
    def square_sums(arrays):
        return torch.stack(list(torch._foreach_norm(arrays, 2))) ** 2


_REQUIRED_PASSES = statistics.passes_for(columns.REQUIRED_STATS)


def _on(tensor, device, dtype):
    """``tensor.to(device, dtype)`` without the call when it is there already: a per-parameter
    no-op that still costs a dispatch."""
    if tensor.device == device and tensor.dtype == dtype:
        return tensor
    return tensor.to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=None)
def ops_for(device: torch.device):
    """The `TorchOps` whose constants live on `device`."""
    return type(f"TorchOps[{device}]", (TorchOps,), {"device": device})


def _unwrapped(model):
    """The module whose parameter names users know, inside `DistributedDataParallel` (``.module``)
    and `torch.compile` (``._orig_mod``) wrappers, so rows are not all prefixed ``module.``."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), torch.nn.Module):
            model = model._orig_mod
        else:
            return model


# Wrappers that insert themselves into parameter names: FSDP1, activation checkpointing and
# `torch.compile` on a submodule.
_WRAPPER_PREFIXES = re.compile(
    r"(?:^|(?<=\.))(?:_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.")


def user_parameter_name(name):
    """``_fsdp_wrapped_module.0._checkpoint_wrapped_module.weight`` -> ``0.weight``."""
    return _WRAPPER_PREFIXES.sub("", name)


class _Fsdp1Piece:
    """Where FSDP1 (`FullyShardedDataParallel`, ``use_orig_params=True``) keeps a parameter.

    FSDP1 flattens a module's parameters into one flat parameter, shards that over its process
    group, and leaves each original parameter (and its ``.grad``) as a 1-D view of this rank's
    part of it, empty or None where the part is held elsewhere. The full shape is the handle's.
    """

    def __init__(self, handle, index):
        info = handle.flat_param._shard_param_infos[index]
        self.shape = tuple(handle.flat_param._shapes[index])
        self.in_shard = bool(info.in_shard) or not handle.uses_sharded_strategy
        # Pieces are named by the rank in the shard group: HYBRID_SHARD's replicas share it;
        # NO_SHARD keeps whole replicated parameters.
        self.key = _piece_key(handle.rank if handle.uses_sharded_strategy else -1)


def _fsdp1_pieces(model):
    """``{id(parameter): _Fsdp1Piece}`` for the FSDP1 modules in `model` (empty without them)."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return {}
    pieces = {}
    for module in model.modules():
        handle = getattr(module, "_handle", None) if isinstance(
            module, FullyShardedDataParallel) else None
        if handle is None:
            continue
        if not handle._use_orig_params:
            raise ValueError(
                "FullyShardedDataParallel flattens the parameters of each wrapped module into one "
                "unless it is created with use_orig_params=True: wrap with use_orig_params=True "
                "so the monitor can see each parameter")
        for index, parameter in enumerate(handle.flat_param._params):
            pieces[id(parameter)] = _Fsdp1Piece(handle, index)
    return pieces


def _deepspeed_engine(model):
    """The DeepSpeed engine `model` is (``deepspeed.initialize``'s first result), or None. Found
    by its interface, so DeepSpeed is never imported here."""
    if callable(getattr(model, "zero_optimization_stage", None)) and callable(
            getattr(model, "is_gradient_accumulation_boundary", None)):
        return model
    return None


def _check_zero_parameters(parameters):
    """Refuses what the ZeRO fragment keys cannot tell apart: parameters also split by tensor
    parallelism (Megatron's ``tensor_model_parallel``) or by expert parallelism (MoE experts,
    ``allreduce=False``), whose different slices share offsets on different ranks."""
    split = [name for name, p in parameters if getattr(p, "tensor_model_parallel", False)
             or getattr(p, "allreduce", True) is False]
    if split:
        raise ValueError(
            f"parameters {split[:5]} are split by tensor or expert parallelism as well as by "
            "ZeRO: not supported by the monitor (their statistics would mix different slices)")


def _zero_piece(parameter, stage):
    """(gradient piece, weight piece, key) of a parameter on this rank under DeepSpeed ZeRO stage
    1-3, or None where this rank holds none of it.

    ZeRO partitions the flattened parameters over the data-parallel ranks, so each rank holds a
    contiguous fragment of some parameters; the key is the fragment's offset in the flattened
    parameter (fragments with the same offset on other ranks are replicas, counted once).
    Stages 1-2 keep the averaged gradient fragments in the optimizer (``_hp_mapping``, available
    between ``backward`` and ``step`` at the accumulation boundary); stage 3 keeps each rank's
    padded partition (`deepspeed.utils.safe_get_local_grad`), whose padding is cut off here.
    """
    if stage == 3:
        from deepspeed.utils import safe_get_local_grad

        partition = parameter.ds_tensor.ds_numel
        start = torch.distributed.get_rank(group=parameter.ds_process_group) * partition
        held = max(0, min(partition, parameter.ds_numel - start))
        if not held:
            return None
        gradient = safe_get_local_grad(parameter)
        weight = parameter.ds_tensor.reshape(-1)[:held]
        return (None if gradient is None else gradient.reshape(-1)[:held]), weight, start
    mapping = getattr(parameter, "_hp_mapping", None)
    if mapping is None:
        return None
    address = mapping.lp_fragment_address
    gradient = mapping.get_lp_grad_fragment(parameter._index_in_param_group).reshape(-1)
    if gradient.numel() != address.numel:  # bf16 optimizer: the whole gradient, cut it here
        gradient = gradient.narrow(0, address.start, address.numel)
    return gradient, mapping.lp_fragment.reshape(-1), address.start


@functools.lru_cache(maxsize=None)
def _dtensor_types():
    """(DTensor, Partial, Replicate), or None where this PyTorch has no DTensor."""
    try:
        from torch.distributed.tensor import DTensor, Partial, Replicate
    except ImportError:
        return None
    return DTensor, Partial, Replicate


def _is_dtensor(tensor):
    types = _dtensor_types()
    return types is not None and isinstance(tensor, types[0])


# A piece is named by its coordinates on the mesh dimensions that shard it (-1 elsewhere), in
# this many columns of the gathered matrix: meshes of up to 4 dimensions.
_PIECE_KEY_WIDTH = 4


def _piece_key(*coordinates):
    """The key columns of a piece: its coordinates, padded with -1 to `_PIECE_KEY_WIDTH`."""
    return coordinates + (-1,) * (_PIECE_KEY_WIDTH - len(coordinates))


def _local_piece(tensor):
    """(this rank's piece of a gradient or weight, the key that names the piece).

    Two ranks whose pieces have the same key hold the same values (replicas: DDP/HSDP copies,
    tensor-parallel replicated biases and norms, a data-parallel submesh repeated along another
    dimension), so rank 0 counts each key once. The key is the rank's coordinates on the mesh
    dimensions where the tensor is sharded, -1 on the others; None off the tensor's mesh.
    Pending partial sums are reduced first (a collective every rank runs in the same order). A
    plain tensor next to DTensors is replicated: key all -1.
    """
    if not _is_dtensor(tensor):
        return tensor, _piece_key()
    _, partial, replicate = _dtensor_types()
    if any(isinstance(p, partial) for p in tensor.placements):
        tensor = tensor.redistribute(
            placements=[replicate() if isinstance(p, partial) else p for p in tensor.placements])
    if len(tensor.placements) > _PIECE_KEY_WIDTH:
        raise ValueError(f"meshes of more than {_PIECE_KEY_WIDTH} dimensions are not supported")
    coordinate = tensor.device_mesh.get_coordinate()
    if coordinate is None:
        return tensor.to_local(), None
    # Any placement but Replicate shards (FSDP + TP's `_StridedShard` is not `is_shard()`).
    return tensor.to_local(), _piece_key(*(-1 if isinstance(p, replicate) else c
                                          for c, p in zip(coordinate, tensor.placements)))


def collective_device(device_types, gradients_device):
    """Where the monitor's gather runs, from the default process group's backends' device
    types: the CPU when a backend takes CPU tensors (gloo), else the accelerator (an NCCL-only
    group, the usual GPU setup, has no CPU backend): the gradients' device when it is one."""
    if not device_types or "cpu" in device_types:
        return torch.device("cpu")
    if gradients_device.type in device_types:
        return gradients_device
    return torch.device(device_types[0])


def _group_device_types():
    """The device types the default process group's backends take (``[]`` if it does not say)."""
    group = torch.distributed.distributed_c10d._get_default_group()
    return [device.type for device in getattr(group, "_device_types", ())]


def _exact_counts(reductions, entries):
    """`reduction_matrix` rows (float64) with exact entry counts: they are computed in the
    gradients' dtype, and float32 rounds a piece of more than 2**24 entries, which rank 0 would
    then read as implicit zeros against the parameter's exact size."""
    present = statistics.REDUCTIONS.index("present")
    finite = statistics.REDUCTIONS.index("finite")
    sizes = torch.tensor([float("nan") if e is None else float(e[1]) for e in entries],
                         dtype=torch.float64)
    given = ~torch.isnan(sizes)
    all_finite = reductions[:, finite] == reductions[:, present]
    reductions[:, finite] = torch.where(given & all_finite, sizes, reductions[:, finite])
    reductions[:, present] = torch.where(given, sizes, reductions[:, present])
    return reductions


def _gather_to_rank_zero(matrix, device):
    """Every rank's ``matrix`` stacked ``[ranks, ...]`` as numpy on rank 0 (None on the others):
    one collective, on the group's CPU backend when it has one, else on ``device``."""
    distributed = torch.distributed
    sent = matrix.to(collective_device(_group_device_types(), device))
    rank, world = distributed.get_rank(), distributed.get_world_size()
    received = [torch.empty_like(sent) for _ in range(world)] if rank == 0 else None
    distributed.gather(sent, received, dst=0)
    return torch.stack(received).cpu().numpy() if rank == 0 else None


def _squared_norm(gradient):
    """``||g||²`` in float64 (of a sparse gradient's coalesced values)."""
    if gradient.is_sparse:
        gradient = gradient.coalesce().values()
    return torch.linalg.vector_norm(gradient.detach().to(torch.float64)).square()


def _counted_pieces(keys):
    """``bool[ranks, parameters]`` from the gathered piece keys ``[ranks, parameters, width]``
    (NaN: off the mesh): the first rank holding each distinct piece of a parameter counts.
    Vectorised (one sort): rank 0 runs it on ranks x parameters rows every logged step."""
    ranks, parameters, width = keys.shape
    rank, parameter = np.nonzero(~np.isnan(keys).any(axis=2))
    key = keys[rank, parameter]
    # Sorted by parameter, then key, then rank: each group's first row is its lowest rank.
    order = np.lexsort((rank, *key.T[::-1], parameter))
    parameter, key, rank = parameter[order], key[order], rank[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (parameter[1:] != parameter[:-1]) | (key[1:] != key[:-1]).any(axis=1)
    counted = np.zeros((ranks, parameters), dtype=bool)
    counted[rank[first], parameter[first]] = True
    return counted


def _writes_here():
    """False on DDP ranks other than 0 (their gradients are rank 0's, all-reduced)."""
    distributed = torch.distributed
    return not (distributed.is_available() and distributed.is_initialized()
                and distributed.get_rank() != 0)


class GradientMonitor:
    """Logs per-parameter gradient statistics of a PyTorch model to TensorBoard event files.

    Args:
      model: the `torch.nn.Module` (a `DistributedDataParallel`, FSDP or compiled module, or a
        DeepSpeed engine, works too: see the module).
      log_dir: the run directory, or a `torch.utils.tensorboard.SummaryWriter` whose run the
        gradients should join (next to your scalars). Files are created on the first logged step.
      every_n_steps: log the steps whose number is a multiple of N (1 = every step): by default
        the calls of `step` numbered 0, N, 2N, ... (see `step`).
      histograms_every_n_steps: also log the log10|g| histograms on their own schedule (None:
        never; they cost a pass per parameter).
      name: the summary name = the tag in the Gradients tab.
      include: regular expressions (or a list of them) searched in parameter names: only the
        parameters they match are watched (None: all).
      exclude: the same, for parameters not to watch (``exclude=r"\\.bias$"``).
      strict: raise when the event files cannot be written (a full disk, no permission). By
        default training goes on: the step is dropped, counted (`dropped_steps`) and reported,
        and later steps try again (see `tensorboard_gradients.format.writer`).
      stats: the statistics to log (`columns.selected_stats`): None for all, or some of their
        names; ``("l2_norm",)`` is the cheapest (three passes over each gradient instead of six,
        none over the weights). l2_norm, min, max, abs_max, nan_count, inf_count and size are
        always logged; weight_l2_norm only when named.

    Raises:
      ValueError: a bad argument, or no parameter left to watch.
    """

    def __init__(self, model, log_dir, every_n_steps=1, histograms_every_n_steps=None,
                 name=metadata.DEFAULT_NAME, include=None, exclude=None, strict=False,
                 stats=None):
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        selected = columns.selected_stats(stats)
        self._gradient_stats = columns.gradient_stats(selected)
        self._logs_weights = "weight_l2_norm" in selected
        self.name = options.non_empty_name(name)
        self.every_n_steps = options.positive_int("every_n_steps", every_n_steps)
        self.histograms_every_n_steps = options.optional_positive_int(
            "histograms_every_n_steps", histograms_every_n_steps)
        include, exclude = options.patterns("include", include), options.patterns("exclude", exclude)
        self._deepspeed = _deepspeed_engine(model)
        self._zero_stage = self._deepspeed.zero_optimization_stage() if self._deepspeed else 0
        model = _unwrapped(self._deepspeed.module if self._deepspeed else model)
        self._fsdp1 = _fsdp1_pieces(model)
        self._parameters = [
            (user_parameter_name(parameter_name), parameter)
            for parameter_name, parameter in model.named_parameters()
            if parameter.requires_grad
            and options.selected((user_parameter_name(parameter_name),), include, exclude)
        ]
        if not self._parameters:
            raise ValueError("no trainable parameter left to watch (check include/exclude and "
                             "requires_grad)")
        if self._zero_stage:
            _check_zero_parameters(self._parameters)
        shapes = [self._fsdp1[id(p)].shape if id(p) in self._fsdp1
                  else tuple(p.ds_shape) if self._zero_stage == 3 else tuple(p.shape)
                  for _, p in self._parameters]
        self._sizes = np.array([np.prod(shape) for shape in shapes], dtype=np.float64)
        self._layout = Layout.create([n for n, _ in self._parameters], shapes,
                                     with_weights=self._logs_weights,
                                     gradient_stats=self._gradient_stats)
        self.log_dir = run_directory(log_dir)
        self._writer = None  # created on the first logged step, on the writing rank only
        self._strict = bool(strict)
        self._calls = 0
        self._checked = False
        self._missing = MissingGradientWarnings(logger)

    def step(self, step: Optional[int] = None, *, total_norm=None, scaler=None) -> bool:
        """Logs this optimizer step's gradients if the schedule says so.

        Call after ``loss.backward()`` (and ``scaler.unscale_(optimizer)`` under AMP), before
        ``optimizer.step()``; once per optimizer step.

        Args:
          step: the step to log at: the number your loss scalar of this update is logged at.
            Default: the number of earlier `step` calls (0-based, as ``enumerate(loader)``).
            The schedules log the steps whose number is a multiple of ``every_n_steps`` (and
            of ``histograms_every_n_steps``): ``if step % N == 0``, as loops log their loss.
          total_norm: what ``torch.nn.utils.clip_grad_norm_`` returned (the global norm before
            clipping), logged as ``<name>/global_norm_before_clipping``.
          scaler: the AMP ``GradScaler``; its scale is logged as ``<name>/loss_scale``.

        Returns:
          True if statistics or histograms were written at this step (False when the schedule
          skips it, on ranks other than 0 (DDP and sharded models), and when the write was
          dropped: see ``strict``).
        """
        if self._deepspeed is not None and not self._deepspeed.is_gradient_accumulation_boundary():
            return False  # a micro-batch of an accumulation: its gradients are not complete yet
        step = self._calls if step is None else int(step)
        self._calls += 1
        every_histograms = self.histograms_every_n_steps
        return self.log(step, statistics=step % self.every_n_steps == 0,
                        histograms=every_histograms is not None and step % every_histograms == 0,
                        total_norm=total_norm, scaler=scaler)

    def log(self, step: int, *, statistics=True, histograms=False, total_norm=None,
            scaler=None) -> bool:
        """Logs the gradients now at ``step``, whatever the schedule: the statistics and/or the
        histograms. For integrations with a schedule of their own (and for a step you want
        whatever happens, e.g. the one where the loss jumped); under DDP and sharding every rank
        calls it alike, as `step`. Arguments and result as `step`'s."""
        if not (statistics or histograms):
            return False
        sharded = self._sharded()
        if not self._checked:  # on every rank, so a misuse fails them all, none left waiting
            self._check_sharding(sharded)
            self._checked = True
        if not (sharded or _writes_here()):
            return False
        dropped = self.dropped_steps
        log = self._log_sharded if sharded else self._log
        with torch.no_grad():
            logged = log(int(step), bool(statistics), bool(histograms), total_norm, scaler)
        return logged and self.dropped_steps == dropped

    def write_scalars(self, step: int, scalars) -> None:
        """Writes more ``<name>/<key>`` scalars at ``step`` into the monitor's run, on the
        process that writes (rank 0; nothing elsewhere)."""
        if _writes_here():
            self._run_writer().write_scalars(step, scalars)

    def write_epoch(self, step: int, epoch: int) -> None:
        """Marks the start of ``epoch`` at ``step`` for the tab (on the writing process)."""
        if _writes_here():
            self._run_writer().write_epoch(step, epoch)

    def global_norm(self) -> Optional[float]:
        """The global L2 norm of the watched parameters' gradients as they are now (after
        clipping, say), on the writing process; None on the others and without gradients.

        Under sharding every rank must call it, as `step`: each sends the squared norms of its
        pieces with their keys in ONE gather, and rank 0 counts each distinct piece once."""
        with torch.no_grad():
            if not self._sharded():
                if not _writes_here():
                    return None
                squares = [_squared_norm(p.grad).cpu() for _, p in self._parameters
                           if p.grad is not None]
                return float(torch.stack(squares).sum().sqrt()) if squares else None
            rows = []
            for _, parameter in self._parameters:
                gradient, _ = self._pieces(parameter)
                if gradient is None or gradient[1] is None:
                    rows.append([0.0] + [float("nan")] * _PIECE_KEY_WIDTH)
                else:
                    piece, key = gradient
                    rows.append([float(_squared_norm(piece))] + list(map(float, key)))
            parts = _gather_to_rank_zero(torch.tensor(rows, dtype=torch.float64),
                                         self._parameters[0][1].device)
            if parts is None:
                return None
            counted = _counted_pieces(parts[:, :, 1:])
            return float(np.sqrt(np.where(counted, parts[:, :, 0], 0.0).sum()))

    def _sharded(self):
        return (bool(self._fsdp1) or self._zero_stage > 0
                or any(_is_dtensor(p) for _, p in self._parameters))

    def _run_writer(self):
        """The run's writer, made on the first write (on the writing rank only)."""
        if self._writer is None:
            self._writer = GradientWriter(self.log_dir, self.name, strict=self._strict)
        return self._writer

    def _check_sharding(self, sharded):
        """Raises ValueError for a setup the monitor would log wrongly or hang on: a parameter
        sharded after the monitor was made (FSDP1 wrapping afterwards), or ranks watching
        different parameters (pipeline stages: their matrices could not be gathered)."""
        if not sharded:
            for (name, parameter), size in zip(self._parameters, self._sizes):
                gradient = parameter.grad
                if gradient is not None and not gradient.is_sparse and gradient.numel() != size:
                    raise ValueError(
                        f"the gradient of {name} has {gradient.numel()} entries, the parameter "
                        f"had {int(size)} when the monitor was created: a sharding wrapper (FSDP1) "
                        "was applied afterwards; create the GradientMonitor on the wrapped model")
            return
        distributed = torch.distributed
        watched = torch.tensor([len(self._parameters), -len(self._parameters)], dtype=torch.int64,
                               device=collective_device(_group_device_types(), torch.device("cpu")))
        distributed.all_reduce(watched, op=distributed.ReduceOp.MAX)
        if int(watched[0]) != -int(watched[1]):
            raise ValueError(
                f"the ranks watch different numbers of parameters ({-int(watched[1])} to "
                f"{int(watched[0])}): every rank must watch the same parameters (pipeline "
                "parallelism, where each rank holds other layers, is not supported)")

    def _entries(self):
        """Per parameter None (no gradient) or (present values, dense size) in one dtype."""
        gradients = [p.grad for _, p in self._parameters]
        scale = self._deepspeed_loss_scale()
        if scale:
            gradients = [None if g is None else g / scale for g in gradients]
        self._missing.warn([n for (n, _), g in zip(self._parameters, gradients) if g is None])
        present = [g for g in gradients if g is not None]
        if not present:
            return None, None
        dtype = TorchOps.computation_dtype([g.dtype for g in present])
        entries = []
        for gradient, size in zip(gradients, self._sizes):
            if gradient is None:
                entries.append(None)
            elif gradient.is_sparse:  # nn.Embedding(sparse=True): repeated rows summed
                values = gradient.coalesce().values()
                entries.append((values.reshape(-1), int(size)))
            else:
                entries.append((gradient, gradient.numel()))
        return entries, dtype

    def _deepspeed_loss_scale(self):
        """DeepSpeed fp16's current loss scale (its gradients stay multiplied by it until
        ``engine.step()``), or None."""
        engine = self._deepspeed
        if engine is None or not engine.fp16_enabled():
            return None
        return float(engine.optimizer.loss_scale)

    def _pieces(self, parameter):
        """((gradient piece, key) or None, (weight piece, key)) of one parameter on this rank."""
        if self._zero_stage:
            piece = _zero_piece(parameter, self._zero_stage)
            if piece is None:  # held by other ranks: counted there
                return None, (parameter.new_zeros(0), None)
            gradient, weight, start = piece
            key = _piece_key(start)
            return (None if gradient is None else (gradient, key)), (weight, key)
        fsdp1 = self._fsdp1.get(id(parameter))
        if fsdp1 is None:
            gradient = None if parameter.grad is None else _local_piece(parameter.grad)
            # Not `.detach()` first: on a DTensor that is a dispatch through its machinery, 10x
            # the cost of taking the local tensor (the monitor runs under `torch.no_grad`).
            return gradient, _local_piece(parameter)
        key = fsdp1.key if fsdp1.in_shard else None
        gradient = None if parameter.grad is None else (parameter.grad, key)
        return gradient, (parameter.detach(), key)

    def _log_sharded(self, step, stats_due, histograms_due, total_norm, scaler):
        """`_log` for sharded parameters (DTensor, FSDP1): every rank reduces its pieces, rank 0
        combines them."""
        pieces = [self._pieces(p) for _, p in self._parameters]
        present = [g[0] for g, _ in pieces if g is not None]
        dtype = TorchOps.computation_dtype([g.dtype for g in present] or [torch.float32])
        device = present[0].device if present else pieces[0][1][0].device
        ops = ops_for(device)
        entries = [None if g is None else (g[0].reshape(-1).to(device=device, dtype=dtype),
                                           g[0].numel()) for g, _ in pieces]
        scale = self._deepspeed_loss_scale()
        if scale:
            entries = [None if e is None else (e[0] / scale, e[1]) for e in entries]
        if present:
            reductions, _ = statistics.reduction_matrix(ops, entries, dtype, self._gradient_stats)
        else:
            reductions = torch.full((len(entries), len(statistics.REDUCTIONS)), float("nan"))
        # Without weight norms to log, zeros keep the gathered matrix's shape.
        weight_squares = (ops.square_sums([w.to(device=device, dtype=dtype) for _, (w, _) in pieces])
                          if self._logs_weights else torch.zeros(len(pieces), device=device))
        keys = [[float("nan")] * _PIECE_KEY_WIDTH if key is None else list(map(float, key))
                for _, (_, key) in pieces]
        columns_sent = [torch.full((len(pieces), 1), float(step), dtype=torch.float64),
                        _exact_counts(reductions.to(torch.float64).cpu(), entries),
                        weight_squares.to(torch.float64).cpu()[:, None],
                        torch.tensor(keys, dtype=torch.float64)]
        if histograms_due:
            columns_sent.append(
                statistics.histogram_matrix(ops, entries, dtype).to(torch.float64).cpu())
        # One collective per logged step, on the small matrix; only rank 0 receives it.
        parts = _gather_to_rank_zero(torch.cat(columns_sent, dim=1), device)
        if parts is None:
            return False
        steps = parts[:, 0, 0]
        if (steps != step).any():
            logger.error(
                "step %s not logged: the ranks sent the gradients of steps %s. Every rank must call "
                "GradientMonitor.step() once per optimizer step, with the same step", step,
                sorted(set(steps.astype(int).tolist())))
            return False
        parts = parts[:, :, 1:]
        width = len(statistics.REDUCTIONS)
        counted = _counted_pieces(parts[:, :, width + 1:width + 1 + _PIECE_KEY_WIDTH])
        combined = statistics.combine_shards(parts[:, :, :width], counted)
        absent = np.isnan(combined[:, statistics.REDUCTIONS.index("present")])
        self._missing.warn([n for (n, _), a in zip(self._parameters, absent) if a])
        sizes = np.where(absent, np.nan, self._sizes)
        weight_norms = (np.sqrt(np.where(counted, parts[:, :, width], 0.0).sum(axis=0))
                        if self._logs_weights else None)
        stored = np.float64 if dtype == torch.float64 else np.float32
        counts = None
        if histograms_due:
            bins = parts[:, :, width + 1 + _PIECE_KEY_WIDTH:]
            counts = np.where(counted[..., None], bins, 0.0).sum(axis=0).astype(stored)
        stats = None
        if stats_due:
            stats = statistics.statistics_from_reductions(
                statistics.NumpyOps, combined, sizes, weight_norms,
                self._gradient_stats).astype(stored)
        return self._write(step, stats, counts, total_norm, scaler)

    def _log(self, step, stats_due, histograms_due, total_norm, scaler):
        entries, dtype = self._entries()
        if entries is None:
            logger.warning("step %s: no watched parameter has a gradient; nothing logged", step)
            return False
        device = next(e[0].device for e in entries if e is not None)
        # A model split over devices is reduced on the first one.
        entries = [None if e is None else (_on(e[0], device, dtype), e[1]) for e in entries]
        ops = ops_for(device)
        counts = None
        if histograms_due:
            counts = statistics.histogram_matrix(ops, entries, dtype).cpu().numpy()
        stats = None
        if stats_due:
            stats = self._statistics(ops, entries, dtype)
        return self._write(step, stats, counts, total_norm, scaler)

    def _statistics(self, ops, entries, dtype):
        """The stats matrix (numpy) with ONE device-to-host copy: the reductions and weight norms
        go to the host, which decides whether they can be trusted (a masked pass on the device
        and a second copy only on the rare step that needs it) and finishes the small matrix."""
        device = ops.device
        passes, _ = statistics.pass_matrix(ops, entries, dtype, self._gradient_stats)
        if self._logs_weights:
            weights = [_on(p, device, dtype) for _, p in self._parameters]  # under no_grad
            passes = torch.cat([passes, ops.square_sums(weights)[:, None]], 1)
        host = passes.cpu().numpy()
        passes, weight_norms = ((host[:, :-1], np.sqrt(host[:, -1])) if self._logs_weights
                                else (host, None))
        sizes = np.array([np.nan if e is None else e[1] for e in entries], dtype=host.dtype)
        # Inf / Inf in rows the check rejects, NaN rows of missing gradients: expected here.
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            # On the host: a few dozen operations on [variables] vectors, each a dispatch (and
            # on an accelerator a launch) on the device.
            rows = statistics.fast_reductions(statistics.NumpyOps, passes, self._gradient_stats)
            scaled, trusted = statistics.checked_fast_rows(
                statistics.NumpyOps, rows, sizes, host.dtype, self._gradient_stats)
            if trusted:
                rows = scaled
            else:
                rows = statistics.masked_reduction_matrix(ops, entries, dtype).cpu().numpy()
            return statistics.statistics_from_reductions(
                statistics.NumpyOps, rows, sizes, weight_norms, self._gradient_stats)

    def _write(self, step, stats, counts, total_norm, scaler):
        """Writes one logged step: statistics (with their scalars) and/or histograms."""
        writer = self._run_writer()
        if stats is None:
            writer.write_histograms(step, self._layout, counts)
        else:
            writer.write_statistics(step, self._layout, stats, counts)
            writer.write_scalars(step, self._scalars(self._layout, stats, total_norm, scaler))
        return True

    @staticmethod
    def _scalars(layout, stats, total_norm, scaler):
        norms = stats[:, columns.position(layout.stats, "l2_norm")]
        scalars = {"global_norm": float(np.sqrt(np.nansum(norms.astype(np.float64) ** 2)))}
        if total_norm is not None:  # a DTensor under sharding: its value is the whole norm
            scalars["global_norm_before_clipping"] = float(
                total_norm.full_tensor() if hasattr(total_norm, "full_tensor") else total_norm)
        if scaler is not None and scaler.is_enabled():
            scalars["loss_scale"] = float(scaler.get_scale())
        return scalars

    @property
    def dropped_steps(self):
        """Logged steps that could not be written (see ``strict``)."""
        return self._writer.dropped_steps if self._writer else 0

    def close(self):
        """Flushes and closes the event file (the monitor can log again afterwards: its writer
        starts a new file)."""
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
