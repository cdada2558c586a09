"""Cost of the PyTorch GradientMonitor per training step, against the ways PyTorch users log today.

A 14-layer ReLU MLP (28 parameters) trains with Adam; the variants of the same eager step run
interleaved round by round in one process, so machine noise hits them alike:

  none            no gradient logging
  ours            tensorboard_gradients.torch.GradientMonitor, every statistic, every step
  ours_norms      the same with stats=("l2_norm",): the required stats only (norm, min, max,
                  max |g|, NaN/Inf counts), three passes per gradient instead of six (two
                  kernels in PyTorch: a multi-tensor norm and aminmax), no weight norms
  ours_every_10   the same with every_n_steps=10
  ours_histograms every statistic and the log10|g| histograms, every step
  ours_optimizer  every statistic and the optimizer's update and Adam RMS (optimizer=), every
                  step
  ours_on_alert   the same with on_alert=: each step also waits for the judgement of the one
                  before (the live alerts)
  ours_sync       every statistic, every step, with strict=True: the events written on the
                  training thread, as before the writer's background thread (issue 36)
  clip_recipe     torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item(): what most
                  recipes already run every step
  ours_clip       GradientMonitor.clip_grad_norm_(1.0): every statistic logged, then the same
                  clip
  hook_histograms a hook per parameter computing a 64-bin `torch.histc` of its gradient between
                  its min and max (read with .item()) and copying it to the host: what hosted
                  trackers' "watch the gradients" does
  item_norms      a loop of p.grad.norm().item() per parameter, each written as a scalar with
                  torch.utils.tensorboard.SummaryWriter (the hand-written recipe)

    python benchmarks/torch_overhead.py [--quick] [--batch 256,1024] [--rounds N]
"""

import tempfile

import torch

from tensorboard_gradients.torch import GradientMonitor

import _common

LAYERS = 14
FULL = dict(batch=(256, 1024), width=256, features=64, rounds=15, steps_per_round=20)
QUICK = dict(FULL, batch=(256,), rounds=5, steps_per_round=10)

ABOUT = """\
Cost of `tensorboard_gradients.torch.GradientMonitor` (every statistic of every parameter, one
host copy per logged step) per training step of an eager PyTorch loop, against no logging and
the two ways PyTorch users log gradients today: a hook per parameter building a 64-bin
`torch.histc` histogram and copying it to the host (what hosted trackers' gradient watching
does), and a loop of `p.grad.norm().item()` per parameter written with `SummaryWriter.add_scalar`
(the hand-written recipe). The variants run interleaved, round by round, in one process."""

HOW_TO_READ = """\
How to read this: each cell is the median time of one training step and, in brackets, its ratio
to `none`. "ours vs ..." divides our step time by the peer's (below 1: cheaper). Target (issue 19):
at most 5% over `none` with statistics every step, 15% with histograms too. On a CPU the
statistics are six passes over every gradient (a kernel each; small tensors of one size reduced
together) and the histograms five elementwise operations (two of them table lookups) and a count
per tensor, a fixed cost per step that a short step shows most. "per round" is the spread of ours/none over the rounds: differences
inside it are noise."""


def build(width, features):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(features, width), torch.nn.ReLU()]
    for _ in range(LAYERS - 2):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 10))


def hook_histograms(model, _, __):
    """Per parameter: min/max read to the host, a 64-bin histogram on the device, copied over."""
    kept = []

    def histogram(gradient):
        low, high = gradient.min().item(), gradient.max().item()
        kept.append(torch.histc(gradient.detach().float(), bins=64, min=low, max=high).cpu())

    for parameter in model.parameters():
        parameter.register_hook(histogram)
    return kept.clear  # the tracker would send them now


def item_norms(model, log_dir, _):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir)
    counter = iter(range(10**9))

    def log():
        step = next(counter)
        for name, parameter in model.named_parameters():
            writer.add_scalar(f"grad_norm/{name}", parameter.grad.norm().item(), step)
    return log


