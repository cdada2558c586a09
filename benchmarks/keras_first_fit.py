"""The first `model.fit` with GradientMonitor vs without: what its tracing adds to a first epoch.

TensorFlow traces the train step (with the monitor's statistics in it) on the first `fit`, and
again for a last batch of another size. `keras_overhead` drops those steps to time the steady
state; this benchmark times them. Each measurement is a fresh process (TensorFlow keeps what it
traced for the life of the model, and its own start-up belongs to no variant), the variants
alternating round by round. The second `fit` of the same process is reported beside it: no
tracing, the steady state.

Variants: ``none`` (plain `fit`), ``built`` (plain `fit` with the optimizer built first) and
``monitor`` (the callback at its defaults). Plain Keras builds Adam's slot variables inside the
first call of the train step, and TensorFlow traces a function that creates variables twice;
the monitor builds the optimizer before that call, as ``built`` does. So the monitor's own
tracing is ``monitor`` against ``built``; against ``none`` it also saves a trace.

Models: the demo's MLP (10 Dense(128) layers and a Dense(10): 22 variables, 1,797 samples at
batch 64, so a short last batch traces the step twice, as in the demo) and a deep one with
batch normalization (40 Dense(64) + BatchNormalization blocks and a Dense(10): 162 variables,
one trace).

Usage::

    python benchmarks/keras_first_fit.py [--quick] [--rounds 3] [--models demo_mlp,deep_bn]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import _common

FULL = dict(models=("demo_mlp", "deep_bn"), rounds=3)
QUICK = dict(FULL, rounds=1)
VARIANTS = ("none", "built", "monitor")
# Per fresh process: the deep model's first fit takes 20-45 s on a 2-core CPU.
TIMEOUT_S = 600

ABOUT = """\
The first `model.fit` (one epoch) with the `GradientMonitor` callback at its defaults against
plain `model.fit`, with and without the optimizer built first: TensorFlow traces the train step,
with the monitor's statistics in it, on a first `fit`. Each number is a fresh process; the
variants alternate round by round."""

HOW_TO_READ = """\
How to read this: "first fit" is one epoch including tracing, in seconds (the median over the
rounds). "Optimizer built" is plain `fit` with `optimizer.build` called first, as the monitor
does: plain Keras creates Adam's slots inside its first call, which TensorFlow traces twice.
"added" is the monitor's own tracing (monitor - built); "per round" is the spread of monitor /
built over the rounds, the variants of a round run one after the other; "monitor / none" is
what a user sees against plain `fit`. The second `fit` of the same process traces
nothing: it shows the steady state beside it (`keras_overhead` times that properly). Background:
[NOTES.md](NOTES.md#the-masked-pass-stacked-by-size-the-keras-monitors-first-fit-issue-36-2026-12-07-0335-utc-on)."""

MODELS = {
    "demo_mlp": "the demo's MLP: 10 Dense(128) + Dense(10), 1,797 samples at batch 64",
    "deep_bn": "40 x (Dense(64) + BatchNormalization) + Dense(10), 640 samples at batch 64",
}


def _child(model_name, variant):
    """In a fresh process: {"first": s, "second": s, "variables": n} of two one-epoch fits."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if model_name == "demo_mlp":
        samples = 1797
        layers = [keras.layers.Dense(128, activation="relu") for _ in range(10)]
    else:
        samples = 640
        layers = [layer for _ in range(40) for layer in (
            keras.layers.Dense(64, activation="relu"), keras.layers.BatchNormalization())]
    model = keras.Sequential([keras.Input((64,))] + layers + [keras.layers.Dense(10)])
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = rng.random((samples, 64), dtype=np.float32)
    y = rng.integers(0, 10, samples).astype(np.int32)
    callbacks = []
    if variant == "built":  # as the monitor does: no trace that creates Adam's slots
        model.optimizer.build(model.trainable_variables)
    if variant == "monitor":
        from tensorboard_gradients.keras import GradientMonitor

        callbacks.append(GradientMonitor(tempfile.mkdtemp()))
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=callbacks)
        seconds.append(time.perf_counter() - start)
    return {"first": seconds[0], "second": seconds[1],
            "variables": len(model.trainable_variables)}


def _in_fresh_process(model_name, variant):
    completed = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", model_name, variant],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"{model_name} {variant}: exit {completed.returncode}\n"
                           f"{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def measure(model_name, rounds):
    """One row: per variant the first and second fits' median seconds, monitor / none per
    round."""
    runs = {variant: [] for variant in VARIANTS}
    for round_index in range(rounds):
        for variant in _common.rotated(VARIANTS, round_index):
            runs[variant].append(_in_fresh_process(model_name, variant))
    median = lambda variant, key: statistics.median(r[key] for r in runs[variant])  # noqa: E731
    return {
        "model": model_name,
        "variables": runs["none"][0]["variables"],
        "first": {v: median(v, "first") for v in VARIANTS},
        "second": {v: median(v, "second") for v in VARIANTS},
        "per_round_ratios": [m["first"] / b["first"]
                             for m, b in zip(runs["monitor"], runs["built"])],
    }


def collect(settings):
    """{"config": settings, "rows": one per model (or its error)}."""
    rows = []
    for name in settings["models"]:
        try:
            rows.append(measure(name, settings["rounds"]))
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            rows.append({"model": name, "error": str(error)})
        print(f"{name}: {rows[-1].get('first', rows[-1].get('error'))}", flush=True)
    return {"config": dict(settings), "rows": rows}


def render(result):
    c = result["config"]
    intro = (f"{c['rounds']} round(s); Adam, one epoch per `fit`, `jit_compile` at its default "
             f"(off on CPU). Seconds:")
    headers = ["model", "first fit, none", "first fit, optimizer built", "first fit, monitor",
               "monitor / built", "added", "per round", "monitor / none", "second fit, none",
               "second fit, monitor"]
    rows = []
    for r in result["rows"]:
        if "error" in r:
            rows.append([MODELS[r["model"]], _common.error_cell(r["error"])] + [""] * 8)
            continue
        first, second = r["first"], r["second"]
        rows.append([f"{MODELS[r['model']]} ({r['variables']} vars)",
                     f"{first['none']:.2f}", f"{first['built']:.2f}", f"{first['monitor']:.2f}",
                     _common.ratio(first["monitor"], first["built"]),
                     f"{first['monitor'] - first['built']:+.2f}",
                     _common.ratio_range(r["per_round_ratios"]),
                     _common.ratio(first["monitor"], first["none"]),
                     f"{second['none']:.2f}", f"{second['monitor']:.2f}"])
    details = [f"{r['model']}:\n\n```\n{r['error']}\n```" for r in result["rows"]
               if "error" in r]
    return "\n\n".join([intro, _common.table(headers, rows)] + details)


def main():
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(*sys.argv[2:4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--models", type=_common.parse_words,
                        help="comma-separated: demo_mlp,deep_bn")
    args = _common.parse_args(parser, FULL, QUICK)
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
