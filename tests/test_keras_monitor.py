"""GradientMonitor inside real `model.fit` runs: the logged gradients are the applied ones."""

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients.keras import GradientMonitor  # noqa: E402

from conftest import assert_row_matches, norm_rtol, reference_stats  # noqa: E402

BATCH = 8
# The reference gradients come from a traced tape (`tape_gradients`), the logged ones from the
# traced train step: the same graph rewrites (fused matmul + bias + activation) and kernels, so
# bitwise equal on the CPUs seen. An eager tape is not: unfused kernels round differently, and
# a bias gradient (a sum of residuals that cancel) then moved by 3.4e-6 of itself on one CPU,
# far beyond any per-entry bound. Margin for another CPU's blocking of the K-term products
# (K <= 12 here: batch 8, 12 hidden units): K u per entry.
RECOMPUTED_GRADIENT_RTOL = 12 * np.finfo(np.float32).eps / 2


def data(n=48, features=6, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1))).astype("float32")
    return x, y


def mlp(seed=0, optimizer=None, jit_compile=False, steps_per_execution=1, dropout=0.0):
    keras.utils.set_random_seed(seed)
    layers = [keras.Input((6,)), keras.layers.Dense(12, activation="tanh", name="hidden")]
    if dropout:
        layers.append(keras.layers.Dropout(dropout, name="drop"))
    layers.append(keras.layers.Dense(1, name="out"))
    model = keras.Sequential(layers, name="mlp")
    model.compile(
        optimizer=optimizer or keras.optimizers.SGD(0.05),
        loss="mse",
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def train_series(logdir, name="gradients"):
    return tg.read_logdir(logdir)["train"][name]


def tape_gradients(model, x, y):
    """The gradients of the compiled loss on one batch, traced as Keras traces its train step
    (a new trace per call: the model may have been compiled again)."""

    @tf.function
    def gradients(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    return gradients(x, y)


def test_logged_gradients_are_the_gradients_of_each_batch_at_learning_rate_zero(logdir):
    x, y = data()
    model = mlp(optimizer=keras.optimizers.SGD(0.0))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir)])
    series = train_series(logdir)
    assert series.steps.tolist() == list(range(1, 13))
    assert series.variables == ("hidden/kernel", "hidden/bias", "out/kernel", "out/bias")
    for index, step in enumerate(series.steps):
        batch = (step - 1) % 6
        grads = tape_gradients(model, x[batch * BATCH:(batch + 1) * BATCH], y[batch * BATCH:(batch + 1) * BATCH])
        for variable, name, gradient in zip(model.trainable_variables, series.variables, grads):
            assert_row_matches(series, index, name, reference_stats(gradient.numpy(), variable.numpy()),
                               input_rtol=RECOMPUTED_GRADIENT_RTOL)


def test_with_a_learning_rate_the_logged_gradients_follow_the_training_weights(logdir):
    x, y = data()
    model = mlp()
    replay = mlp()  # same seed: same initial weights
    replay_optimizer = keras.optimizers.SGD(0.05)
    expected = []
    for batch in range(6):
        xb, yb = x[batch * BATCH:(batch + 1) * BATCH], y[batch * BATCH:(batch + 1) * BATCH]
        grads = tape_gradients(replay, xb, yb)
        expected.append([np.linalg.norm(g.numpy()) for g in grads])
        replay_optimizer.apply_gradients(zip(grads, replay.trainable_variables))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir)])
    logged = train_series(logdir).stat("l2_norm")
    # Replayed training: same kernels, same inputs; each step within the norm bound of 72
    # entries plus the recomputed gradient's, carried over 6 steps at most.
    np.testing.assert_allclose(logged, np.array(expected),
                               rtol=6 * (norm_rtol(72) + RECOMPUTED_GRADIENT_RTOL))
    assert np.ptp(logged[:, 0]) > 0  # the weights moved: the check had something to follow


