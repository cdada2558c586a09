"""Demo: train six small networks on scikit-learn's digits and look at their gradients.

Every scenario is one run (``LOGDIR/<scenario>/train``) in one logdir, so the Gradients tab and
``tensorboard-gradients diagnose`` show them side by side:

  healthy            10-layer ReLU MLP, He init, Adam                      -> no alerts
  vanishing          12-layer sigmoid MLP, Glorot init, SGD                -> input-side layers vanish
  vanishing_fixed    the same with ReLU + He init                          -> no alerts
  exploding          8-layer leaky-ReLU MLP, SGD + momentum at too high a  -> exploding, then NaN
                     learning rate (stopped by TerminateOnNaN)
  exploding_clipped  the same with clipnorm=1.0                            -> no alerts
  custom_loop        the vanishing net with batch normalisation, trained   -> no alerts; histograms
                     by a custom tf.function loop (`summary.gradients`)

The data is scikit-learn's bundled ``load_digits`` (1,797 8x8 images, shipped inside the
package: nothing is downloaded). The Keras runs log with `GradientMonitor` plus Keras' own
`TensorBoard` callback (whose ``batch_loss`` the tab draws above the heatmap). Afterwards the
alerts of every run are printed, and ``--serve`` starts TensorBoard on the logdir until Ctrl-C:
on ``--port`` (6006) or, when another program holds it, the next free port (checked before
training, so the URL printed is this TensorBoard's). Flags after ``--`` go to TensorBoard. The
exit status is TensorBoard's when it fails (e.g. a bad flag).

    python demo/train.py [--logdir runs/demo] [--epochs 20 | --quick] [--serve [--port 6006]]
        [-- TENSORBOARD_FLAGS...]
"""

import argparse
import collections
import dataclasses
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

WIDTH = 64
BATCH_SIZE = 64
CLASSES = 10
QUICK_EPOCHS = 3  # 87 optimizer steps per run: enough for every scenario to show its problem
HISTOGRAM_EVERY = 10


@dataclasses.dataclass(frozen=True)
class Scenario:
    description: str
    expected: str  # what the Gradients tab shows for it
    depth: int
    activation: str
    initializer: str
    optimizer: str  # a `keras.optimizers` class name
    optimizer_args: dict
    normalization: bool = False
    custom_loop: bool = False


SCENARIOS = {
    "healthy": Scenario(
        "10-layer ReLU MLP, He init, Adam(1e-3)", "no alerts",
        10, "relu", "he_normal", "Adam", dict(learning_rate=1e-3),
    ),
    "vanishing": Scenario(
        "12-layer sigmoid MLP, Glorot init, SGD(0.02)",
        "the input-side layers' gradients vanish (hatched rows, vanishing alerts)",
        12, "sigmoid", "glorot_uniform", "SGD", dict(learning_rate=0.02),
    ),
    "vanishing_fixed": Scenario(
        "the vanishing net with ReLU + He init", "no alerts",
        12, "relu", "he_normal", "SGD", dict(learning_rate=0.02),
    ),
    "exploding": Scenario(
        "8-layer leaky-ReLU MLP, SGD(0.1, momentum=0.9): too high a learning rate",
        "gradient norms grow without bound (exploding alerts), then NaN (first non-finite step)",
        8, "leaky_relu", "he_normal", "SGD", dict(learning_rate=0.1, momentum=0.9),
    ),
    "exploding_clipped": Scenario(
        "the exploding net with clipnorm=1.0", "no alerts",
        8, "leaky_relu", "he_normal", "SGD", dict(learning_rate=0.1, momentum=0.9, clipnorm=1.0),
    ),
    "custom_loop": Scenario(
        "the vanishing net with batch normalisation, custom tf.function loop", "no alerts",
        12, "sigmoid", "glorot_uniform", "SGD", dict(learning_rate=0.02),
        normalization=True, custom_loop=True,
    ),
}


