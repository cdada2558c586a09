"""Cost of the statistics on transformer-shaped models: many small tensors, at three depths.

A GPT-style decoder (token and position embeddings, blocks of pre-LayerNorm attention and MLP,
final LayerNorm and head; width 128, 4 heads, 64 tokens of a 512-word vocabulary, batch 16) at
depths 4, 8 and 12 (12 blocks: ~150 tensors). Per depth, interleaved round by round in one
process:

* PyTorch, eager Adam loop: ``none``; ``ours`` (`GradientMonitor`, every statistic, every
  step: ``stats_every_n_steps=1``, no histograms); ``ours_defaults`` (`GradientMonitor` with its
  defaults: the norms every step, every statistic every 10th, histograms every 100th); ``floor``
  (the one-pass floor: ``torch._foreach_norm`` over every gradient and one copy of the norms to
  the host). Each monitor's writes run inside its own rounds (`_common.writer_settle`).
* Keras (TensorFlow backend), ``model.fit``: ``none``; ``monitor`` (`GradientMonitor`, every
  statistic, every step); ``monitor_defaults`` (its defaults, as PyTorch's); ``floor`` (``optimizer.apply`` wrapped to store ``tf.linalg.global_norm`` of the
  gradients in a variable inside the traced step).
* Own time per logged step, where step-time differences drown in noise: PyTorch, the logging
  call itself timed inside every training step; Keras, the traced statistics of one batch's
  gradients called on their own (grouped, ungrouped, and ``tf.linalg.global_norm`` as the floor).
  The per-tensor slopes are fitted to these (the defaults' median is a norms-only step's).
* Work per logged step: PyTorch operators the profiler records in one ``monitor.step()`` with
  every statistic (each is at least one kernel launch on a GPU), grouped and ungrouped (with
  `statistics.array_ops.GROUPED_ARRAY_MAX_ENTRIES` = 0: every tensor reduced on its own), and
  TensorFlow operations in the traced statistics of the Keras model's gradients, grouped and
  ungrouped.
* ``fit`` once per epoch: the 14-layer MLP of `keras_overhead` fitted one 60-step epoch per
  ``fit`` call, with one monitor kept across the calls, against the same loop without it (total
  wall time per ``fit``, tracing included).

    python benchmarks/transformer_overhead.py [--quick] [--depths 4,8,12] [--rounds N]
"""

import argparse
import contextlib
import os
import statistics as stats
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _common  # noqa: E402

WIDTH, HEADS, TOKENS, VOCABULARY, BATCH = 128, 4, 64, 512, 16
FULL = dict(depths=(4, 8, 12), rounds=7, steps_per_round=10, keras_steps=30, epochs=6)
# The historical "ours": every statistic at every step (the defaults log most steps' norms only).
EVERY_STATISTIC = dict(stats_every_n_steps=1, histograms_every_n_steps=None)
# The monitors' variants (`torch_variant`): every statistic every step, and the defaults.
MONITOR_OPTIONS = {"ours": EVERY_STATISTIC, "ours_defaults": {}}
QUICK = dict(FULL, depths=(2, 4), rounds=2, steps_per_round=4, keras_steps=12, epochs=2)

ABOUT = """\
Cost of the statistics on a GPT-style decoder (width 128, 4 heads, 64 tokens, 512-word vocabulary,
batch 16) at three depths: PyTorch (eager Adam loop) and Keras (`model.fit`, TensorFlow backend),
against no logging and against the one-pass floor (PyTorch: `torch._foreach_norm` over every
gradient and one host copy; Keras: `tf.linalg.global_norm` of the gradients inside the traced
step). Variants interleaved round by round in one process. Then the work per logged step
(operators and traced ops) and `fit` called once per epoch."""

HOW_TO_READ = """\
How to read this: step times in ms with their ratio to `none`. "ours - none" is the statistics'
own cost per step and "ours / floor" divides it by the floor's (`floor - none`): how many one-pass
norms' worth of work every statistic of every tensor costs. "per extra tensor" is the slope of
"ours - none" over the depths (least squares; each block adds 12 PyTorch or 16 Keras tensors and
their parameters, so it includes the passes over the added entries). `ours` and `monitor` log
every statistic at every step; `ours_defaults` and `monitor_defaults` the monitors' defaults (the
norms every step, every statistic every 10th, histograms every 100th). "ungrouped" reduces every
tensor on its own (as before the grouped reductions): the difference is what grouping saves.
"own time" is the logging call alone (PyTorch: timed inside each training step, the median, so a
norms-only step's for the defaults; Keras: the traced statistics of one batch's gradients called
on their own): its slope over the depths is the cost per added tensor, free of the step-time
noise. Operator counts are exact; times are
medians on a noisy 2-core VM (see the spread)."""