def test_training_results_are_bitwise_unchanged_and_the_model_still_saves(logdir, tmp_path):
    x, y = data()

    def losses(callbacks):
        model = mlp(dropout=0.3, optimizer=keras.optimizers.Adam(0.01))
        history = model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=callbacks)
        return model, history.history["loss"]

    _, plain = losses([])
    monitor = GradientMonitor(logdir, histograms_every_n_steps=2, probe_data=(x[:8], y[:8]))
    model, monitored = losses([monitor])
    assert monitored == plain
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(restored.predict(x, verbose=0), model.predict(x, verbose=0))
    # The hooks are gone after fit: the optimizer is the class' own again.
    assert "apply" not in vars(model.optimizer)
    assert train_series(logdir).steps.size == 18


@pytest.mark.parametrize("source", ["numpy", "dataset", "generator", "pydataset"])
def test_every_input_pipeline_logs_every_step_and_never_validation(logdir, source):
    x, y = data()
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return len(batches)

        def __getitem__(self, index):
            return batches[index]

    def generator():
        while True:
            yield from batches

    inputs = {
        "numpy": dict(x=x, y=y, batch_size=BATCH, shuffle=False),
        "dataset": dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)),
        "generator": dict(x=generator(), steps_per_epoch=len(batches)),
        "pydataset": dict(x=Batches(), shuffle=False),
    }[source]
    model = mlp(optimizer=keras.optimizers.SGD(0.0))
    model.fit(**inputs, epochs=2, verbose=0, validation_data=(x[:16] * 100, y[:16]),
              callbacks=[GradientMonitor(logdir)])
    series = train_series(logdir)
    assert series.steps.tolist() == list(range(1, 13))
    assert series.epoch_starts.tolist() == [1, 7] and series.epoch_indices.tolist() == [0, 1]
    expected = [np.linalg.norm(tape_gradients(model, xb, yb)[0]) for xb, yb in batches] * 2
    np.testing.assert_allclose(series.stat("l2_norm")[:, 0], expected,
                               rtol=norm_rtol(72) + RECOMPUTED_GRADIENT_RTOL)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_steps_per_execution_and_xla_log_every_step_with_its_own_label(logdir, jit_compile):
    x, y = data(n=56)
    reference_dir = os.path.join(logdir, "reference")
    mlp().fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(reference_dir)])
    model = mlp(jit_compile=jit_compile, steps_per_execution=3)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir, histograms_every_n_steps=2)])
    reference = train_series(reference_dir)
    series = train_series(logdir)
    assert series.steps.tolist() == list(range(1, 15)) == reference.steps.tolist()
    # Two trainings, not one computation twice: XLA fuses and orders the forward/backward
    # differently, so each step's gradients differ by ~K u (K <= 12-term products, 7e-7) and
    # SGD carries the difference into the next steps' weights: ~14 K u = 1e-5 after 14 steps;
    # rtol 1e-4 leaves 10x. atol: stats whose true value is ~0 (the mean of a symmetric
    # gradient) have absolute error gamma * mean_abs (see conftest.stat_tolerances) < 1e-7 here.
    # The std is compared too: the naive formula failed this check by 100% (0.0 vs 5.4e-4).
    np.testing.assert_allclose(series.values, reference.values, rtol=1e-4, atol=1e-7)
    assert series.histograms.steps.tolist() == list(range(1, 15, 2))
    assert series.epoch_starts.tolist() == [1, 8]


def test_frequencies_continue_across_fit_calls(logdir):
    x, y = data()
    model = mlp()
    monitor = GradientMonitor(logdir, every_n_steps=4, histograms_every_n_steps=5)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[monitor])
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[monitor])
    series = train_series(logdir)
    assert series.steps.tolist() == [1, 5, 9, 13, 17]
    assert series.histograms.steps.tolist() == [1, 6, 11, 16]
    assert series.epoch_starts.tolist() == [1, 7, 13]
    # A fresh monitor on the trained model continues from the optimizer's counter.
    other = os.path.join(logdir, "again")
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[GradientMonitor(other)])
    assert train_series(other).steps.tolist() == list(range(19, 25))


