"""One rank of a small MLP trained with DeepSpeed ZeRO (stage 1, 2 or 3) on CPU with the gradient
monitor, two micro-batches accumulated per optimizer step (run by tests/test_deepspeed.py, one
process per rank, gloo on loopback).

The monitor is called after every ``engine.backward`` as a DeepSpeed loop does, and logs only at
the accumulation boundary. Rank 0 also trains an unsharded copy of the same model on the same
global batches with the monitor: the reference the ZeRO statistics must equal. It prints, per
optimizer step, DeepSpeed's own global gradient norm (``engine.get_global_grad_norm()``) as JSON
lines ``{"step", "engine_norm", "logged"}``.

Usage: deepspeed_training.py STAGE RANK WORLD PORT LOGDIR
STAGE: 1, 2, 3, 1-tp (a tensor-parallel parameter: the monitor must refuse it), or 1-bf16 (stage 1 in bfloat16 with float32 gradient accumulation, DeepSpeed's
BF16 optimizer: there the reference is DeepSpeed's own full gradient, `safe_get_full_grad`,
written by rank 0, since a float32 model's gradients differ from bfloat16 ones).
"""

import copy
import importlib
import json
import os
import sys

variant, rank, world, port, logdir = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                      sys.argv[4], sys.argv[5])
stage, bf16 = int(variant.split("-")[0]), variant.endswith("-bf16")
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from rank_exit import leave_together  # noqa: E402

from tensorboard_gradients import GradientWriter  # noqa: E402
from tensorboard_gradients.torch import GradientMonitor  # noqa: E402

# DeepSpeed's CPU backend compiles a shared-memory all-reduce (C++, ~60 s, needs g++ and ninja)
# at start-up, used only for inference; training over gloo does not need it.
importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None

STEPS, MICRO, ACCUMULATE = 3, 2, 2
deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
# Sizes that do not divide evenly, so ZeRO splits parameters across the ranks at odd offsets.
model = torch.nn.Sequential(torch.nn.Linear(7, 13), torch.nn.Tanh(), torch.nn.Linear(13, 13),
                            torch.nn.Tanh(), torch.nn.Linear(13, 5))
reference = copy.deepcopy(model)
generator = torch.Generator().manual_seed(1)
global_batch = MICRO * ACCUMULATE * world
inputs = torch.randn(STEPS, global_batch, 7, generator=generator)
targets = torch.randn(STEPS, global_batch, 5, generator=generator)
config = {
    "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUMULATE,
    "train_batch_size": global_batch, "zero_optimization": {"stage": stage},
    "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}
if bf16:
    config.update(bf16={"enabled": True}, data_types={"grad_accum_dtype": "fp32"})
    inputs = inputs.to(torch.bfloat16)
engine, *_ = deepspeed.initialize(
    model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config)
if variant == "1-tp":  # a parameter Megatron marks as split by tensor parallelism too
    engine.module[0].weight.tensor_model_parallel = True
    try:
        GradientMonitor(engine, os.path.join(logdir, "sharded"))
    except ValueError as error:
        print(json.dumps({"refused": str(error)}), flush=True)
    sys.exit(0)
monitor = GradientMonitor(engine, os.path.join(logdir, "sharded"))
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
reference_monitor = None
if rank == 0 and not bf16:
    reference_monitor = GradientMonitor(reference, os.path.join(logdir, "reference"))
full_gradients = GradientWriter(os.path.join(logdir, "reference")) if rank == 0 and bf16 else None
for step in range(STEPS):
    logged = []
    for micro in range(ACCUMULATE):
        start = (micro * world + rank) * MICRO
        rows = slice(start, start + MICRO)
        loss = torch.nn.functional.mse_loss(engine(inputs[step, rows]).float(), targets[step, rows])
        engine.backward(loss)
        logged.append(monitor.step())
        if bf16 and engine.is_gradient_accumulation_boundary():  # every rank: a collective each
            named = list(engine.module.named_parameters())
            full = {name: deepspeed.utils.safe_get_full_grad(p).float().numpy() for name, p in named}
            if full_gradients:
                full_gradients.write(step, full, weights={
                    name: p.detach().float().numpy() for name, p in named})
        engine.step()
    if full_gradients:
        print(json.dumps({"step": step, "engine_norm": float(engine.get_global_grad_norm()),
                          "logged": logged}), flush=True)
    elif rank == 0:
        torch.nn.functional.mse_loss(reference(inputs[step]), targets[step]).backward()
        reference_monitor.step()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        print(json.dumps({"step": step, "engine_norm": float(engine.get_global_grad_norm()),
                          "logged": logged}), flush=True)
monitor.close()
for writer in (reference_monitor, full_gradients):
    if writer:
        writer.close()
leave_together(torch.distributed)
