"""Tiny `model.fit` runs with `GradientMonitor` on the Keras backend this process runs.

    KERAS_BACKEND=jax python tests/keras_backend_training.py LOGDIR [SCENARIO ...]

The Keras backend is fixed per process, so `test_keras_backends` runs this script once per
backend (tensorflow, jax, torch) and reads its last line: JSON ``{"backend", "results":
{scenario: "ok" | "skip: why" | traceback}, "logdirs": {scenario: dir}}``.

The references are independent of the monitor:

* the applied gradient: with plain SGD, ``w_after = fl(w_before - fl(lr * g))``, so
  ``(w_before - w_after) / lr`` (in float64, from the weights snapshotted at
  ``on_train_batch_begin`` / ``_end``) recovers each entry of the gradient the optimizer applied,
  within ``u (2 |g| + |w_after| / lr)`` (u = float32's unit roundoff): one rounding of the product,
  one of the subtraction (whose error scales with the result, ``|w_after|``, and is divided by
  lr), and lr stored in float32. `applied_tolerances` carries that per-entry bound into each
  statistic, and adds the rounding of the statistics themselves (`conftest.stat_tolerances`).
* the batch: a hand-written numpy float64 backprop of the same MLP on the same batch at the
  snapshotted weights (`numpy_gradients`). It tells batches apart, it is not a precision check:
  a float32 train step differs from it by float32 rounding (~1e-6 relative here), while other
  batches' gradients differ by more than 5% (asserted), so the norms are compared at rtol 1e-3.
* the steps: the ``batch_loss`` steps `keras.callbacks.TensorBoard(update_freq="batch")` wrote.
"""

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.format import columns  # noqa: E402
from tensorboard_gradients.keras import GradientMonitor  # noqa: E402

from conftest import norm_rtol, reference_stats, stat_tolerances, std_bound  # noqa: E402

BACKEND = keras.backend.backend()
BATCH = 8
LR = 0.05
U = np.finfo(np.float32).eps / 2
NAMES = ("hidden/kernel", "hidden/bias", "middle/kernel", "middle/bias", "out/kernel", "out/bias")
# Distinct batches' gradient norms differ by more than this (asserted), float32 recomputation
# by ~1e-6: the batch check's rtol sits between.
BATCH_RTOL = 1e-3


class Skip(Exception):
    pass


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1))).astype("float32")
    return x, y


def mlp(optimizer=None, seed=0, jit_compile="auto", steps_per_execution=1, dropout=0.0):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((6,)), keras.layers.Dense(12, activation="tanh", name="hidden"),
              keras.layers.Dense(8, activation="tanh", name="middle")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, name="drop"))
    layers.append(keras.layers.Dense(1, name="out"))
    model = keras.Sequential(layers, name="mlp")
    model.compile(optimizer=optimizer or keras.optimizers.SGD(LR), loss="mse",
                  jit_compile=jit_compile, steps_per_execution=steps_per_execution)
    return model


def weights(model):
    if BACKEND == "jax":
        model.jax_state_sync()  # inside an epoch the current values are the trainer's state
    return [np.array(v, dtype=np.float64) for v in model.trainable_variables]


