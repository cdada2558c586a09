"""A small LightningModule trained with `tensorboard_gradients.lightning.GradientMonitor` (used by
tests/test_lightning.py: imported for single-process runs, run as one process per rank for DDP
and FSDP on CPU over gloo).

The module measures, independently of the monitor, what it must log at every optimizer step,
and `train` returns it (rank 0; JSON lines ``{"step", ...}`` on stdout when run as a script):

* ``step``: Lightning's logging step at that optimizer step (where ``train_loss`` goes), and
  ``global_step``, ``epoch``: the trainer's at that moment;
* ``norms``: each parameter's gradient norm and ``norm`` their global norm, read in the
  module's own ``on_before_optimizer_step`` (after the callbacks', before clipping);
* ``clipped``: the global norm of the gradients after ``optimizer.step()`` (so after clipping),
  or None when the GradScaler skipped the step (its gradients were not finite);
* ``scale``: the GradScaler's scale at the hook (None without one).

Under FSDP the module sees only its shards, so nothing is measured there: the test compares the
run with a single-process one.

Usage: lightning_training.py CONFIG LOGDIR RANK WORLD PORT
(CONFIG: `train`'s keyword arguments as JSON.)
"""

import datetime
import json
import os
import sys

GROUP_TIMEOUT_S = 60  # the process group's timeout: a hang fails the ranks instead
SAMPLES, GLOBAL_BATCH = 24, 8  # 3 batches per epoch


class Records:
    """What the module measured: `rows`, one per ``on_before_optimizer_step``."""

    def __init__(self):
        self.rows = []


def make_module(records, measure=True, overflow_step=None, manual=False, fused=False):
    """The LightningModule. `overflow_step`: its loss is multiplied by 1e10 at that optimizer
    step (float16 gradients overflow: the GradScaler skips the step). `manual`: manual
    optimization with two optimizers (the first layer's, the others'), both stepped per batch.
    `fused`: a fused SGD (it unscales the gradients in its own step)."""
    import torch
    import lightning.pytorch as pl

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(
                torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 8), torch.nn.Tanh(),
                torch.nn.Linear(8, 3))
            self.automatic_optimization = not manual

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            if self.trainer.global_step == overflow_step:
                loss = loss * 1e10
            if manual:
                optimizers = self.optimizers()
                for optimizer in optimizers:
                    optimizer.zero_grad()
                self.manual_backward(loss)
                for optimizer in optimizers:
                    optimizer.step()
            return loss

        def configure_optimizers(self):
            if manual:
                return (torch.optim.SGD(self.net[0].parameters(), lr=0.05),
                        torch.optim.SGD(self.net[2:].parameters(), lr=0.05))
            return torch.optim.SGD(self.parameters(), lr=0.05, fused=fused or None)

        def _norms(self):
            return [None if p.grad is None else float(p.grad.double().norm())
                    for p in self.parameters()]

        def on_before_optimizer_step(self, optimizer):
            if not measure:
                return
            norms = self._norms()
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            records.rows.append({
                "step": self.trainer.fit_loop.epoch_loop._batches_that_stepped,
                "global_step": self.trainer.global_step, "epoch": self.trainer.current_epoch,
                "norms": norms, "norm": sum(n * n for n in norms if n is not None) ** 0.5,
                "scale": None if scaler is None else float(scaler.get_scale()), "clipped": None,
            })

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            scaler = getattr(self.trainer.precision_plugin, "scaler", None)
            before = None if scaler is None else scaler.get_scale()
            super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
            if measure and (scaler is None or scaler.get_scale() >= before):  # not skipped
                norms = self._norms()
                records.rows[-1]["clipped"] = sum(n * n for n in norms if n is not None) ** 0.5

    return Net()


def dataloader(world=1, rank=0):
    """The same global batches on any number of ranks: rank r's batch k holds the samples
    r, r + world, ... of the single process's batch k (Lightning's own sampler would shuffle)."""
    import torch

    generator = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(SAMPLES, 6, generator=generator) * 3,
                                          torch.randn(SAMPLES, 3, generator=generator))
    sampler = torch.utils.data.distributed.DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=False)
    return torch.utils.data.DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)