# ----------------------------------------------------------------------------------------- PyTorch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(WIDTH)
        self.qkv = torch.nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = torch.nn.Linear(WIDTH, WIDTH)
        self.ln_2 = torch.nn.LayerNorm(WIDTH)
        self.fc = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.out = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        q, k, v = self.qkv(self.ln_1(x)).view(x.shape[0], x.shape[1], 3, HEADS, -1).unbind(2)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(x.shape))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln_2(x))))


class Decoder(torch.nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.tokens = torch.nn.Embedding(VOCABULARY, WIDTH)
        self.positions = torch.nn.Embedding(TOKENS, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
        self.ln_f = torch.nn.LayerNorm(WIDTH)
        self.head = torch.nn.Linear(WIDTH, VOCABULARY, bias=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


@contextlib.contextmanager
def grouping(grouped):
    """Small arrays of one size reduced together (the default) or every array on its own."""
    # Where `size_groups` reads it: `statistics` re-exports the name, and setting it there
    # changes nothing (the 2026-12-05 run's "ungrouped" counts equalled the grouped ones).
    from tensorboard_gradients.format.statistics import array_ops

    saved = array_ops.GROUPED_ARRAY_MAX_ENTRIES
    array_ops.GROUPED_ARRAY_MAX_ENTRIES = saved if grouped else 0
    try:
        yield
    finally:
        array_ops.GROUPED_ARRAY_MAX_ENTRIES = saved


def ungrouped(step):
    def call():
        with grouping(False):
            step()
    return call


def foreach_floor(model):
    gradients = lambda: [p.grad for p in model.parameters()]  # noqa: E731
    return lambda: torch.stack(torch._foreach_norm(gradients())).cpu()


def timed(call, seconds):
    """``call``, appending the seconds of each of its calls to ``seconds``."""
    def timed_call():
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return timed_call


def torch_variant(name, model, log_dir):
    """``(the call after backward, the monitor whose writes it queues or None)`` of the variant
    ``name`` on ``model``."""
    from tensorboard_gradients.torch import GradientMonitor

    if name in MONITOR_OPTIONS:
        monitor = GradientMonitor(model, f"{log_dir}/{name}", **MONITOR_OPTIONS[name])
        return monitor.step, monitor
    return (foreach_floor(model) if name == "floor" else lambda: None), None


def torch_operators(model, log_dir, grouped):
    """Operators the profiler records in one logged ``monitor.step()`` (after a warm-up)."""
    from tensorboard_gradients.torch import GradientMonitor

    step = GradientMonitor(model, log_dir, **EVERY_STATISTIC).step
    step = step if grouped else ungrouped(step)
    step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        step()
    return sum(1 for event in profile.events() if event.name.startswith("aten::"))


def torch_depth(depth, rounds, steps_per_round, log_root):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCABULARY, (BATCH, TOKENS + 1))
    names = ("none", "ours", "ours_defaults", "floor")
    trainers, own, settle = {}, {name: [] for name in names}, {}
    for name in names:
        torch.manual_seed(0)
        model = Decoder(depth)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        variant, monitor = torch_variant(name, model, f"{log_root}/torch_{depth}_{name}")
        if monitor is not None:  # its writes charged to its own rounds
            settle[name] = _common.writer_settle(monitor)
        log = timed(variant, own[name])

        def train_step(model=model, optimizer=optimizer, log=log):
            optimizer.zero_grad()
            logits = model(ids[:, :-1])
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCABULARY), ids[:, 1:].reshape(-1)).backward()
            log()
            optimizer.step()
        trainers[name] = train_step
    times = _common.interleaved_step_times(trainers, rounds, steps_per_round, settle=settle)
    model = Decoder(depth)
    model(ids[:, :-1]).sum().backward()
    return {
        "depth": depth,
        "tensors": len(list(model.parameters())),
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": {name: stats.median(t) for name, t in times.items()},
        "ours_per_round": [o / n for o, n in zip(times["ours"], times["none"])],
        "own_seconds": {name: stats.median(own[name]) for name in names[1:]},
        "operators": {
            "grouped": torch_operators(model, f"{log_root}/ops_{depth}_g", True),
            "ungrouped": torch_operators(model, f"{log_root}/ops_{depth}_u", False),
            "floor": _floor_operators(model),
        },
    }