def test_the_step_is_traced_once_per_model_and_compile_not_per_fit(logdir, monkeypatch):
    """fit once per epoch (tuners, fine-tuning phases) reuses the monitored step; a fit without
    the monitor runs a clean step; compile again traces anew, with the new loss."""
    from tensorboard_gradients.capture import keras_recorder

    traces = []
    record = keras_recorder.StepRecorder._record
    monkeypatch.setattr(keras_recorder.StepRecorder, "_record",
                        lambda self, *args: traces.append(1) or record(self, *args))
    x, y = data()
    model = mlp(optimizer=keras.optimizers.SGD(0.0))
    monitor = GradientMonitor(logdir)
    for _ in range(3):
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    assert len(traces) == 1
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    assert len(traces) == 1
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mae")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[monitor])
    assert len(traces) == 2
    series = train_series(logdir)
    # Steps 19-24 ran without the monitor: not logged.
    assert series.steps.tolist() == list(range(1, 19)) + list(range(25, 37))
    for index, step in enumerate(series.steps):
        if step <= 30 and step % 6 != 3:  # two batches per fit suffice: each fit is checked
            continue
        if step > 30:
            model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mae")
        else:
            model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
        batch = slice((step - 1) % 6 * BATCH, ((step - 1) % 6 + 1) * BATCH)
        grads = tape_gradients(model, x[batch], y[batch])
        for variable, name, gradient in zip(model.trainable_variables, series.variables, grads):
            assert_row_matches(series, index, name,
                               reference_stats(gradient.numpy(), variable.numpy()),
                               input_rtol=RECOMPUTED_GRADIENT_RTOL)


def test_update_norm_is_the_real_weight_change_including_decoupled_weight_decay(logdir):
    x, y = data()
    changes = []

    class WeightChanges(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.before = [v.numpy() for v in self.model.trainable_variables]

        def on_train_batch_end(self, batch, logs=None):
            changes.append([np.linalg.norm(v.numpy() - b) for v, b in
                            zip(self.model.trainable_variables, self.before)])

    model = mlp(optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[GradientMonitor(logdir), WeightChanges()])
    series = train_series(logdir)
    # The reference w_after - w_before of float32 weights cancels: an entry carries u |w| / |dw|
    # relative error, ~6e-8 * 0.5 / 1e-4 = 3e-4 for Adam's smallest moves; 2e-3 leaves a margin,
    # atol the entries that did not move.
    np.testing.assert_allclose(series.stat("update_l2_norm"), np.array(changes), rtol=2e-3, atol=1e-7)
    # SGD without momentum moves each variable by exactly lr * gradient.
    sgd_dir = os.path.join(logdir, "sgd")
    mlp().fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[GradientMonitor(sgd_dir)])
    sgd = train_series(sgd_dir)
    # Both norms of lr * g (no cancellation): each within norm_rtol(72) = 4.8e-6.
    np.testing.assert_allclose(sgd.stat("update_l2_norm"), 0.05 * sgd.stat("l2_norm"),
                               rtol=2 * norm_rtol(72))
    # Logging every 3rd step, the update norm is computed only then, and is still that step's.
    sparse_dir = os.path.join(logdir, "sgd_every_3")
    mlp().fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[GradientMonitor(sparse_dir, every_n_steps=3)])
    sparse = train_series(sparse_dir)
    assert sparse.steps.tolist()[:2] == [1, 4]
    np.testing.assert_allclose(sparse.stat("update_l2_norm"), 0.05 * sparse.stat("l2_norm"),
                               rtol=2 * norm_rtol(72))