class Snapshots(keras.callbacks.Callback):
    """The trainable weights before and after every optimizer step, and at each epoch's end."""

    def __init__(self):
        super().__init__()
        self.before, self.after, self.epoch_end = [], [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.before.append(weights(self.model))

    def on_train_batch_end(self, batch, logs=None):
        self.after.append(weights(self.model))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_end.append(weights(self.model))


def series(logdir, name="gradients"):
    return tg.read_logdir(logdir)["train"][name]


def scalar_steps_and_values(logdir):
    """{tag: (steps, values)} of the ordinary scalars in ``logdir/train`` (TensorBoard's loader)."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    accumulator = event_accumulator.EventAccumulator(
        os.path.join(logdir, "train"), size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return {
        tag: (np.array([e.step for e in accumulator.Tensors(tag)]),
              np.array([float(tensor_util.make_ndarray(e.tensor_proto)) for e in accumulator.Tensors(tag)]))
        for tag in accumulator.Tags()["tensors"]
        if tag.startswith(("batch_", "gradients/"))
    }


def numpy_gradients(layers, x, y):
    """d mse / d (kernel, bias) of a chain of Dense layers, by hand in float64.

    ``layers``: ``[(kernel, bias, activation)]`` (``"tanh"`` or None). Returns
    ``[(d kernel, d bias)]`` per layer.
    """
    inputs, outputs = [], []
    h = np.asarray(x, np.float64)
    for kernel, bias, activation in layers:
        inputs.append(h)
        h = h @ kernel + bias
        if activation == "tanh":
            h = np.tanh(h)
        outputs.append(h)
    delta = 2 * (h - np.asarray(y, np.float64)) / h.size  # mean over batch and the last axis
    grads = []
    for (kernel, bias, activation), h_in, h_out in reversed(list(zip(layers, inputs, outputs))):
        if activation == "tanh":
            delta = delta * (1 - h_out**2)
        grads.append((h_in.T @ delta, delta.sum(axis=0)))
        delta = delta @ kernel.T
    return grads[::-1]


def mlp_gradients(values, x, y):
    """The flat gradient list of `mlp` (variables in model order) at ``values``."""
    kernels, biases = values[0::2], values[1::2]
    layers = list(zip(kernels, biases, ["tanh", "tanh", None]))
    return [g for pair in numpy_gradients(layers, x, y) for g in pair]


def batch(x, y, index):
    return x[index * BATCH:(index + 1) * BATCH], y[index * BATCH:(index + 1) * BATCH]


def applied_tolerances(applied, w_after, lr):
    """``{stat: tolerance}`` between the statistics of the applied gradient g and those of its
    SGD reconstruction ``applied = (w_before - w_after) / lr``, whose entries are each within
    ``e = u (2 |applied| + |w_after| / lr)`` of g (see the module docstring), plus the rounding of
    the logged statistics (`conftest.stat_tolerances`, float32)."""
    applied = np.asarray(applied, np.float64).reshape(-1)
    e = U * (2 * np.abs(applied) + np.abs(np.asarray(w_after, np.float64)).reshape(-1) / lr)
    e = e * (1 + 1e-6) + np.finfo(np.float32).tiny
    expected = reference_stats(applied)
    rounding = stat_tolerances(expected, np.float32)
    n = applied.size
    # Each statistic moves by at most this when every entry moves by at most e_i: norms by
    # ||e||, means by mean(e), the std (the norm of the centred entries / sqrt(n), centring is
    # a projection) by ||e|| / sqrt(n), extremes by max(e). The std's own rounding bound is for
    # a mean error as large as mean_abs' rounding plus mean(e).
    moved = {
        "l2_norm": np.linalg.norm(e), "mean": e.mean(), "std": np.linalg.norm(e) / np.sqrt(n),
        "min": e.max(), "max": e.max(), "abs_max": e.max(), "mean_abs": e.mean(),
        # An entry within e_i of 0 may be 0 on one side and not on the other.
        "zero_fraction": np.mean(np.abs(applied) <= e), "nan_count": 0, "inf_count": 0, "size": 0,
    }
    rounding["std"] = std_bound(rounding["mean"] + e.mean(), expected["std"], (n + 8) * U)
    return expected, {stat: rounding[stat] + moved[stat] for stat in moved}


def assert_applied(logged, index, name, before, after, lr):
    """The logged row of `name` at `index` describes the gradient SGD applied between the
    weight snapshots ``before`` and ``after``."""
    applied = (before - after) / lr
    expected, tolerances = applied_tolerances(applied, after, lr)
    column = logged.variables.index(name)
    full = logged.full_rows[index]  # else a norms-only step (the default cadence, format 1.6)
    for stat, want in expected.items():
        if stat not in logged.stat_names:  # a monitor asked for fewer stats (`check_fewer_stats`)
            continue
        got = float(logged.stat(stat)[index, column])
        if not full and stat not in columns.every_step_stats(logged.stat_names):
            assert np.isnan(got), f"step {logged.steps[index]} {name} {stat}: {got!r} at a norms-only step"
            continue
        tolerance = tolerances[stat] + np.finfo(np.float32).tiny
        assert abs(got - want) <= tolerance, (
            f"step {logged.steps[index]} {name} {stat}: logged {got!r}, applied {want!r} "
            f"+- {tolerance:.3g}")
    if "weight_l2_norm" in logged.stat_names:
        weight = np.linalg.norm(before)
        got = float(logged.stat("weight_l2_norm")[index, column])
        assert abs(got - weight) <= norm_rtol(before.size) * weight, (name, got, weight)


def assert_hooks_removed(model):
    optimizer = model.optimizer
    for owner in (optimizer, getattr(optimizer, "inner_optimizer", optimizer)):
        assert not {"apply", "stateless_apply"} & set(vars(owner)), sorted(vars(owner))


# --- scenarios ---------------------------------------------------------------------------------


def check_sgd(logdir, jit_compile="auto"):
    """Every logged row is the gradient SGD applied at that step, of that step's batch; steps
    are TensorBoard's batch_loss steps; scalars and update norms follow; validation is not
    training."""
    x, y = data()
    model = mlp(jit_compile=jit_compile)
    snapshots = Snapshots()
    with traced_recorder() as traced:
        model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                  validation_data=(x[:16] * 100, y[:16]),  # never counts as training
                  callbacks=[GradientMonitor(logdir),
                             keras.callbacks.TensorBoard(logdir, update_freq="batch"), snapshots])
    logged = series(logdir)
    steps = list(range(1, 9))
    assert logged.steps.tolist() == steps, logged.steps
    scalars = scalar_steps_and_values(logdir)
    assert scalars["batch_loss"][0].tolist() == steps, scalars["batch_loss"][0]
    assert logged.variables == NAMES, logged.variables
    assert logged.epoch_starts.tolist() == [1, 5] and logged.epoch_indices.tolist() == [0, 1]
    assert len(snapshots.before) == len(steps)
    for index in range(len(steps)):
        before, after = snapshots.before[index], snapshots.after[index]
        for name, b, a in zip(NAMES, before, after):
            assert_applied(logged, index, name, b, a, LR)
        # The real weight change, as the snapshots see it: float32 differences (each exact or
        # within u of itself) summed in any order: 2 norm_rtol.
        changes = [np.linalg.norm(a - b) for b, a in zip(before, after)]
        np.testing.assert_allclose(logged.stat("update_l2_norm")[index], changes,
                                   rtol=2 * norm_rtol(96) + U)
        # The batch: the float64 backprop of this batch matches, the other batches' do not.
        norms = [[np.linalg.norm(g) for g in mlp_gradients(before, *batch(x, y, k % 4))]
                 for k in range(4)]
        own = index % 4
        np.testing.assert_allclose(logged.stat("l2_norm")[index], norms[own], rtol=BATCH_RTOL)
        for other in set(range(4)) - {own}:
            assert np.max(np.abs(np.array(norms[other]) / norms[own] - 1)) > 0.05
    global_norm = np.sqrt(np.sum(logged.stat("l2_norm").astype(np.float64) ** 2, axis=1))
    assert scalars["gradients/global_norm"][0].tolist() == steps
    np.testing.assert_allclose(scalars["gradients/global_norm"][1], global_norm,
                               rtol=2 * norm_rtol(96))
    assert_hooks_removed(model)
    if traced is not None:
        assert traced == {"traced" if model.jit_compile else "eager"}, (traced, model.jit_compile)


@contextlib.contextmanager
def traced_recorder():
    """JAX: yields the set of ways the recorder ran the steps: "traced" (inside the compiled
    step, its index a tracer) or "eager"; None on the other backends."""
    if BACKEND != "jax":
        yield None
        return
    import jax

    from tensorboard_gradients.capture import keras_jax

    seen = set()
    originals = {name: getattr(keras_jax.StepRecorder, name) for name in ("_record", "_record_eagerly")}

    def spy(name):
        def record(self, index, *args):
            seen.add("traced" if isinstance(index, jax.core.Tracer) else "eager")
            return originals[name](self, index, *args)

        return record

    for name in originals:
        setattr(keras_jax.StepRecorder, name, spy(name))
    try:
        yield seen
    finally:
        for name, original in originals.items():
            setattr(keras_jax.StepRecorder, name, original)


def check_sgd_eager(logdir):
    """JAX without jit: the same checks, the recorder running op by op."""
    if BACKEND != "jax":
        raise Skip("only the JAX recorder has a separate path without jit (sgd runs this "
                   "backend's default)")
    check_sgd(logdir, jit_compile=False)


def check_schedule(logdir):
    """every_n_steps / histograms_every_n_steps (on the optimizer's step count, which a fit
    without the monitor advanced first) across fit calls; a fresh monitor continues from the
    optimizer's counter; a later fit without the monitor runs unhooked and logs nothing."""
    x, y = data()
    model = mlp()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # steps 1-4, unmonitored
    monitor = GradientMonitor(logdir, every_n_steps=3, histograms_every_n_steps=2)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[monitor])
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[monitor])
    logged = series(logdir)
    assert logged.steps.tolist() == [7, 10, 13, 16], logged.steps
    assert logged.histograms.steps.tolist() == [5, 7, 9, 11, 13, 15], logged.histograms.steps
    assert logged.epoch_starts.tolist() == [5, 9, 13], logged.epoch_starts
    assert np.isfinite(logged.stat("update_l2_norm")).all()
    counts = logged.histograms.counts
    sizes = np.array([72, 12, 96, 8, 8, 1])
    np.testing.assert_array_equal(counts.sum(axis=2), np.tile(sizes, (len(counts), 1)))
    other = os.path.join(logdir, "again")
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[GradientMonitor(other)])
    assert series(other).steps.tolist() == [17, 18, 19, 20]
    assert_hooks_removed(model)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert series(other).steps.tolist() == [17, 18, 19, 20]
    assert int(np.asarray(model.optimizer.iterations)) == 24


