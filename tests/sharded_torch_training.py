"""One rank of a small MLP trained under a PyTorch sharding engine with the gradient monitor
(run by tests/test_torch_sharded.py, one process per rank, gloo on loopback).

Rank 0 also trains an unsharded copy of the same model on the same global batches with the
monitor: the reference the sharded statistics must equal. It prints, per step, the total norm
the engine's own ``clip_grad_norm_`` computed and the reference's (JSON lines ``{"step",
"clip_norm", "reference_norm"}``); ``clip_norm`` is null where PyTorch's ``clip_grad_norm_``
cannot run on the engine's gradients (tensor parallel leaves plain tensors next to DTensors, and
FSDP + TP puts them on two meshes: PyTorch raises in its own norm).

Usage: sharded_torch_training.py ENGINE RANK WORLD PORT LOGDIR
ENGINE: fsdp2 | hsdp | tp | fsdp_tp | fsdp1 | fsdp1_hybrid | fsdp2_accumulate | fsdp1_accumulate
| fsdp2_skip | fsdp2_misnumbered | fsdp2_unequal | ENGINE_clip | fsdp2_clip_every2
| fsdp2_clip_nonfinite
(``*_accumulate``: each rank's batch in two micro-batches, gradients synchronised on the second
``backward`` only; the monitor logs once per optimizer step. ``fsdp2_skip``: rank 1 does not call
``monitor.step()`` at step 1; ``fsdp2_misnumbered``: rank 1 passes another step number there.
``*_clip``: ``monitor.clip_grad_norm_`` instead of ``step``, the reference logging and then
clipping with PyTorch's; the lines also count the collectives the monitor's clip issued
(``collectives``) and, where it can run, PyTorch's own clip of the same gradients afterwards
(``pytorch_collectives``; max_norm 1e9 multiplies them by exactly 1). ``fsdp2_clip_every2``:
the same, logging every 2nd step; ``fsdp2_clip_nonfinite``: at step 1 rank 1 puts a NaN in its
piece of the first weight's gradient and every rank clips with ``error_if_nonfinite=True``,
printing ``{"step", "refused", "unchanged"}`` (the error, and whether its gradient pieces are
bit for bit what they were) and stopping there. GROUP_TIMEOUT_S in the environment sets the process group's timeout, default 60 s.)
"""

import contextlib
import copy
import datetime
import json
import os
import sys

engine, rank, world, port, logdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
clips = "_clip" in engine
every_n_steps = 2 if engine.endswith("_every2") else 1
nonfinite = engine.endswith("_nonfinite")
engine = engine.split("_clip")[0] if clips else engine  # the sharding
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy, fully_shard  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel, RowwiseParallel, parallelize_module,
)

from rank_exit import leave_together  # noqa: E402
from tensorboard_gradients.torch import GradientMonitor  # noqa: E402

@contextlib.contextmanager
def counting_collectives():
    """Counts (in the list yielded) the collectives called inside: c10d's and the functional
    ones DTensor redistributes with."""
    import torch.distributed._functional_collectives as functional

    count, patched = [0], []
    for module, names in ((dist, ("all_reduce", "all_gather", "gather", "broadcast", "reduce",
                                  "all_gather_into_tensor", "reduce_scatter_tensor")),
                          (functional, ("all_reduce", "all_gather_tensor",
                                        "reduce_scatter_tensor", "all_to_all_single"))):
        for name in names:
            original = getattr(module, name)

            def counted(*args, original=original, **kwargs):
                count[0] += 1
                return original(*args, **kwargs)
            patched.append((module, name, original))
            setattr(module, name, counted)
    try:
        yield count
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


STEPS, LOCAL_BATCH = 3, 4
CLIP = 0.05  # the *_clip engines' max_norm: below these gradients' norms, so they are clipped
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=float(os.environ.get("GROUP_TIMEOUT_S", 60))))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 8),
                            torch.nn.Tanh(), torch.nn.Linear(8, 3))
reference = copy.deepcopy(model)
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(STEPS, world * LOCAL_BATCH, 6, generator=generator)
targets = torch.randn(STEPS, world * LOCAL_BATCH, 3, generator=generator)