def monitor(every_n_steps, histograms_every_n_steps=None, stats=None, optimizer=False,
            on_alert=None, strict=False, clip=None):
    def attach(model, log_dir, model_optimizer):
        watching = GradientMonitor(model, log_dir, every_n_steps=every_n_steps,
                                   histograms_every_n_steps=histograms_every_n_steps, stats=stats,
                                   optimizer=model_optimizer if optimizer else None,
                                   on_alert=on_alert, strict=strict)
        if clip is not None:
            return lambda: watching.clip_grad_norm_(clip)
        return watching.step
    return attach


def clip_recipe(model, _, __):
    return lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()


VARIANTS = {
    "none": lambda model, log_dir, optimizer: (lambda: None),
    "ours": monitor(1),
    "ours_norms": monitor(1, stats=("l2_norm",)),
    "ours_every_10": monitor(10),
    "ours_histograms": monitor(1, histograms_every_n_steps=1),
    "ours_optimizer": monitor(1, optimizer=True),
    "ours_on_alert": monitor(1, optimizer=True, on_alert=lambda alert: None),
    "ours_sync": monitor(1, strict=True),
    "clip_recipe": clip_recipe,
    "ours_clip": monitor(1, clip=1.0),
    "hook_histograms": hook_histograms,
    "item_norms": item_norms,
}


def measure(width, batch, features, rounds, steps_per_round):
    """Per variant: seconds per step of each round, all variants interleaved round by round."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, features, generator=generator)
    y = torch.randint(0, 10, (batch,), generator=generator)
    tmp = tempfile.mkdtemp()
    trainers = {}
    for name, attach in VARIANTS.items():
        model = build(width, features)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        log = attach(model, f"{tmp}/{name}", optimizer)

        def train_step(model=model, optimizer=optimizer, log=log):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            log()
            optimizer.step()
        trainers[name] = train_step
    return _common.interleaved_step_times(trainers, rounds, steps_per_round)


def collect(settings):
    """{"config": settings and the model's size, "rows": one per batch size}."""
    model = build(settings["width"], settings["features"])
    config = dict(
        settings,
        parameters=sum(p.numel() for p in model.parameters()),
        tensors=len(list(model.parameters())),
        torch=torch.__version__,
        threads=torch.get_num_threads(),
    )
    rows = _common.rows_per_batch(settings, measure)
    return {"config": config, "rows": rows}


def render(result):
    c = result["config"]
    lines = [
        f"{LAYERS}-layer ReLU MLP (width {c['width']}, {c['features']} inputs, 10 classes; "
        f"{c['parameters']:,} parameters in {c['tensors']} tensors), Adam, eager PyTorch "
        f"{c['torch']} on CPU ({c['threads']} threads); median over {c['rounds']} rounds x "
        f"{c['steps_per_round']} steps. Step time in ms (ratio to none):",
        "",
    ]
    lines.append(_common.step_time_table(result["rows"], {
        "ours": "ours (all stats, every step)",
        "ours_norms": "ours, `stats=(\"l2_norm\",)` every step",
        "ours_every_10": "ours, every 10th step",
        "ours_histograms": "ours, stats + histograms every step",
        "ours_optimizer": "ours + `optimizer=` every step",
        "ours_on_alert": "ours + `optimizer=` + `on_alert=` every step",
        "ours_sync": "ours, events written on the training thread (`strict=True`)",
        "clip_recipe": "`clip_grad_norm_` + `.item()` (the clip recipe)",
        "ours_clip": "ours, `monitor.clip_grad_norm_` (all stats, then the clip)",
        "hook_histograms": "hook + 64-bin `histc` per parameter",
        "item_norms": "`.item()` norm per parameter",
    }, {"hook_histograms": "hook histograms", "item_norms": "item norms"},
        {"ours": "ours", "ours_norms": "ours norms"}))
    return "\n".join(lines)


def main():
    parser = _common.step_time_parser(__doc__.splitlines()[0])
    args = _common.parse_args(parser, FULL, QUICK)
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