def check_steps_per_execution(logdir):
    """steps_per_execution=3 under jit: every step logged with its own step, the same values as
    one step per execution."""
    if BACKEND == "torch":
        raise Skip("Keras' torch backend requires steps_per_execution=1")
    if BACKEND == "tensorflow":  # XLA compiles the 3-step loop for minutes on a small CPU
        raise Skip("test_keras_monitor.py::test_steps_per_execution_and_xla_log_every_step_with_"
                   "its_own_label covers it")
    x, y = data(n=56)
    reference_dir = os.path.join(logdir, "one_step")
    mlp(jit_compile=True).fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                              callbacks=[GradientMonitor(reference_dir)])
    model = mlp(jit_compile=True, steps_per_execution=3)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir, histograms_every_n_steps=2)])
    reference, logged = series(reference_dir), series(logdir)
    assert logged.steps.tolist() == list(range(1, 15)) == reference.steps.tolist()
    assert logged.histograms.steps.tolist() == list(range(1, 15, 2))
    assert logged.epoch_starts.tolist() == [1, 8]
    # JAX runs the same compiled one-step function three times per execution: the same
    # arithmetic. TensorFlow compiles the three steps into one loop, where XLA may order the
    # sums differently: ~K u per step (K <= 12-term products) carried by SGD over 14 steps,
    # 1e-5; rtol 1e-4 leaves 10x, atol the ~0 stats (see test_keras_monitor).
    np.testing.assert_allclose(logged.values, reference.values, rtol=1e-4, atol=1e-7)