def load_data():
    """Digits scaled to [0, 1]: ``float32[1797, 64]`` images and ``int32[1797]`` labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int32)


def build_model(name, scenario: Scenario, features):
    """An MLP of ``depth`` dense layers (``dense_00`` at the input side) and a ``logits`` layer."""
    import keras

    layers = [keras.Input((features,))]
    for index in range(scenario.depth):
        dense = f"dense_{index:02d}"
        if scenario.normalization:  # the bias is redundant before batch normalisation
            layers += [
                keras.layers.Dense(WIDTH, use_bias=False, kernel_initializer=scenario.initializer,
                                   name=dense),
                keras.layers.BatchNormalization(name=f"batch_norm_{index:02d}"),
                keras.layers.Activation(scenario.activation, name=f"{scenario.activation}_{index:02d}"),
            ]
        else:
            layers.append(keras.layers.Dense(WIDTH, activation=scenario.activation,
                                             kernel_initializer=scenario.initializer, name=dense))
    layers.append(keras.layers.Dense(CLASSES, name="logits"))
    return keras.Sequential(layers, name=name)


def _progress_verbosity():
    """Keras progress bars in a terminal, one line per epoch in a log file."""
    return 1 if sys.stdout.isatty() else 2


def _optimizer(scenario: Scenario):
    import keras

    return getattr(keras.optimizers, scenario.optimizer)(**scenario.optimizer_args)


def train_with_fit(run_dir, model, scenario, x, y, epochs):
    """``model.fit`` with the `GradientMonitor` callback: the usual Keras way."""
    import keras

    from tensorboard_gradients.keras import GradientMonitor

    model.compile(_optimizer(scenario),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(
        x, y, batch_size=BATCH_SIZE, epochs=epochs, verbose=_progress_verbosity(),
        callbacks=[
            GradientMonitor(run_dir, histograms_every_n_steps=HISTOGRAM_EVERY),
            keras.callbacks.TensorBoard(run_dir, update_freq="batch", write_graph=False),
            keras.callbacks.TerminateOnNaN(),
        ],
    )


def train_with_custom_loop(run_dir, model, scenario, x, y, epochs):
    """A custom loop: `tensorboard_gradients.summary.gradients` inside a ``tf.function``."""
    import keras
    import tensorflow as tf

    from tensorboard_gradients import summary

    optimizer = _optimizer(scenario)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    writer = tf.summary.create_file_writer(os.path.join(run_dir, "train"))
    # drop_remainder: batch normalisation on the last 5-image batch would make a real spike
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
               .batch(BATCH_SIZE, drop_remainder=True))

    @tf.function
    def train_step(features, labels, step):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        with writer.as_default(step=step):
            summary.gradients(grads, model.trainable_variables,
                              histograms=step % HISTOGRAM_EVERY == 0)
            tf.summary.scalar("loss", loss)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step = 0
    for epoch in range(epochs):
        progress = keras.utils.Progbar(len(dataset), stateful_metrics=["loss"],
                                       verbose=_progress_verbosity())
        print(f"Epoch {epoch + 1}/{epochs}")
        for features, labels in dataset:
            step += 1  # 1-based optimizer steps, as the Keras runs beside this one count them
            loss = train_step(features, labels, tf.constant(step, tf.int64))
            progress.add(1, [("loss", float(loss))])
    writer.close()


def train(logdir, name, epochs, data=None):
    """Trains one scenario into ``logdir/name`` (replacing what an earlier demo left there)."""
    import keras

    scenario = SCENARIOS[name]
    run_dir = os.path.join(logdir, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    keras.utils.set_random_seed(0)
    x, y = data if data is not None else load_data()
    model = build_model(name, scenario, x.shape[1])
    trainer = train_with_custom_loop if scenario.custom_loop else train_with_fit
    trainer(run_dir, model, scenario, x, y, epochs)


def summarize(logdir):
    """One line per run: its alerts by kind (the first non-finite step called out)."""
    import tensorboard_gradients as tg

    lines = []
    runs = tg.read_logdir(logdir)
    for run in sorted(runs):
        alerts = tg.diagnose(runs[run]["gradients"])
        kinds = collections.Counter(alert.kind for alert in alerts)
        text = ", ".join(f"{count} {kind}" for kind, count in kinds.items()) or "no alerts"
        nonfinite = [a.first_step for a in alerts if a.kind == "nonfinite"]
        if nonfinite:
            text += f"; first NaN/Inf gradient at step {min(nonfinite)}"
        lines.append(f"  {run:26s} {text}")
    return "\n".join(lines)


# Ports tried from --port on: a few servers of one's own (other TensorBoards, notebooks).
PORTS_TRIED = 100
# TensorBoard answers within seconds; a minute covers a loaded machine's first import.
STARTUP_TIMEOUT_S = 120
# TensorBoard exits within a second or two of SIGTERM; past this it is killed.
STOP_TIMEOUT_S = 20


def port_is_free(port: int) -> bool:
    """Whether no server holds ``port``: a bind to every interface fails while any address of
    its family holds the port, so this covers localhost and --bind_all alike, IPv4 and IPv6."""
    for family, wildcard in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind((wildcard, port))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            if family == socket.AF_INET:  # no IPv6 on this machine is fine; no IPv4 is not
                raise
    return True


def free_port(first: int) -> int:
    """``first`` or the next port no server holds; SystemExit when none of `PORTS_TRIED` is."""
    for port in range(first, min(first + PORTS_TRIED, 65536)):
        if port_is_free(port):
            return port
    sys.exit(f"No free port in {first}-{first + PORTS_TRIED - 1}: pass --port to pick another.")


def _serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugins_listing", timeout=2):
            return True
    except OSError:
        return False


def serve(logdir, port, bind_all, tensorboard_flags=()) -> int:
    """Runs TensorBoard on ``logdir`` until Ctrl-C (0) or until it fails (its exit status, or 1
    when it never answered); prints the tab's URL once TensorBoard answers on ``port``."""
    options = (["--logdir", logdir, "--port", str(port)] + (["--bind_all"] if bind_all else [])
               + list(tensorboard_flags))
    # A script's background job (`... --serve &`) starts with SIGINT ignored, and Python then
    # leaves it so: Ctrl-C and `kill -INT` would not stop the demo. "Until Ctrl-C" means it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(f"\n$ tensorboard {' '.join(options)}", flush=True)
    process = subprocess.Popen([sys.executable, "-m", "tensorboard.main"] + options)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while process.poll() is None and not _serving(port):
            if time.monotonic() > deadline:
                process.terminate()
                process.wait()
                print(f"TensorBoard did not answer on port {port} in {STARTUP_TIMEOUT_S} s.",
                      file=sys.stderr)
                return 1
            time.sleep(0.5)
        if process.poll() is None:
            print(f"\nOpen http://localhost:{port}/#gradients  (Ctrl-C to stop)", flush=True)
            process.wait()
    except KeyboardInterrupt:
        # Ctrl-C in a terminal reaches TensorBoard too (same process group); a SIGINT sent to
        # the demo alone (kill -INT) must stop it as well.
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # stuck on its way out: Ctrl-C still stops the demo
            process.kill()
            process.wait()
        return 0
    if process.returncode != 0:
        print(f"TensorBoard failed (exit status {process.returncode}); its messages are above.",
              file=sys.stderr)
        return process.returncode if process.returncode > 0 else 1
    return 0