def test_clipping_logs_pre_clip_statistics_and_both_global_norms(logdir):
    x, y = data()
    y = y * 1000  # large gradients, so clipping bites
    model = mlp(optimizer=keras.optimizers.SGD(0.0, global_clipnorm=1.0))
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir)])
    series = train_series(logdir)
    grads = tape_gradients(model, x[:BATCH], y[:BATCH])
    assert_row_matches(series, 0, "hidden/kernel", reference_stats(grads[0].numpy(), model.trainable_variables[0].numpy()),
                       input_rtol=RECOMPUTED_GRADIENT_RTOL)
    scalars = scalar_series(logdir)
    global_norm = np.sqrt(np.sum(series.stat("l2_norm") ** 2, axis=1))
    # The global norm over all 97 entries, from the columns or from the gradients.
    np.testing.assert_allclose(scalars["gradients/global_norm"], global_norm, rtol=2 * norm_rtol(97))
    np.testing.assert_allclose(scalars["gradients/global_norm_clipped"], np.minimum(global_norm, 1.0),
                               rtol=2 * norm_rtol(97))
    assert global_norm.min() > 10


def scalar_series(logdir):
    """{tag: values by step} of the ordinary scalars in the run, read with TensorBoard's loader."""
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        os.path.join(logdir, "train"), size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    return {
        tag: np.array([tf.make_ndarray(e.tensor_proto) for e in accumulator.Tensors(tag)])
        for tag in accumulator.Tags()["tensors"]
        if "/" in tag
    }


def test_mixed_precision_logs_unscaled_gradients_loss_scale_and_skipped_steps(logdir):
    x, y = data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="tanh", name="hidden"),
                                  keras.layers.Dense(1, name="out", dtype="float32")], name="mp")
        # 2**22 overflows float16 on the first steps: they are skipped and the scale halves.
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.0), initial_scale=2.0**22)
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0,
                  callbacks=[GradientMonitor(logdir)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    series = train_series(logdir)
    scalars = scalar_series(logdir)
    skipped = scalars["gradients/skipped_step"].astype(bool)
    assert series.steps.tolist() == list(range(1, 25))  # skipped steps stay, counted
    assert skipped[0] and not skipped[-1]
    nonfinite = series.stat("nan_count") + series.stat("inf_count")
    np.testing.assert_array_equal(nonfinite.sum(axis=1) > 0, skipped)
    scales = scalars["gradients/loss_scale"]
    assert scales[0] == 2.0**22 and scales[-1] < 2.0**22
    assert int(np.asarray(model.optimizer.iterations)) == 24 - skipped.sum()
    # Finite steps are unscaled: they match the float16 model's own gradients at the true scale.
    grads = tape_gradients(model, x[-BATCH:], y[-BATCH:])
    # float16 gradients: u = 4.9e-4 per rounding in 8-term products, 4e-3; 2e-2 leaves 5x.
    np.testing.assert_allclose(series.stat("l2_norm")[-1], [np.linalg.norm(g) for g in grads], rtol=2e-2)


class WithSpareWeight(keras.layers.Layer):
    """Owns a trainable weight that never reaches the loss: its gradient is None."""

    def build(self, input_shape):
        self.spare = self.add_weight(shape=(3,), name="spare")

    def call(self, inputs):
        return inputs


def test_adam_rms_of_sparse_and_missing_gradients(logdir):
    """Keras' Adam with an embedding (TensorFlow's IndexedSlices gradients) and a weight without
    a gradient: at the first step v_hat = g^2, so each entry's g^2 / v_hat is 1 where g is not 0
    and 0 where it is, and the RMS is sqrt(the nonzero fraction); the missing gradient's row is
    NaN; later steps stay below Adam's bound sqrt((1 - beta2^t) / (1 - beta2))."""
    keras.utils.set_random_seed(0)
    tokens = keras.Input((5,), dtype="int32")
    embedded = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(64, 4, name="embed")(tokens))
    hidden = WithSpareWeight(name="spare_owner")(embedded)
    model = keras.Model(tokens, keras.layers.Dense(1, name="out")(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01, beta_2=0.99), loss="mse")
    rng = np.random.default_rng(0)
    # No id twice in a batch: Keras' Adam squares a sparse gradient's slices before repeated
    # rows are summed, so its v of a repeated row is not (1 - beta2) g^2 (adam_rms divides by
    # the v Adam holds).
    x = np.concatenate([rng.permutation(64)[:40].reshape(8, 5) for _ in range(2)]).astype("int32")
    y = rng.normal(size=(16, 1)).astype("float32")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir, stats_every_n_steps=2)])
    series = train_series(logdir)
    assert isinstance(tape_gradients(model, x[:8], y[:8])[0], tf.IndexedSlices)
    # Every statistic at steps 1 and 3; at 2 and 4 the norms only (not Adam's RMS), and the
    # update, which is a norm.
    assert series.full_rows.tolist() == [True, False, True, False]
    assert np.isnan(series.stat("adam_rms")[1::2]).all()
    assert not np.isnan(series.stat("update_l2_norm")[:, 0]).any()
    series = series.at_rows(series.full_rows)
    rms = series.stat("adam_rms")
    present = [series.variables.index(n) for n in ("embed/embeddings", "out/kernel", "out/bias")]
    assert np.isnan(rms[:, series.variables.index("spare_owner/spare")]).all()
    # g / sqrt(v_hat) with v_hat = (1 - beta2) g^2 / (1 - beta2): 1 within a few float32
    # roundings (u = 6e-8) per entry.
    np.testing.assert_allclose(rms[0, present],
                               np.sqrt(1 - series.stat("zero_fraction")[0, present]), rtol=1e-5)
    assert series.stat("zero_fraction")[0, present[0]] > 0.3  # rows not looked up: exact zeros
    t = series.steps[:, None].astype(np.float64)
    assert (rms[:, present] <= np.sqrt((1 - 0.99**t) / (1 - 0.99)) * (1 + 1e-5)).all()