def check_data_parallel(logdir):
    """JAX under `keras.distribution.DataParallel` on two devices: the gradient of the whole
    batch, as SGD applied it."""
    if BACKEND != "jax":
        raise Skip("keras.distribution is the JAX backend's (TensorFlow's MirroredStrategy: "
                   "test_keras_monitor.py::test_mirrored_strategy_logs_the_all_reduced_gradient_once_per_step)")
    import jax

    if len(jax.devices()) < 2:
        raise Skip("needs two devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    x, y = data()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()[:2]))
    try:
        model, snapshots = mlp(), Snapshots()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[GradientMonitor(logdir, histograms_every_n_steps=2), snapshots])
    finally:
        keras.distribution.set_distribution(None)
    logged = series(logdir)
    assert logged.steps.tolist() == [1, 2, 3, 4] and logged.histograms.steps.tolist() == [1, 3]
    for index in range(4):
        for name, b, a in zip(NAMES, snapshots.before[index], snapshots.after[index]):
            assert_applied(logged, index, name, b, a, LR)


def check_clipping(logdir):
    """Pre-clip statistics; global_norm_clipped is the clipping rule's norm, which is also the
    norm SGD really applied."""
    x, y = data()
    y = y * 1000
    model = mlp(optimizer=keras.optimizers.SGD(LR, global_clipnorm=1.0))
    snapshots = Snapshots()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir), snapshots])
    logged = series(logdir)
    scalars = scalar_steps_and_values(logdir)
    global_norm = np.sqrt(np.sum(logged.stat("l2_norm").astype(np.float64) ** 2, axis=1))
    assert global_norm.min() > 10  # clipping bites
    np.testing.assert_allclose(scalars["gradients/global_norm"][1], global_norm, rtol=2 * norm_rtol(96))
    clipped = scalars["gradients/global_norm_clipped"][1]
    np.testing.assert_allclose(clipped, np.minimum(global_norm, 1.0), rtol=4 * norm_rtol(96))
    for index in range(4):
        before, after = snapshots.before[index], snapshots.after[index]
        applied = np.concatenate([((b - a) / LR).reshape(-1) for b, a in zip(before, after)])
        e = U * (2 * np.abs(applied) + np.concatenate([np.abs(a).reshape(-1) for a in after]) / LR)
        assert abs(np.linalg.norm(applied) - clipped[index]) <= (
            np.linalg.norm(e) + 4 * norm_rtol(96) * clipped[index])
        # Pre-clip: the batch's own gradient, ~global_norm x the applied one.
        norms = [np.linalg.norm(g) for g in mlp_gradients(before, *batch(x, y, index))]
        np.testing.assert_allclose(logged.stat("l2_norm")[index], norms, rtol=BATCH_RTOL)