def _floor_operators(model):
    floor = foreach_floor(model)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        floor()
    return sum(1 for event in profile.events() if event.name.startswith("aten::"))


# ------------------------------------------------------------------------------------------- Keras

def keras_decoder(depth):
    import keras

    keras.utils.set_random_seed(0)
    ids = keras.Input((TOKENS,), dtype="int32")
    x = keras.layers.Embedding(VOCABULARY, WIDTH, name="tokens")(ids)
    x = x + keras.layers.Embedding(TOKENS, WIDTH, name="positions")(
        keras.ops.arange(TOKENS)[None])
    for index in range(depth):
        attended = keras.layers.MultiHeadAttention(HEADS, WIDTH // HEADS, name=f"attn_{index}")(
            *[keras.layers.LayerNormalization(name=f"ln1_{index}")(x)] * 2, use_causal_mask=True)
        x = x + attended
        hidden = keras.layers.Dense(4 * WIDTH, activation="gelu", name=f"fc_{index}")(
            keras.layers.LayerNormalization(name=f"ln2_{index}")(x))
        x = x + keras.layers.Dense(WIDTH, name=f"out_{index}")(hidden)
    x = keras.layers.LayerNormalization(name="ln_f")(x)
    model = keras.Model(ids, keras.layers.Dense(VOCABULARY, use_bias=False, name="head")(x))
    model.compile(optimizer=keras.optimizers.Adam(1e-4),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class FloorNorm:
    """``optimizer.apply`` wrapped on the instance: the global norm of the gradients, stored in a
    variable inside the traced step (so it is computed, not pruned)."""

    def __init__(self, model):
        import tensorflow as tf

        self.norm = tf.Variable(0.0)
        apply = model.optimizer.apply

        def hooked(grads, trainable_variables=None):
            grads = list(grads)
            self.norm.assign(tf.linalg.global_norm(grads))
            return apply(grads, trainable_variables)
        model.optimizer.apply = hooked


def keras_depth(depth, rounds, steps, log_root):
    import keras
    from keras_overhead import StepTimer

    from tensorboard_gradients.keras import GradientMonitor

    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCABULARY, (BATCH * steps, TOKENS + 1)).astype("int32")
    x, y = ids[:, :-1], ids[:, 1:]
    models = {name: keras_decoder(depth)
              for name in ("none", "monitor", "monitor_defaults", "floor")}
    FloorNorm(models["floor"])
    monitors = {"monitor": GradientMonitor(f"{log_root}/keras_{depth}", **EVERY_STATISTIC),
                "monitor_defaults": GradientMonitor(f"{log_root}/keras_{depth}_defaults")}
    times = {name: [] for name in models}
    for round_index in range(rounds + 1):  # the first round traces: not timed
        for name, model in _common.rotated(models.items(), round_index):
            timer = StepTimer()
            callbacks = [monitors[name]] if name in monitors else []
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=callbacks + [timer])
            if round_index:
                times[name].append(float(np.median(timer.step_times())))
    del keras
    return {
        "depth": depth,
        "tensors": len(models["none"].trainable_variables),
        "parameters": models["none"].count_params(),
        "seconds": {name: stats.median(t) for name, t in times.items()},
        "ours_per_round": [m / n for m, n in zip(times["monitor"], times["none"])],
        "operations": {"grouped": traced_operations(models["none"], True),
                       "ungrouped": traced_operations(models["none"], False)},
        "own_seconds": statistics_alone_seconds(models["none"], x[:BATCH], y[:BATCH], rounds),
    }


def traced(function, variables):
    """``function(*gradients)`` traced for ``variables``' gradients."""
    import tensorflow as tf

    specs = [tf.TensorSpec(v.shape, v.dtype) for v in variables]
    return tf.function(function).get_concrete_function(*specs)


