"""One rank of a small MLP trained with DeepSpeed ZeRO (stage 1, 2 or 3) on CPU with the gradient
monitor, two micro-batches accumulated per optimizer step (run by tests/test_deepspeed.py, one
process per rank, gloo on loopback).

The monitor is called after every ``engine.backward`` as a DeepSpeed loop does, and logs only at
the accumulation boundary. Rank 0 also trains an unsharded copy of the same model on the same
global batches with the monitor: the reference the ZeRO statistics must equal. It prints, per
optimizer step, DeepSpeed's own global gradient norm (``engine.get_global_grad_norm()``) as JSON
lines ``{"step", "engine_norm", "logged"}``.

Usage: deepspeed_training.py STAGE RANK WORLD PORT LOGDIR
"""

import copy
import importlib
import json
import os
import sys

stage, rank, world, port, logdir = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                    sys.argv[4], sys.argv[5])
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port, DS_ACCELERATOR="cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402

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
engine, *_ = deepspeed.initialize(
    model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config={
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUMULATE,
        "train_batch_size": global_batch, "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True, "steps_per_print": 10**9})
monitor = GradientMonitor(engine, os.path.join(logdir, "sharded"))
reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
reference_monitor = GradientMonitor(reference, os.path.join(logdir, "reference")) if rank == 0 else None
for step in range(STEPS):
    logged = []
    for micro in range(ACCUMULATE):
        start = (micro * world + rank) * MICRO
        rows = slice(start, start + MICRO)
        engine.backward(torch.nn.functional.mse_loss(engine(inputs[step, rows]), targets[step, rows]))
        logged.append(monitor.step())
        engine.step()
    if rank == 0:
        torch.nn.functional.mse_loss(reference(inputs[step]), targets[step]).backward()
        reference_monitor.step()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        print(json.dumps({"step": step + 1, "engine_norm": float(engine.get_global_grad_norm()),
                          "logged": logged}), flush=True)
monitor.close()
if reference_monitor:
    reference_monitor.close()
torch.distributed.barrier()  # the ranks leave together
torch.distributed.destroy_process_group()