def mixed_precision_mlp(optimizer):
    """The MLP in float16 (under the caller's ``mixed_float16`` policy) with a float32 output,
    compiled with a `LossScaleOptimizer` around ``optimizer`` whose first scale, 2**22,
    overflows float16 on the first steps: they are skipped and the scale halves."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((6,)), keras.layers.Dense(12, activation="tanh", name="hidden"),
        keras.layers.Dense(8, activation="tanh", name="middle"),
        keras.layers.Dense(1, name="out", dtype="float32")], name="mp")
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=2.0**22),
                  loss="mse")
    return model


def check_mixed_precision(logdir):
    """LossScaleOptimizer: unscaled gradients, every call a step (skipped ones marked), the loss
    scale logged; steps still TensorBoard's batch_loss steps."""
    x, y = data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mixed_precision_mlp(keras.optimizers.SGD(LR))
        snapshots = Snapshots()
        model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0, callbacks=[
            GradientMonitor(logdir), keras.callbacks.TensorBoard(logdir, update_freq="batch"),
            snapshots])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    logged = series(logdir)
    scalars = scalar_steps_and_values(logdir)
    steps = list(range(1, 17))
    assert logged.steps.tolist() == steps == scalars["batch_loss"][0].tolist(), logged.steps
    skipped = scalars["gradients/skipped_step"][1].astype(bool)
    assert skipped[0] and not skipped[-1], skipped
    nonfinite = (logged.stat("nan_count") + logged.stat("inf_count")).sum(axis=1) > 0
    np.testing.assert_array_equal(nonfinite, skipped)
    scales = scalars["gradients/loss_scale"][1]
    assert scales[0] == 2.0**22 and scales[-1] < 2.0**22, scales
    assert int(np.asarray(model.optimizer.iterations)) == 16 - skipped.sum()
    for index in np.flatnonzero(~skipped):
        for name, b, a in zip(NAMES, snapshots.before[index], snapshots.after[index]):
            assert_applied(logged, index, name, b, a, LR)
    for index in np.flatnonzero(skipped):
        assert all(np.array_equal(b, a) for b, a in zip(snapshots.before[index], snapshots.after[index]))
        assert (logged.stat("update_l2_norm")[index] == 0).all()


