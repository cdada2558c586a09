"""One process of a 2-process Hugging Face training with `GradientMonitorCallback` on CPU over
gloo (run by tests/test_transformers_callback.py with the variables torchrun sets: MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK).

Usage: transformers_training.py LOGDIR

Two trainings, one after the other in the same processes (the imports cost more than both):

1. ``LOGDIR/trainer``: the Trainer with FSDP asked for as transformers 5 spells
   ``fsdp="full_shard"`` (``fsdp=True``, ``fsdp_config={"version": 2, "reshard_after_forward":
   True}``), gradient accumulation 2, no clipping. accelerate 1.15 makes FSDP of it only on
   accelerators: on CPU processes the Trainer trains with DDP (``MULTI_CPU``). Rank 0 prints
   ``result: {"distributed_type", "model"}`` (the type of the model callbacks are handed).
2. ``LOGDIR/fsdp2``: since the Trainer cannot shard on CPU, the Trainer's optimizer-step order
   (`Trainer._run_epoch` in transformers 5.18: backward, the norm, ``on_pre_optimizer_step``,
   ``optimizer.step()``, ``on_optimizer_step``, ``zero_grad``, ``global_step += 1``, ``on_log``)
   by hand, through a real `CallbackHandler` with the Trainer's `TensorBoardCallback`, on a model
   sharded by FSDP2 ``fully_shard`` as accelerate shards it: the callback gets the wrapped model,
   as the Trainer hands it under FSDP. Rank 0 prints per step ``result: {"step", "grad_norm"}``,
   the global norm PyTorch computed over the sharded gradients.
"""

import json
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.integrations.integration_utils import TensorBoardCallback
from transformers.trainer_callback import (
    CallbackHandler, DefaultFlowCallback, TrainerControl, TrainerState,
)

from tensorboard_gradients.transformers import GradientMonitorCallback

logdir = sys.argv[1]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
STEPS, LOCAL_BATCH = 3, 2
RESULT = "result:"  # the lines the test reads (the Trainer prints its logs too)


def tiny_gpt2():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                      n_positions=16, bos_token_id=0, eos_token_id=0))


def token_rows(count):
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (8,), generator=generator) for _ in range(count)]


def trainer_run():
    rows = token_rows(world * LOCAL_BATCH * 2 * STEPS)
    data = [{"input_ids": ids, "labels": ids} for ids in rows]
    args = TrainingArguments(
        output_dir=os.path.join(logdir, "trainer"), report_to=["tensorboard"], save_strategy="no",
        disable_tqdm=True, use_cpu=True, logging_steps=1, max_steps=STEPS, max_grad_norm=0.0,
        per_device_train_batch_size=LOCAL_BATCH, gradient_accumulation_steps=2, fsdp=True,
        fsdp_config={"version": 2, "reshard_after_forward": True})
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=data,
                      callbacks=[GradientMonitorCallback()])
    trainer.train()
    if rank == 0:
        print(RESULT, json.dumps({
            "distributed_type": str(trainer.accelerator.distributed_type.value),
            "model": type(trainer.callback_handler.model).__name__}), flush=True)


def fsdp2_run():
    model = tiny_gpt2()
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    args = TrainingArguments(output_dir=os.path.join(logdir, "fsdp2"), report_to=[],
                             use_cpu=True, logging_steps=1, max_steps=STEPS, max_grad_norm=0.0)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero = rank == 0
    state.is_local_process_zero = rank == 0
    handler = CallbackHandler([DefaultFlowCallback(), TensorBoardCallback(),
                               GradientMonitorCallback()], model, None, optimizer, None)
    rows = token_rows(world * LOCAL_BATCH * STEPS)
    control = handler.on_train_begin(args, state, control)
    for step in range(STEPS):
        first = (step * world + rank) * LOCAL_BATCH
        ids = torch.stack(rows[first:first + LOCAL_BATCH])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        control = handler.on_pre_optimizer_step(args, state, control)
        optimizer.step()
        control = handler.on_optimizer_step(args, state, control)
        optimizer.zero_grad()
        state.global_step += 1
        control = handler.on_step_end(args, state, control)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        control = handler.on_log(args, state, control,
                                 logs={"loss": float(mean_loss) / world, "grad_norm": norm})
        if rank == 0:
            print(RESULT, json.dumps({"step": state.global_step, "grad_norm": norm}), flush=True)
    handler.on_train_end(args, state, control)


trainer_run()
fsdp2_run()
dist.barrier()
