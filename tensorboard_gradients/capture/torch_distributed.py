"""Where a PyTorch model's gradients lie over the processes, and how a logged step of them
reaches the one that writes: the distributed engines behind the PyTorch monitor (`capture.torch`,
whose documentation says how to call it under each).

Whole on every rank (one process; DistributedDataParallel, whose gradients are all-reduced): rank
0 alone computes and writes (`writes_here`). In pieces (DTensor: FSDP2 ``fully_shard``, tensor
parallel, HSDP meshes; FSDP1 with ``use_orig_params=True``; DeepSpeed ZeRO stages 1-3): every rank
reduces the pieces it holds to a small ``[parameters, k]`` matrix, ONE ``gather`` brings those to
rank 0, which combines them by each reduction's rule (`statistics.combine_shards`), counting
each distinct piece once (`counted_pieces`: replicas hold the same values); no parameter is ever
gathered whole (`Distribution.gather_step`). A clip by the monitor (`Distribution.sharded_clip`)
rides in the same collective, then an all-gather, so that every rank has the total norm.
DeepSpeed is never imported here but for ZeRO-3's ``safe_get_local_grad``.
"""

import dataclasses
import functools
import logging
from typing import Optional

import numpy as np
import torch

from tensorboard_gradients.capture import torch_clip
from tensorboard_gradients.capture.torch_ops import TorchOps, ops_for
from tensorboard_gradients.format import statistics

logger = logging.getLogger(__name__)


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


def _holds_partial_sums(tensor) -> bool:
    """Whether DTensor ``tensor`` has pending partial sums (its pieces are not its values)."""
    return any(isinstance(p, _dtensor_types()[1]) for p in tensor.placements)


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
    if _holds_partial_sums(tensor):
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


def _key_columns(keys):
    """``[len(keys), _PIECE_KEY_WIDTH]`` float64: the pieces' keys, NaN for None (off the mesh:
    not counted)."""
    return torch.tensor([[float("nan")] * _PIECE_KEY_WIDTH if key is None
                         else list(map(float, key)) for key in keys],
                        dtype=torch.float64).reshape(len(keys), _PIECE_KEY_WIDTH)


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


def exact_counts(reductions, entries):
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


def _gather(matrix, device, everywhere=False):
    """Every rank's ``matrix`` stacked ``[ranks, ...]`` as numpy on rank 0 (None on the others;
    on every rank when ``everywhere``: an all-gather): one collective, on the group's CPU
    backend when it has one, else on ``device``."""
    distributed = torch.distributed
    sent = matrix.to(collective_device(_group_device_types(), device))
    rank, world = distributed.get_rank(), distributed.get_world_size()
    received = [torch.empty_like(sent) for _ in range(world)] if rank == 0 or everywhere else None
    if everywhere:
        distributed.all_gather(received, sent)
    else:
        distributed.gather(sent, received, dst=0)
    return torch.stack(received).cpu().numpy() if received is not None else None


def squared_norm(gradient):
    """``||g||²`` in float64 (of a sparse gradient's coalesced values)."""
    if gradient.is_sparse:
        gradient = gradient.coalesce().values()
    return torch.linalg.vector_norm(gradient.detach().to(torch.float64)).square()


def counted_pieces(keys):
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


def _counted_norm(parts):
    """The L2 norm from gathered ``[ranks, pieces, 1 + _PIECE_KEY_WIDTH]`` rows (a piece's squared
    norm, its key), each distinct piece counted once."""
    counted = counted_pieces(parts[:, :, 1:])
    return float(np.sqrt(np.where(counted, parts[:, :, 0], 0.0).sum()))


def writes_here():
    """False on DDP ranks other than 0 (their gradients are rank 0's, all-reduced)."""
    distributed = torch.distributed
    return not (distributed.is_available() and distributed.is_initialized()
                and distributed.get_rank() != 0)


@dataclasses.dataclass(frozen=True)
class GatheredStep:
    """One logged step of parameters in pieces, combined on rank 0."""

    reductions: np.ndarray  # [parameters, statistics.REDUCTIONS] of whole parameters (NaN: missing)
    weight_norms: Optional[np.ndarray]  # [parameters], when the weights are logged
    histograms: Optional[np.ndarray]  # [parameters, bins], when due
    dtype: type  # the numpy float the gradients were reduced in