class WithSpareWeight(keras.layers.Layer):
    """Owns a trainable weight that never reaches the loss."""

    def build(self, input_shape):
        self.spare = self.add_weight(shape=(3,), name="spare")

    def call(self, inputs):
        return inputs


def check_variables_and_probe(logdir):
    """include/exclude, a frozen layer, a weight without gradient, and probe_data (measured at
    each epoch's end weights, training unchanged)."""
    import logging

    x, y = data()

    def model():
        keras.utils.set_random_seed(0)
        frozen = keras.layers.Dense(6, activation="tanh", name="frozen")
        frozen.trainable = False
        built = keras.Sequential([
            keras.Input((6,)), frozen, keras.layers.Dense(12, activation="tanh", name="hidden"),
            WithSpareWeight(name="spare_owner"), keras.layers.Dense(1, name="out")], name="probed")
        built.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
        return built

    warnings = []

    class Records(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    handler = Records(level=logging.WARNING)
    logging.getLogger("tensorboard_gradients").addHandler(handler)
    try:
        monitored, snapshots = model(), Snapshots()
        history = monitored.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[
            GradientMonitor(logdir, exclude=r"^out/bias$", probe_data=(x[:16], y[:16]),
                            histograms_every_n_steps=3), snapshots])
    finally:
        logging.getLogger("tensorboard_gradients").removeHandler(handler)
    plain = model()
    plain_history = plain.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    assert history.history["loss"] == plain_history.history["loss"]
    for a, b in zip(monitored.trainable_variables, plain.trainable_variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    logged = series(logdir)
    assert logged.variables == ("hidden/kernel", "hidden/bias", "spare_owner/spare", "out/kernel")
    spare = logged.variables.index("spare_owner/spare")
    if BACKEND == "jax":  # jax.grad gives zeros for a variable the loss does not use
        assert not logged.missing.any()
        assert (logged.stat("l2_norm")[:, spare] == 0).all()
        # (the zero fraction at the steps with every statistic: the default cadence)
        assert (logged.stat("zero_fraction")[logged.full_rows, spare] == 1).all()
    else:
        assert logged.missing[:, spare].all() and not logged.missing[:, [0, 1, 3]].any()
        assert sum("spare_owner/spare" in w and "No gradient" in w for w in warnings) == 1, warnings
    probe = series(logdir, "gradients_probe")
    assert probe.steps.tolist() == [4, 8], probe.steps
    frozen_kernel, frozen_bias = (np.array(v, np.float64) for v in monitored.get_layer("frozen").weights)
    for index, values in enumerate(snapshots.epoch_end):
        hidden_kernel, hidden_bias, _, out_kernel, out_bias = values
        layers = [(frozen_kernel, frozen_bias, "tanh"), (hidden_kernel, hidden_bias, "tanh"),
                  (out_kernel, out_bias, None)]
        grads = numpy_gradients(layers, x[:16], y[:16])
        want = [np.linalg.norm(grads[1][0]), np.linalg.norm(grads[1][1]), np.linalg.norm(grads[2][0])]
        got = probe.stat("l2_norm")[index][[0, 1, 3]]
        np.testing.assert_allclose(got, want, rtol=BATCH_RTOL)
        assert np.isnan(probe.stat("l2_norm")[index][2]) == (BACKEND != "jax")


def check_unchanged_training(logdir):
    """Adam with dropout: the monitored fit trains exactly as a plain one (losses and weights),
    with histograms and the probe on."""
    x, y = data()

    def run(callbacks):
        model = mlp(optimizer=keras.optimizers.Adam(0.01), dropout=0.3)
        history = model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=callbacks)
        return model, history.history["loss"]

    plain_model, plain = run([])
    model, monitored = run([GradientMonitor(logdir, histograms_every_n_steps=2,
                                            probe_data=(x[:8], y[:8]))])
    assert monitored == plain, (monitored, plain)
    for a, b in zip(model.trainable_variables, plain_model.trainable_variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert series(logdir).steps.size == 12
    assert np.isfinite(series(logdir).stat("update_l2_norm")).all()


def check_torch_compile(logdir):
    """torch backend, jit_compile=True (torch.compile of the train step): the recorder runs
    outside the compiled graph, on the same gradients (~40 s of compiling on a small CPU)."""
    if BACKEND != "torch":
        raise Skip("torch.compile is the torch backend's")
    import shutil

    if not (shutil.which("cc") or shutil.which("gcc")):
        raise Skip("torch.compile's CPU backend needs a C compiler")
    x, y = data()
    model = mlp(jit_compile=True)
    snapshots = Snapshots()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir), snapshots])
    assert model.jit_compile
    logged = series(logdir)
    assert logged.steps.tolist() == [1, 2, 3, 4]
    for index in range(4):
        for name, b, a in zip(NAMES, snapshots.before[index], snapshots.after[index]):
            assert_applied(logged, index, name, b, a, LR)