def _cpu_fsdp_strategy(pl, timeout):
    """Lightning's FSDPStrategy, made to run on CPU ranks over gloo as PyTorch's FSDP does.

    Lightning refuses it without CUDA: ``Trainer(strategy=FSDPStrategy(...),
    accelerator="cpu")`` raises "ValueError: The strategy `fsdp` requires a GPU accelerator, but
    received `accelerator='cpu'`. Please set `accelerator='cuda'`, `accelerator='gpu'`, or pass a
    `CUDAAccelerator()` instance to use FSDP." (a check of the strategy's exact type, so a
    subclass passes it); and it wraps with ``device_id=None`` on CPU, where PyTorch's FSDP1 then
    raises "FSDP needs a non-CPU accelerator device": so the subclass wraps the model itself the
    way FSDPStrategy does (``use_orig_params=True``, each Linear a unit), with
    ``device_id=cpu``; FSDPStrategy then keeps that wrapping.
    """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    class CpuFSDPStrategy(pl.strategies.FSDPStrategy):
        def _setup_model(self, model):
            model = FullyShardedDataParallel(
                model, auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
                device_id=torch.device("cpu"), **self.kwargs)
            return super()._setup_model(model)

    return CpuFSDPStrategy(process_group_backend="gloo", timeout=timeout)


def make_trainer(logdir, logger, callback, log_every_n_steps=1, **options):
    """A quiet CPU Trainer logging every step by default (Lightning's default is every 50th)."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator="cpu", logger=logger, callbacks=[callback],
        log_every_n_steps=log_every_n_steps,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        use_distributed_sampler=False, default_root_dir=logdir, **options)


def train(logdir, strategy="auto", precision="32-true", accumulate=1, clip=None,
          clip_algorithm="norm", epochs=2, world=1, monitor=None, logger="tensorboard",
          version="run", log_every_n_steps=1, **module):
    """Trains 2 epochs of 3 global batches; returns (records, trainer, callback). `monitor`:
    the GradientMonitor's keyword arguments; `logger`: tensorboard, csv, csv+tensorboard or none;
    `module`: `make_module`'s options."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from lightning.pytorch.plugins import MixedPrecision

    from tensorboard_gradients.lightning import GradientMonitor

    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT_S)
    measure = strategy != "fsdp"
    if strategy == "ddp":
        strategy = pl.strategies.DDPStrategy(process_group_backend="gloo", timeout=timeout)
    elif strategy == "fsdp":
        strategy = _cpu_fsdp_strategy(pl, timeout)
    plugins = None
    if precision == "16-mixed":  # Lightning turns "16-mixed" on CPU into bf16; its plugin does not
        plugins, precision = [MixedPrecision("16-mixed", "cpu")], None
    made = {"tensorboard": lambda: TensorBoardLogger(logdir, name="", version=version),
            "csv": lambda: CSVLogger(logdir)}
    loggers = [made[name]() for name in logger.split("+") if name != "none"] or False
    callback = GradientMonitor(**(monitor or {}))
    records = Records()
    trainer = make_trainer(
        logdir, loggers, callback, devices=world, strategy=strategy, precision=precision,
        plugins=plugins, max_epochs=epochs, accumulate_grad_batches=accumulate,
        gradient_clip_val=clip, gradient_clip_algorithm=clip_algorithm if clip else None,
        log_every_n_steps=log_every_n_steps)
    rank = int(os.environ.get("LOCAL_RANK", 0))
    trainer.fit(make_module(records, measure, **module), dataloader(world, rank))
    return records.rows, trainer, callback


def main(config, logdir, rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, LOCAL_RANK=str(rank),
                      NODE_RANK="0", WORLD_SIZE=str(world))
    rows, trainer, _ = train(logdir, world=world, **json.loads(config))
    if trainer.global_rank == 0:
        for row in rows:
            print(json.dumps(row))


if __name__ == "__main__":
    # TensorBoard imports TensorFlow when it can; nothing here needs it (each rank starts ~7 s
    # sooner without it).
    sys.modules["tensorflow"] = None
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