class Distribution:
    """How the watched parameters of one model lie over the processes (see the module).

    Args:
      model: the model whose parameters are watched, out of its DDP and compile wrappers.
      parameters: the watched ``(name, parameter)`` pairs.
      deepspeed: the DeepSpeed engine around ``model``, or None.

    Raises:
      ValueError: FSDP1 without ``use_orig_params=True``; ZeRO over parameters also split by
        tensor or expert parallelism.
    """

    def __init__(self, model, parameters, deepspeed=None):
        self._parameters = parameters
        self.deepspeed = deepspeed
        self._zero_stage = deepspeed.zero_optimization_stage() if deepspeed else 0
        self._fsdp1 = _fsdp1_pieces(model)
        if self._zero_stage:
            _check_zero_parameters(parameters)
        # Fixed for the parameters held: sharding later makes new ones (see `check`).
        self._in_pieces = (bool(self._fsdp1) or self._zero_stage > 0
                           or any(_is_dtensor(p) for _, p in parameters))

    def full_shape(self, parameter):
        """The shape of the whole ``parameter`` (FSDP1 and ZeRO-3 leave a piece in its place)."""
        if id(parameter) in self._fsdp1:
            return self._fsdp1[id(parameter)].shape
        return tuple(parameter.ds_shape) if self._zero_stage == 3 else tuple(parameter.shape)

    def accumulating(self):
        """Whether DeepSpeed is inside a gradient accumulation: the gradients are not complete."""
        engine = self.deepspeed
        return engine is not None and not engine.is_gradient_accumulation_boundary()

    def in_pieces(self):
        """Whether any watched parameter is split over the ranks (`gather_step` logs them)."""
        return self._in_pieces

    def check(self, sizes, in_pieces):
        """Raises ValueError for a setup the monitor would log wrongly or hang on: a parameter
        sharded after the monitor was made (FSDP1 wrapping afterwards: its gradient no longer
        has the parameter's ``sizes``), or ranks watching different parameters (pipeline
        stages: their matrices could not be gathered). Collective when ``in_pieces``."""
        if not in_pieces:
            for (name, parameter), size in zip(self._parameters, sizes):
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

    def loss_scale(self):
        """DeepSpeed fp16's current loss scale (its gradients stay multiplied by it until
        ``engine.step()``), or None."""
        engine = self.deepspeed
        if engine is None or not engine.fp16_enabled():
            return None
        return float(engine.optimizer.loss_scale)

    @torch.no_grad()  # so that a DTensor's local piece is its own tensor, scaled in place
    def sharded_clip(self, parameters, max_norm, norm_type, error_if_nonfinite, foreach,
                     clipped_norm) -> Optional[torch_clip.ShardedClip]:
        """The clip of ``parameters``' gradients (a list, the same on every rank) that shares
        the logged step's gather (`gather_step`'s ``clip``); None where PyTorch's own clip
        (or FSDP1's) must do it: a norm other than L2 (the monitor logs L2 norms), a sparse
        gradient, a DTensor gradient with pending partial sums (its pieces are not yet its
        values), DeepSpeed (it clips inside its step)."""
        if norm_type != 2.0 or self._zero_stage:
            return None
        pieces, keys, mesh = [], [], None
        for parameter in parameters:
            gradient = parameter.grad
            if gradient is None:
                pieces.append(None)
                keys.append(None)
                continue
            if gradient.is_sparse:
                return None
            if _is_dtensor(gradient):
                if _holds_partial_sums(gradient):
                    return None
                mesh = mesh or gradient.device_mesh
            piece, key = self._pieces(parameter)[0]
            pieces.append(piece)
            keys.append(key)
        return torch_clip.ShardedClip(
            norms=None, watched=None, clipped=pieces, max_norm=max_norm, total=None,
            foreach=foreach, refused=False, clipped_norm=clipped_norm, keys=keys,
            error_if_nonfinite=error_if_nonfinite, mesh=mesh)

    def gather_step(self, step, gradient_stats, logs_weights, histograms,
                    clip=None) -> Optional[GatheredStep]:
        """Every rank reduces its pieces of the ``gradient_stats`` (and the weights' squares
        when ``logs_weights``, the histograms when ``histograms``); ONE gather brings them to
        rank 0, which combines them. None on the other ranks, and on rank 0 when the ranks sent
        different steps (logged as an error: that step is left out, not mixed).

        ``clip``: a `sharded_clip` whose pieces' squared norms travel in the same collective,
        then an all-gather, so every rank settles the same total norm from the distinct
        pieces (whatever the steps sent)."""
        pieces = [self._pieces(p) for _, p in self._parameters]
        present = [g[0] for g, _ in pieces if g is not None]
        dtype = TorchOps.computation_dtype([g.dtype for g in present] or [torch.float32])
        device = present[0].device if present else pieces[0][1][0].device
        ops = ops_for(device)
        entries = [None if g is None else (g[0].reshape(-1).to(device=device, dtype=dtype),
                                           g[0].numel()) for g, _ in pieces]
        scale = self.loss_scale()
        if scale:
            entries = [None if e is None else (e[0] / scale, e[1]) for e in entries]
        if present:
            reductions, _ = statistics.reduction_matrix(ops, entries, dtype, gradient_stats)
        else:
            reductions = torch.full((len(entries), len(statistics.REDUCTIONS)), float("nan"))
        # Without weight norms to log, zeros keep the gathered matrix's shape.
        weight_squares = (ops.square_sums([w.to(device=device, dtype=dtype) for _, (w, _) in pieces])
                          if logs_weights else torch.zeros(len(pieces), device=device))
        columns_sent = [torch.full((len(pieces), 1), float(step), dtype=torch.float64),
                        exact_counts(reductions.to(torch.float64).cpu(), entries),
                        weight_squares.to(torch.float64).cpu()[:, None],
                        _key_columns([key for _, (_, key) in pieces])]
        if histograms:
            columns_sent.append(
                statistics.histogram_matrix(ops, entries, dtype).to(torch.float64).cpu())
        sent = torch.cat(columns_sent, dim=1)
        if clip is None:  # one collective per logged step, on the small matrix, to rank 0
            parts = _gather(sent, device)
        else:
            parts = self._gather_with_clip(sent, clip, device)
        if parts is None:
            return None
        steps = parts[:, 0, 0]
        if (steps != step).any():
            logger.error(
                "step %s not logged: the ranks sent the gradients of steps %s. Every rank must call "
                "GradientMonitor.step() once per optimizer step, with the same step", step,
                sorted(set(steps.astype(int).tolist())))
            return None
        parts = parts[:, :, 1:]
        width = len(statistics.REDUCTIONS)
        counted = counted_pieces(parts[:, :, width + 1:width + 1 + _PIECE_KEY_WIDTH])
        stored = np.float64 if dtype == torch.float64 else np.float32
        counts = None
        if histograms:
            bins = parts[:, :, width + 1 + _PIECE_KEY_WIDTH:]
            counts = np.where(counted[..., None], bins, 0.0).sum(axis=0).astype(stored)
        return GatheredStep(
            reductions=statistics.combine_shards(parts[:, :, :width], counted),
            weight_norms=(np.sqrt(np.where(counted, parts[:, :, width], 0.0).sum(axis=0))
                          if logs_weights else None),
            histograms=counts, dtype=stored)

    @staticmethod
    def _gather_with_clip(sent, clip, device):
        """`gather_step`'s collective carrying ``clip``'s rows too, to every rank, which
        settles its total; returns the step's parts on rank 0 (None elsewhere)."""
        rows = torch.cat([clip.squared_norms()[:, None], _key_columns(clip.keys)], dim=1)
        both = _gather(torch.cat([sent.reshape(-1), rows.reshape(-1)]), device, everywhere=True)
        ranks = len(both)
        clip_parts = both[:, sent.numel():].reshape(ranks, *rows.shape)
        clip.settle(_counted_norm(clip_parts))
        return both[:, :sent.numel()].reshape(ranks, *sent.shape) if writes_here() else None

    def global_norm(self) -> Optional[float]:
        """`GradientMonitor.global_norm` of parameters in pieces: each rank sends the squared
        norms of its pieces with their keys in ONE gather, and rank 0 counts each distinct
        piece once (None on the other ranks)."""
        # Per parameter (gradient piece, key), None where this rank holds none on the mesh.
        held = [g if g is not None and g[1] is not None else None
                for g in (self._pieces(parameter)[0] for _, parameter in self._parameters)]
        squares = torch.tensor([0.0 if g is None else float(squared_norm(g[0])) for g in held],
                               dtype=torch.float64)
        keys = _key_columns([None if g is None else g[1] for g in held])
        parts = _gather(torch.cat([squares[:, None], keys], dim=1), self._parameters[0][1].device)
        return None if parts is None else _counted_norm(parts)

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