def traced_statistics(variables, grouped):
    """The monitor's statistics of ``variables``' gradients as a traced function, grouped or
    not (the grouping is decided when it traces)."""
    from tensorboard_gradients.capture import tensorflow_ops

    with grouping(grouped):
        return traced(lambda *g: tensorflow_ops.gradient_statistics(list(g), variables),
                      variables)


def statistics_alone_seconds(model, x, y, rounds, calls_per_round=20):
    """Median seconds of one call of the traced statistics (grouped, ungrouped) and of the floor
    (``tf.linalg.global_norm``) on one batch's gradients, interleaved round by round."""
    import tensorflow as tf

    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        loss = model.loss(y, model(x, training=True))
    gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
    functions = {
        "monitor": traced_statistics(variables, True),
        "ungrouped": traced_statistics(variables, False),
        "floor": traced(lambda *g: tf.linalg.global_norm(list(g)), variables),
    }
    calls = {name: (lambda f=f: tf.nest.map_structure(lambda t: t.numpy(), f(*gradients)))
             for name, f in functions.items()}
    return {name: stats.median(t) for name, t in _common.interleaved_step_times(
        calls, rounds, calls_per_round).items()}


def traced_operations(model, grouped):
    """Operations (constants and inputs aside) in the traced statistics of the model's
    gradients: what the monitor adds to each logged step."""
    graph = traced_statistics(model.trainable_variables, grouped).graph
    return sum(1 for op in graph.get_operations()
               if op.type not in ("Const", "Placeholder", "NoOp", "Identity"))


def fit_per_epoch(epochs, steps):
    """Wall seconds of each one-epoch ``fit`` of the keras_overhead MLP, with and without a
    monitor kept across the calls, alternated."""
    from keras_overhead import BATCH as MLP_BATCH, build, data

    from tensorboard_gradients.keras import GradientMonitor

    log_dir = tempfile.mkdtemp()
    monitor = GradientMonitor(log_dir)
    (plain, input_shape, vocabulary), (monitored, _, _) = build("mlp"), build("mlp")
    runs = {"none": (plain, []), "monitor": (monitored, [monitor])}
    x, y = data(input_shape, vocabulary, steps)
    seconds = {name: [] for name in runs}
    for _ in range(epochs):
        for name, (model, callbacks) in runs.items():
            start = time.perf_counter()
            model.fit(x, y, batch_size=MLP_BATCH, epochs=1, verbose=0, callbacks=callbacks)
            seconds[name].append(time.perf_counter() - start)
    return seconds


# ----------------------------------------------------------------------------------------- report

def collect(settings):
    with tempfile.TemporaryDirectory() as log_root:
        torch_rows, keras_rows = [], []
        for depth in settings["depths"]:
            torch_rows.append(torch_depth(depth, settings["rounds"],
                                          settings["steps_per_round"], log_root))
            print(f"torch depth {depth}: {torch_rows[-1]['seconds']}", flush=True)
            keras_rows.append(keras_depth(depth, settings["rounds"], settings["keras_steps"],
                                          log_root))
            print(f"keras depth {depth}: {keras_rows[-1]['seconds']}", flush=True)
    per_epoch = fit_per_epoch(settings["epochs"], 60)
    config = dict(settings, torch=torch.__version__, threads=torch.get_num_threads())
    return {"config": config, "torch": torch_rows, "keras": keras_rows, "fit_per_epoch": per_epoch,
            "rows": torch_rows + keras_rows}


def _slope(rows, extra):
    """Least-squares ms per tensor of ``extra(row)`` seconds over the rows' tensor counts."""
    if len(rows) < 2:
        return "n/a"
    slope = np.polyfit([r["tensors"] for r in rows], [extra(r) * 1e3 for r in rows], 1)[0]
    return f"{slope * 1e3:.1f} us"


def _extra(row, name):
    return row["seconds"][name] - row["seconds"]["none"]


def _cost_ratio(row, name, floor):
    floor_cost = _extra(row, floor)
    return f"{_extra(row, name) / floor_cost:.1f}x" if floor_cost > 0 else "floor below noise"