def check_fewer_stats(logdir):
    """``stats=``: the stats asked for plus the required ones, in the format's order (no weight
    norms: not asked for; the update norms: asked for), each the applied gradient's; the global
    norm from them."""
    x, y = data()
    model = mlp()
    snapshots = Snapshots()
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir, stats=["zero_fraction", "update_l2_norm"],
                                         histograms_every_n_steps=2), snapshots])
    logged = series(logdir)
    assert logged.stat_names == ("l2_norm", "min", "max", "abs_max", "zero_fraction", "nan_count",
                                 "inf_count", "size", "update_l2_norm"), logged.stat_names
    assert logged.steps.tolist() == [1, 2, 3, 4]
    assert logged.histograms.steps.tolist() == [1, 3]
    for index in range(4):
        before, after = snapshots.before[index], snapshots.after[index]
        for name, b, a in zip(NAMES, before, after):
            assert_applied(logged, index, name, b, a, LR)
        # float32 differences summed in any order: 2 norm_rtol (as in `check_sgd`).
        np.testing.assert_allclose(logged.stat("update_l2_norm")[index],
                                   [np.linalg.norm(a - b) for b, a in zip(before, after)],
                                   rtol=2 * norm_rtol(96) + U)
    scalars = scalar_steps_and_values(logdir)
    np.testing.assert_allclose(
        scalars["gradients/global_norm"][1],
        np.sqrt(np.sum(logged.stat("l2_norm").astype(np.float64) ** 2, axis=1)),
        rtol=2 * norm_rtol(96))