if engine.startswith("fsdp2"):
    mesh = init_device_mesh("cpu", (world,))
    data_rank, data_ranks = rank, world
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
elif engine in ("fsdp1", "fsdp1_accumulate", "fsdp1_hybrid"):  # FSDP1 wrapping each Linear
    data_rank, data_ranks = rank, world
    hybrid = engine == "fsdp1_hybrid"
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}), use_orig_params=True,
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD if hybrid else ShardingStrategy.FULL_SHARD,
        device_mesh=init_device_mesh("cpu", (2, world // 2)) if hybrid else None)
elif engine == "hsdp":  # replicate x shard: every rank is a data-parallel rank
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    data_rank, data_ranks = rank, world
    fully_shard(model, mesh=mesh)
elif engine == "tp":  # one batch, the hidden layers split column- then row-wise
    mesh = init_device_mesh("cpu", (world,))
    data_rank, data_ranks = 0, 1
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
elif engine == "fsdp_tp":  # data parallel x tensor parallel
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    data_rank, data_ranks = mesh.get_coordinate()[0], world // 2
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
else:
    raise SystemExit(f"unknown engine {engine}")

optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
# fsdp2_unequal: rank 1 watches only the first layer (as a pipeline stage would hold others).
watched = r"^0\." if engine == "fsdp2_unequal" and rank == 1 else None
monitor = GradientMonitor(model, os.path.join(logdir, "sharded"), include=watched,
                          every_n_steps=every_n_steps)
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
reference_monitor = GradientMonitor(reference, os.path.join(logdir, "reference")) if rank == 0 else None
per_data_rank = world * LOCAL_BATCH // data_ranks
for step in range(STEPS):
    rows = slice(data_rank * per_data_rank, (data_rank + 1) * per_data_rank)
    if engine.endswith("_accumulate"):
        half = per_data_rank // 2
        first, second = slice(rows.start, rows.start + half), slice(rows.start + half, rows.stop)
        if engine == "fsdp2_accumulate":
            model.set_requires_gradient_sync(False)
            no_sync = contextlib.nullcontext()
        else:
            no_sync = model.no_sync()
        with no_sync:
            (torch.nn.functional.mse_loss(model(inputs[step, first]), targets[step, first]) / 2
             ).backward()
        if engine == "fsdp2_accumulate":
            model.set_requires_gradient_sync(True)
        (torch.nn.functional.mse_loss(model(inputs[step, second]), targets[step, second]) / 2
         ).backward()
    else:
        torch.nn.functional.mse_loss(model(inputs[step, rows]), targets[step, rows]).backward()
    norm = collectives = pytorch_collectives = None
    if nonfinite and step == 1:
        with torch.no_grad():
            if rank == 1:
                model[0].weight.grad.to_local().view(-1)[0] = float("nan")
            before = [p.grad.to_local().clone() for p in model.parameters()]
        try:
            monitor.clip_grad_norm_(max_norm=CLIP, error_if_nonfinite=True)
            refused = None
        except RuntimeError as error:
            refused = str(error)
        unchanged = all(torch.allclose(b, p.grad.to_local(), rtol=0, atol=0, equal_nan=True)
                        for b, p in zip(before, model.parameters()))
        print(json.dumps({"step": step, "refused": refused, "unchanged": unchanged}), flush=True)
        break
    if clips:  # the monitor logs, then clips the whole model over the ranks
        with counting_collectives() as collectives:
            norm = monitor.clip_grad_norm_(max_norm=CLIP)
            float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # no more
        with counting_collectives() as pytorch_collectives:
            try:
                if engine.startswith("fsdp1"):
                    model.clip_grad_norm_(max_norm=1e9)
                else:
                    total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
                    float(total.full_tensor() if hasattr(total, "full_tensor") else total)
            except (RuntimeError, NotImplementedError, AssertionError):
                pytorch_collectives = None  # PyTorch cannot (two meshes, plain next to DTensor)
    elif engine.startswith("fsdp2") or engine == "hsdp":
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
    elif engine.startswith("fsdp1"):
        norm = model.clip_grad_norm_(max_norm=1e9)
    if engine == "fsdp2_misnumbered" and rank == 1 and step == 1:  # a rank with its own count
        monitor.step(step=101, total_norm=norm)
    elif clips:
        pass
    elif not (engine == "fsdp2_skip" and rank == 1 and step == 1):  # a rank that skips a call
        monitor.step(total_norm=norm)
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0:
        torch.nn.functional.mse_loss(reference(inputs[step]), targets[step]).backward()
        if clips:  # logged before clipping, as the monitor's clip does
            reference_monitor.step()
            reference_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=CLIP)
        else:
            reference_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm=1e9)
            reference_monitor.step(total_norm=reference_norm)
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        value = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        print(json.dumps({"step": step, "clip_norm": None if norm is None else float(value),
                          "reference_norm": float(reference_norm),
                          "collectives": collectives and collectives[0],
                          "pytorch_collectives": pytorch_collectives and pytorch_collectives[0]}),
              flush=True)
monitor.close()
if reference_monitor:
    reference_monitor.close()
leave_together(dist)