def test_awkward_variables_embedding_frozen_missing_shared_and_nested(logdir, caplog):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((5,), dtype="int32")
    embedded = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 4, name="embed")(tokens))
    frozen = keras.layers.Dense(4, name="frozen")
    frozen.trainable = False
    shared = keras.layers.Dense(4, activation="tanh", name="shared")
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4, name="d")], name="inner")
    hidden = inner(shared(shared(WithSpareWeight(name="spare_owner")(frozen(embedded)))))
    model = keras.Model(tokens, keras.layers.Dense(1, name="out")(hidden), name="outer")
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 30, size=(16, 5)).astype("int32")
    x[:, 0] = 3  # repeated ids: IndexedSlices with duplicate indices
    y = rng.normal(size=(16, 1)).astype("float32")
    with caplog.at_level("WARNING", logger="tensorboard_gradients.keras"):
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                  callbacks=[GradientMonitor(logdir)])
    series = train_series(logdir)
    assert series.variables == (
        "embed/embeddings", "spare_owner/spare", "shared/kernel", "shared/bias",
        "inner/d/kernel", "inner/d/bias", "out/kernel", "out/bias",
    )  # frozen/* absent; the shared layer once; the sub-model's layer under its path
    assert series.missing[:, 1].all() and not series.missing[:, [0, 2]].any()
    warnings = [r for r in caplog.records if "No gradient" in r.getMessage()]
    assert len(warnings) == 1 and "spare_owner/spare" in warnings[0].getMessage()
    grads = tape_gradients(model, x[:8], y[:8])
    assert isinstance(grads[0], tf.IndexedSlices)
    assert_row_matches(series, 0, "embed/embeddings",
                       reference_stats(tf.convert_to_tensor(grads[0]).numpy(),
                                       model.get_layer("embed").embeddings.numpy()),
                       input_rtol=RECOMPUTED_GRADIENT_RTOL)
    assert_row_matches(series, 0, "shared/kernel",
                       reference_stats(grads[2].numpy(), model.get_layer("shared").kernel.numpy()),
                       input_rtol=RECOMPUTED_GRADIENT_RTOL)