def check_adam(logdir):
    """``adam_rms`` is the RMS of g / sqrt(v_hat), Adam's second moment replayed here in float64
    from this module's own backprop of each step's batch; with AMSGrad and the optimizer's global
    clipping, of the clipped gradient Adam received over AMSGrad's running maximum."""
    x, y = data()
    beta2, clip_norm = 0.99, 0.05
    cases = {
        "adam": (keras.optimizers.Adam(0.01, beta_2=beta2), 1),
        "amsgrad_clipped": (keras.optimizers.AdamW(0.01, beta_2=beta2, amsgrad=True,
                                                   global_clipnorm=clip_norm), 2),
    }
    for case, (optimizer, every) in cases.items():
        case_dir = os.path.join(logdir, case)
        snapshots = Snapshots()
        mlp(optimizer=optimizer).fit(
            x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
            callbacks=[GradientMonitor(case_dir, every_n_steps=every), snapshots])
        logged = series(case_dir)
        seconds = divisor = None
        expected = []
        for index, before in enumerate(snapshots.before):
            grads = mlp_gradients(before, *batch(x, y, index % 4))
            if optimizer.global_clipnorm:
                norm = np.sqrt(sum(np.sum(g**2) for g in grads))
                grads = [g * min(1.0, clip_norm / norm) for g in grads]
            seconds = [beta2 * (0 if seconds is None else s) + (1 - beta2) * g**2
                       for s, g in zip(seconds or grads, grads)]
            divisor = seconds if not optimizer.amsgrad or divisor is None else [
                np.maximum(d, s) for d, s in zip(divisor, seconds)]
            if index % every == 0:
                t = index + 1
                expected.append([np.sqrt(np.mean(g**2 * (1 - beta2**t) / d))
                                 for g, d in zip(grads, divisor)])
        assert logged.steps.tolist() == list(range(1, 9, every)), logged.steps
        # The float32 step's gradients are within ~1e-6 of this float64 backprop (see the
        # module) and v sums their squares: each g^2 / v_hat within ~3e-6 relative, the mean too
        # (measured 2e-7 to 1.5e-6 on the three backends).
        # Adam's RMS is not a norm: logged at the steps with every statistic (the default
        # cadence: the first and every 10th logged one), NaN between.
        full = logged.full_rows
        assert full.tolist() == [i % 10 == 0 for i in range(len(full))]
        assert np.isnan(logged.stat("adam_rms")[~full]).all()
        np.testing.assert_allclose(logged.stat("adam_rms")[full], np.asarray(expected)[full],
                                   rtol=1e-4)
        if optimizer.global_clipnorm:  # clipping bit: the clipped gradient's RMS differs
            assert clip_norm < np.sqrt(np.sum(logged.stat("l2_norm")[0] ** 2)) / 2
    # A LossScaleOptimizer skips the steps whose float16 gradients overflow: Adam's moments do
    # not move, and their rows are NaN (as the PyTorch monitor writes a skipped step); the
    # steps taken stay below Adam's bound sqrt((1 - beta2^t) / (1 - beta2)), t counting them.
    case_dir = os.path.join(logdir, "loss_scaled")
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mixed_precision_mlp(keras.optimizers.Adam(0.01, beta_2=beta2))
        model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0,
                  callbacks=[GradientMonitor(case_dir, stats_every_n_steps=1),
                             keras.callbacks.TensorBoard(case_dir, update_freq="batch")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    rms = series(case_dir).stat("adam_rms")
    skipped = scalar_steps_and_values(case_dir)["gradients/skipped_step"][1].astype(bool)
    assert skipped.any() and not skipped.all(), skipped
    assert np.isnan(rms[skipped]).all()
    taken = np.cumsum(~skipped)[~skipped][:, None].astype(np.float64)
    assert (rms[~skipped] <= np.sqrt((1 - beta2**taken) / (1 - beta2)) * (1 + 1e-5)).all()


SCENARIOS = {
    "sgd": check_sgd,
    "sgd_eager": check_sgd_eager,
    "schedule": check_schedule,
    "steps_per_execution": check_steps_per_execution,
    "data_parallel": check_data_parallel,
    "clipping": check_clipping,
    "mixed_precision": check_mixed_precision,
    "variables_and_probe": check_variables_and_probe,
    "unchanged_training": check_unchanged_training,
    "torch_compile": check_torch_compile,
    "fewer_stats": check_fewer_stats,
    "adam": check_adam,
}


def main(argv):
    root = argv[1] if len(argv) > 1 else tempfile.mkdtemp()
    names = argv[2:] or list(SCENARIOS)
    results, logdirs = {}, {}
    seconds = {}
    for name in names:
        logdir = os.path.join(root, name)
        logdirs[name] = logdir
        start = time.perf_counter()
        try:
            SCENARIOS[name](logdir)
            results[name] = "ok"
        except Skip as skip:
            results[name] = f"skip: {skip}"
        except Exception:  # reported per scenario, so one failure does not hide the others
            results[name] = traceback.format_exc()
        seconds[name] = round(time.perf_counter() - start, 1)
    print(json.dumps({"backend": BACKEND, "results": results, "logdirs": logdirs,
                      "seconds": seconds}))


if __name__ == "__main__":
    main(sys.argv)