def main(argv: Optional[list] = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default="runs/demo")
    parser.add_argument("--epochs", type=int, default=20, help="epochs of 29 steps (default 20)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_EPOCHS} epochs per run (what the tests use)")
    parser.add_argument("--only", default=",".join(SCENARIOS),
                        help="comma-separated scenarios (default: all)")
    parser.add_argument("--serve", action="store_true", help="then run TensorBoard until Ctrl-C")
    parser.add_argument("--port", type=int, default=6006,
                        help="TensorBoard's port, or the next free one when it is taken "
                        "(default 6006)")
    parser.add_argument("--bind_all", action="store_true",
                        help="serve on every network interface (for a remote machine)")
    parser.add_argument("tensorboard_flags", nargs="*", metavar="-- TENSORBOARD_FLAGS",
                        help="flags for TensorBoard with --serve, e.g. -- --load_fast=false")
    args = parser.parse_args(argv)
    if args.tensorboard_flags and not args.serve:
        parser.error("TensorBoard flags (after --) need --serve")
    if not 0 < args.port < 65536:
        parser.error(f"--port {args.port} is not a TCP port (1-65535)")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    epochs = QUICK_EPOCHS if args.quick else args.epochs
    logdir = os.path.abspath(args.logdir)
    if args.serve:  # before training: the URL to expect, not another server's page
        port = free_port(args.port)
        if port != args.port:
            print(f"Port {args.port} is in use: TensorBoard will serve on port {port}.")

    data = load_data()
    print(f"Training {len(names)} runs on scikit-learn's digits ({len(data[0]):,} images), "
          f"{epochs} epochs each, into {logdir}")
    for name in names:
        scenario = SCENARIOS[name]
        print(f"\n== {name}: {scenario.description}\n   expected: {scenario.expected}", flush=True)
        train(logdir, name, epochs, data)

    print(f"\nGradient alerts (full list: tensorboard-gradients diagnose {logdir}):")
    print(summarize(logdir))
    print(f"\nLogs written to {logdir}")
    if args.serve:
        # Checked again: a server may have taken the port while the demo trained.
        return serve(logdir, free_port(port), args.bind_all,
                     args.tensorboard_flags)
    return 0


if __name__ == "__main__":
    sys.exit(main())