def render(result):
    c = result["config"]
    ms = _common.ms

    def cells(r, variants, ours):
        """Depth, size, none, each variant as "ms (ratio)", ours' own cost and its multiple of
        the floor's, the per-round spread."""
        s = r["seconds"]
        return ([str(r["depth"]), str(r["tensors"]), f"{r['parameters']:,}", ms(s["none"])]
                + [f"{ms(s[v])} ({_common.ratio(s[v], s['none'])})" for v in variants]
                + [ms(_extra(r, ours)), _cost_ratio(r, ours, "floor"),
                   _common.ratio_range(r["ours_per_round"])])

    def own(r, variants):
        return " / ".join(ms(r["own_seconds"][v]) for v in variants)

    def own_slopes(rows, variants):
        return ", ".join(f"{label} {_slope(rows, lambda r, v=v: r['own_seconds'][v])}"
                         for label, v in variants)

    torch_own = (("ours", "ours"), ("defaults", "ours_defaults"), ("floor", "floor"))
    keras_own = (("monitor", "monitor"), ("ungrouped", "ungrouped"), ("floor", "floor"))
    torch_cells = [cells(r, ("ours", "ours_defaults", "floor"), "ours") + [
        own(r, [v for _, v in torch_own]),
        f"{r['operators']['grouped']} / {r['operators']['ungrouped']} / {r['operators']['floor']}"]
        for r in result["torch"]]
    keras_cells = [cells(r, ("monitor", "monitor_defaults", "floor"), "monitor") + [
        own(r, [v for _, v in keras_own]),
        f"{r['operations']['grouped']} / {r['operations']['ungrouped']}"]
        for r in result["keras"]]
    per_epoch = result["fit_per_epoch"]
    later = {name: stats.median(s[1:]) if len(s) > 1 else s[0] for name, s in per_epoch.items()}
    return "\n".join([
        f"PyTorch {c['torch']} on CPU ({c['threads']} threads), median over {c['rounds']} rounds "
        f"x {c['steps_per_round']} steps. Step time in ms:",
        "",
        _common.table(
            ["blocks", "tensors", "parameters", "none", "ours", "ours_defaults", "floor",
             "ours - none", "ours / floor", "ours / none per round",
             "own time, ms (ours / defaults / floor)",
             "operators per logged step (ours / ungrouped / floor)"], torch_cells, text_columns=0),
        "",
        f"Per extra tensor (slope over the depths): ours {_slope(result['torch'], lambda r: _extra(r, 'ours'))}, "
        f"defaults {_slope(result['torch'], lambda r: _extra(r, 'ours_defaults'))}, "
        f"floor {_slope(result['torch'], lambda r: _extra(r, 'floor'))}. Own time per extra "
        f"tensor: {own_slopes(result['torch'], torch_own)}.",
        "",
        f"Keras `model.fit` (TensorFlow backend), {c['keras_steps']} steps per `fit`, median over "
        f"{c['rounds']} rounds after one untimed round. Step time in ms:",
        "",
        _common.table(
            ["blocks", "tensors", "parameters", "none", "monitor", "monitor_defaults", "floor",
             "monitor - none",
             "monitor / floor", "monitor / none per round",
             "statistics alone, ms (grouped / ungrouped / floor)",
             "traced statistics ops (grouped / ungrouped)"], keras_cells, text_columns=0),
        "",
        f"Per extra tensor: monitor {_slope(result['keras'], lambda r: _extra(r, 'monitor'))}, "
        f"floor {_slope(result['keras'], lambda r: _extra(r, 'floor'))}. Statistics alone per "
        f"extra tensor: {own_slopes(result['keras'], keras_own)}.",
        "",
        f"`fit` once per epoch (keras_overhead's 14-layer MLP, 60-step epochs, {c['epochs']} `fit` "
        f"calls each, one monitor kept across them): seconds per `fit`, none "
        f"{', '.join(f'{s:.2f}' for s in per_epoch['none'])}; monitor "
        f"{', '.join(f'{s:.2f}' for s in per_epoch['monitor'])}. After the first: median "
        f"{later['monitor']:.2f} s vs {later['none']:.2f} s "
        f"({_common.ratio(later['monitor'], later['none'])}).",
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=_common.parse_ints)
    parser.add_argument("--rounds", type=int)
    args = _common.parse_args(parser, FULL, QUICK)
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
