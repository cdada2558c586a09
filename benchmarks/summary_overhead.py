"""Cost of logging gradient statistics every step from a TF custom training loop.

A 14-layer ReLU MLP (28 variables) trains with Adam in `tf.function`; five variants of the same
step run interleaved in one process, so machine noise hits them alike:

  none          no gradient logging
  ours          tensorboard_gradients.summary.gradients: all stats of all variables, one summary
  ours_norms    the same with stats=("l2_norm",): the required stats only, three passes, not six,
                no weight norms
  ours_every_10 the same under tf.summary.record_if(step % 10 == 0)
  histograms    tf.summary.histogram per variable (TensorBoard's Histograms tab)
  scalar_norms  tf.summary.scalar(tf.norm(g)) per variable (the hand-written callback recipe)

Prints a markdown table of median step times, their ratio to `none` and ours against the two
stock alternatives. Run by hand, or through `run.py`:

    python benchmarks/summary_overhead.py [--quick] [--width 256] [--batch 256,1024]
"""

import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

from tensorboard_gradients import summary  # noqa: E402

import _common  # noqa: E402

LAYERS = 14
FULL = dict(batch=(256, 1024), width=256, features=64, rounds=15, steps_per_round=20)
QUICK = dict(FULL, batch=(256,), rounds=5, steps_per_round=10)

ABOUT = """\
Cost of `tensorboard_gradients.summary.gradients` (every statistic of every variable, one
summary) per training step of a TF custom loop, against no logging and the two stock ways of
logging gradients: `tf.summary.histogram` per variable (TensorBoard's Histograms tab) and
`tf.summary.scalar(tf.norm(g))` per variable (the hand-written recipe). The variants run
interleaved, round by round, in one process."""

HOW_TO_READ = """\
How to read this: each cell is the median time of one training step and, in brackets, its ratio
to `none` (1.05x = 5% slower than not logging). "ours vs ..." divides our step time by the peer's:
below 1 we are cheaper. The statistics cost a roughly fixed time per step (dispatch of ~12 small
ops per variable), so the ratio to `none` shrinks as the step grows (compare the batches); logging
every 10th step removes most of it. "per round" is the spread of ours/none over the rounds:
differences inside it are noise. Targets, history and why: [NOTES.md](NOTES.md#summary-op)."""


def build(width, features):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((features,))]
    layers += [keras.layers.Dense(width, activation="relu") for _ in range(LAYERS - 1)]
    layers += [keras.layers.Dense(10)]
    return keras.Sequential(layers)


def make_step(model, optimizer, log, writer):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    @tf.function
    def step(x, y, step):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, variables)
        with writer.as_default(step=step):
            log(grads, variables, step)
        optimizer.apply_gradients(zip(grads, variables))
        return loss

    return step


def every_10_steps(grads, variables, step):
    with tf.summary.record_if(step % 10 == 0):
        summary.gradients(grads, variables)


VARIANTS = {
    "none": lambda grads, variables, step: None,
    "ours": lambda grads, variables, step: summary.gradients(grads, variables),
    "ours_norms": lambda grads, variables, step: summary.gradients(
        grads, variables, stats=("l2_norm",)),
    "ours_every_10": every_10_steps,
    "histograms": lambda grads, variables, step: [
        tf.summary.histogram(v.path, g) for g, v in zip(grads, variables)
    ],
    "scalar_norms": lambda grads, variables, step: [
        tf.summary.scalar(v.path + "/norm", tf.norm(g)) for g, v in zip(grads, variables)
    ],
}


def measure(width, batch, features, rounds, steps_per_round):
    """Per variant: seconds per step of each round, all variants interleaved round by round."""
    x = tf.random.normal((batch, features))
    y = tf.random.uniform((batch,), maxval=10, dtype=tf.int32)
    tmp = tempfile.mkdtemp()
    steps = {}
    for name, log in VARIANTS.items():
        model = build(width, features)
        writer = tf.summary.create_file_writer(os.path.join(tmp, name))
        steps[name] = make_step(model, keras.optimizers.Adam(1e-4), log, writer)
    counter = tf.Variable(0, dtype=tf.int64)
    for fn in steps.values():  # trace and warm up
        for _ in range(3):
            fn(x, y, counter).numpy()
    times = {name: [] for name in steps}
    for round_index in range(rounds):
        for name, fn in _common.rotated(steps.items(), round_index):
            start = time.perf_counter()
            for _ in range(steps_per_round):
                loss = fn(x, y, counter)
                counter.assign_add(1)
            loss.numpy()
            times[name].append((time.perf_counter() - start) / steps_per_round)
    return times


def collect(settings):
    """{"config": settings and the model's size, "rows": one per batch size}."""
    model = build(settings["width"], settings["features"])
    config = dict(
        settings,
        parameters=sum(int(np.prod(v.shape)) for v in model.trainable_variables),
        variables=len(model.trainable_variables),
        tf_devices=sorted({d.device_type for d in tf.config.list_logical_devices()}),
    )
    rows = _common.rows_per_batch(settings, measure)
    return {"config": config, "rows": rows}


def render(result):
    c = result["config"]
    lines = [
        f"{LAYERS}-layer ReLU MLP (width {c['width']}, {c['features']} inputs, 10 classes; "
        f"{c['parameters']:,} parameters in {c['variables']} variables), Adam, custom "
        f"`tf.function` loop, TF devices: {', '.join(c['tf_devices'])}; median over "
        f"{c['rounds']} rounds x {c['steps_per_round']} steps. Step time in ms (ratio to none):",
        "",
    ]
    lines.append(_common.step_time_table(result["rows"], {
        "ours": "ours (all stats, every step)",
        "ours_norms": "ours, `stats=(\"l2_norm\",)` every step",
        "ours_every_10": "ours, every 10th step",
        "histograms": "`tf.summary.histogram` per variable",
        "scalar_norms": "`tf.summary.scalar(tf.norm(g))` per variable",
    }, {"histograms": "histogram", "scalar_norms": "scalar norm"},
        {"ours": "ours", "ours_norms": "ours norms"}))
    return "\n".join(lines)


def main():
    parser = _common.step_time_parser(__doc__.splitlines()[0])
    args = _common.parse_args(parser, FULL, QUICK)
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