def test_include_exclude_and_probe(logdir):
    x, y = data()
    model = mlp()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
              callbacks=[GradientMonitor(logdir, include="kernel", exclude=r"^out/",
                                         probe_data=(x[:16], y[:16]))])
    series = train_series(logdir)
    assert series.variables == ("hidden/kernel",)
    probe = train_series(logdir, "gradients_probe")
    assert probe.steps.tolist() == [6, 12]
    grads = tape_gradients(model, x[:16], y[:16])
    np.testing.assert_allclose(probe.stat("l2_norm")[-1, 0], np.linalg.norm(grads[0]),
                               rtol=norm_rtol(72) + RECOMPUTED_GRADIENT_RTOL)


def test_nonfinite_gradients_never_stop_training(logdir):
    x, y = data()
    x[3, 2] = np.nan  # batch 0 produces NaN gradients (and NaN weights after the update)
    model = mlp()
    history = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                        callbacks=[GradientMonitor(logdir, histograms_every_n_steps=1)])
    assert np.isnan(history.history["loss"][0])
    series = train_series(logdir)
    assert series.steps.size == 6
    assert (series.stat("nan_count")[0] > 0).all()
    assert series.histograms.counts[0, 0, -2] > 0  # the NaN column of the histogram


def test_bad_arguments_and_backends_fail_fast_with_clear_messages(logdir, monkeypatch):
    with pytest.raises(ValueError, match="every_n_steps must be a positive integer"):
        GradientMonitor(logdir, every_n_steps=0)
    with pytest.raises(ValueError, match="include must be regular expressions"):
        GradientMonitor(logdir, include="(")
    with pytest.raises(ValueError, match="probe_data must be a tuple"):
        GradientMonitor(logdir, probe_data=np.zeros(3))
    model = mlp()
    x, y = data()
    with pytest.raises(ValueError, match="no trainable variable to log"):
        model.fit(x, y, verbose=0, callbacks=[GradientMonitor(logdir, include="nothing")])
    with pytest.raises(ValueError, match="Keras 3 model"):
        GradientMonitor(logdir).set_model(object())
    # The backend is fixed per process (TensorFlow here); the check reads keras.backend.backend().
    # JAX and PyTorch are supported (tests/test_keras_backends.py trains on each); others are not.
    monkeypatch.setattr(keras.backend, "backend", lambda: "numpy")
    with pytest.raises(ValueError, match="TensorFlow, JAX or PyTorch backend; this Keras runs 'numpy'"):
        GradientMonitor(logdir).set_model(model)
    for supported in ("jax", "torch"):
        monkeypatch.setattr(keras.backend, "backend", lambda: supported)
        GradientMonitor(logdir).set_model(model)


def test_mirrored_strategy_logs_the_all_reduced_gradient_once_per_step(logdir):
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(__file__), "mirrored_fit_script.py")
    result = subprocess.run([sys.executable, script, logdir], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK [1, 2, 3, 4]" in result.stdout


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_the_batches_own_loss_is_logged_at_the_step_that_ends_them(logdir, steps_per_execution):
    """Keras reports the mean loss of the epoch so far; the monitor logs the batches' own (the
    mean of the `steps_per_execution` batches of each call) at the step that ends them: their
    running mean over the epoch is what Keras reported."""
    x, y = data()
    model = mlp(steps_per_execution=steps_per_execution)
    reported = []  # (epoch, Keras' running mean) per on_train_batch_end

    class Losses(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            reported.append((self.epoch, float(logs["loss"])))

    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(logdir), Losses()])
    series = train_series(logdir)
    assert series.steps.tolist() == list(range(1, 13))
    calls_per_epoch = 6 // steps_per_execution
    assert series.steps[series.loss_logged].tolist() == [
        steps_per_execution * k for k in range(1, 2 * calls_per_epoch + 1)]
    logged = series.loss[series.loss_logged]
    for call, (epoch, mean) in enumerate(reported):
        first = epoch * calls_per_epoch
        # Equal batches: the epoch's running mean is the mean of the calls' means so far. The
        # float64 differences lose at most a few ulps of the 6 running means each: 1e-12.
        np.testing.assert_allclose(np.mean(logged[first:call + 1]), mean, rtol=1e-12)
    assert len(set(np.round(logged, 6))) > 1  # not all alike: the check compared something
