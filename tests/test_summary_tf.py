"""The TensorFlow summary op on a real Keras model's gradients, eager and in tf.function."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import keras  # noqa: E402

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients import summary  # noqa: E402

from conftest import assert_row_matches, norm_rtol, reference_histogram, reference_stats  # noqa: E402


class Model:
    """A real Keras model plus the awkward variables a monitor meets in practice."""

    def __init__(self):
        keras.utils.set_random_seed(1)
        tokens = keras.Input((6,), dtype="int32")
        embedded = keras.layers.Embedding(50, 8, name="embed")(tokens)
        pooled = keras.layers.GlobalAveragePooling1D()(embedded)
        hidden = keras.layers.Dense(16, activation="relu", name="hidden")(pooled)
        output = keras.layers.Dense(1, name="out")(hidden)
        self.keras_model = keras.Model(tokens, output)
        self.unused = keras.layers.Dense(3, name="unused")
        self.unused.build((None, 4))
        self.scale = tf.Variable(1.5, name="scale")  # 0-d
        self.half = tf.Variable(tf.ones([4], tf.float16), name="half")
        self.brain = tf.Variable(tf.ones([4], tf.bfloat16), name="brain")
        self.dead = tf.Variable(tf.ones([3]), name="dead")
        self.variables = (
            self.keras_model.trainable_variables
            + self.unused.trainable_variables
            + [self.scale, self.half, self.brain, self.dead]
        )
        # Repeated token ids: the embedding gradient has repeated IndexedSlices indices.
        self.x = tf.constant([[1, 1, 2, 3, 3, 3], [4, 1, 5, 5, 2, 9]], tf.int32)
        self.y = tf.constant([[1.0], [-1.0]])

    def gradients(self, poison=False):
        with tf.GradientTape() as tape:
            prediction = self.keras_model(self.x, training=True) * self.scale
            prediction += tf.reduce_sum(tf.cast(self.half, tf.float32))
            prediction += tf.reduce_sum(tf.cast(self.brain, tf.float32))
            prediction += 0.0 * tf.reduce_sum(self.dead)
            loss = tf.reduce_mean((prediction - self.y) ** 2)
        grads = tape.gradient(loss, self.variables)
        if poison:  # a NaN and an Inf in the output bias gradient
            index = self.names.index("out/bias")
            grads[index] = grads[index] + tf.constant([np.inf]) * 0 + tf.constant([np.nan])
            kernel = self.names.index("out/kernel")
            grads[kernel] = tf.tensor_scatter_nd_update(
                grads[kernel], [[0, 0], [1, 0]], [np.inf, -np.inf]
            )
        return grads

    @property
    def names(self):
        return [getattr(v, "path", None) or v.name.split(":")[0] for v in self.variables]


def _dense(gradient):
    return None if gradient is None else tf.convert_to_tensor(gradient).numpy()


def _weights(model):
    return {n: tf.convert_to_tensor(v).numpy() for n, v in zip(model.names, model.variables)}


def test_op_matches_independent_numpy_and_the_tf_free_writer(tmp_path):
    model = Model()
    grads = model.gradients(poison=True)
    kinds = {n: type(g).__name__ for n, g in zip(model.names, grads)}
    assert kinds["embed/embeddings"] == "IndexedSlices"
    assert kinds["unused/kernel"] == "NoneType"
    assert grads[model.names.index("half")].dtype == tf.float16
    assert grads[model.names.index("brain")].dtype == tf.bfloat16

    writer = tf.summary.create_file_writer(str(tmp_path / "tf"))
    with writer.as_default():
        assert bool(summary.gradients(grads, model.variables, step=5, histograms=True))
    writer.close()
    numpy_grads = {n: _dense(g) for n, g in zip(model.names, grads)}
    with tg.GradientWriter(str(tmp_path / "np")) as np_writer:
        np_writer.write(5, numpy_grads, weights=_weights(model), histograms=True)

    from_tf = tg.read_logdir(str(tmp_path / "tf"))["."]["gradients"]
    from_np = tg.read_logdir(str(tmp_path / "np"))["."]["gradients"]
    assert from_tf.variables == tuple(model.names) == from_np.variables
    assert from_tf.layers == from_np.layers
    assert from_tf.shapes == from_np.shapes
    assert from_tf.stat_names == from_np.stat_names
    weights = _weights(model)
    for name, gradient in numpy_grads.items():
        if gradient is None:
            continue
        expected = reference_stats(gradient.astype(np.float64), weights[name])
        assert_row_matches(from_tf, 0, name, expected)
        assert_row_matches(from_np, 0, name, expected)
    # Each is within its rounding bound of the truth (checked above), so of each other within
    # twice the largest: the 50 x 8 embedding; atol: means near 0 (error gamma * mean_abs).
    np.testing.assert_allclose(from_tf.values, from_np.values, rtol=2 * norm_rtol(400), atol=1e-7)
    assert from_tf.missing[0, model.names.index("unused/kernel")]
    embed = model.names.index("embed/embeddings")
    for series in (from_tf, from_np):
        counts = series.histograms.counts[0]
        for index, name in enumerate(model.names):
            if numpy_grads[name] is not None:
                np.testing.assert_array_equal(counts[index], reference_histogram(numpy_grads[name]), err_msg=name)
        assert counts[embed].sum() == 50 * 8  # absent embedding rows counted as zeros


def test_repeated_embedding_rows_are_summed_before_the_norm(tmp_path):
    model = Model()
    grads = model.gradients()
    embed = model.names.index("embed/embeddings")
    slices = grads[embed]
    assert len(np.unique(slices.indices.numpy())) < len(slices.indices.numpy())
    naive_norm = np.linalg.norm(slices.values.numpy())
    true_norm = np.linalg.norm(tf.convert_to_tensor(slices).numpy())
    assert not np.isclose(naive_norm, true_norm)
    stats = summary.gradient_statistics(grads, model.variables).numpy()
    np.testing.assert_allclose(stats[embed, 0], true_norm, rtol=norm_rtol(400))


def test_traced_once_inside_tf_function_with_tensor_histogram_condition(tmp_path):
    model = Model()
    writer = tf.summary.create_file_writer(str(tmp_path))
    traces = []

    @tf.function
    def train_step(step):
        traces.append(1)
        grads = model.gradients()
        with writer.as_default(step=step):
            return summary.gradients(grads, model.variables, histograms=step % 3 == 0)

    for step in range(7):
        assert bool(train_step(tf.constant(step, tf.int64)))
    writer.close()
    assert len(traces) == 1
    series = tg.read_logdir(str(tmp_path))["."]["gradients"]
    assert list(series.steps) == list(range(7))
    assert list(series.histograms.steps) == [0, 3, 6]
    np.testing.assert_allclose(
        series.stat("l2_norm")[0],
        summary.gradient_statistics(model.gradients(), model.variables).numpy()[:, 0],
        rtol=2 * norm_rtol(400),  # traced vs eager: two computations, each within the bound
    )


def test_step_defaults_to_the_global_summary_step(tmp_path):
    model = Model()
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        tf.summary.experimental.set_step(42)
        try:
            summary.gradients(model.gradients(), model.variables)
        finally:
            tf.summary.experimental.set_step(None)
    writer.close()
    assert list(tg.read_logdir(str(tmp_path))["."]["gradients"].steps) == [42]


def test_without_a_default_writer_nothing_is_written():
    model = Model()
    assert not bool(summary.gradients(model.gradients(), model.variables, step=0))


def test_statistics_compile_with_xla_and_are_written_outside(tmp_path):
    keras.utils.set_random_seed(3)
    dense = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    x = tf.random.normal((8, 5))

    @tf.function(jit_compile=True)
    def compiled_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(dense(x) ** 2)
        grads = tape.gradient(loss, dense.trainable_variables)
        return grads, summary.gradient_statistics(grads, dense.trainable_variables, histograms=True)

    grads, (stats, counts) = compiled_step()
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        summary.write_statistics(stats, dense.trainable_variables, step=1, histogram_counts=counts)
    writer.close()
    series = tg.read_logdir(str(tmp_path))["."]["gradients"]
    for index, variable in enumerate(dense.trainable_variables):
        expected = reference_stats(grads[index].numpy(), variable.numpy())
        assert_row_matches(series, 0, variable.path, expected)
    assert series.histograms.counts[0].sum() == sum(np.size(g) for g in grads)


def test_changed_variable_set_under_one_writer_gets_a_new_tag(tmp_path):
    model = Model()
    grads = model.gradients()
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
        summary.gradients(grads, model.variables, step=0)
        summary.gradients(grads[:2], model.variables[:2], step=1)
    writer.close()
    run = tg.read_logdir(str(tmp_path))["."]
    assert sorted(run) == ["gradients", "gradients_varset2"]
    assert len(run["gradients_varset2"].variables) == 2


def test_mismatched_lengths_are_a_clear_error():
    model = Model()
    with pytest.raises(ValueError, match="same order"):
        summary.gradients(model.gradients()[:1], model.variables, step=0)


def test_with_a_gradient_writer_the_op_writes_the_same_summaries_from_a_graph(tmp_path):
    model = Model()
    tf_writer = tf.summary.create_file_writer(str(tmp_path / "tf_writer"))
    own_writer = tg.GradientWriter(str(tmp_path / "gradient_writer"))

    @tf.function
    def log(step):
        grads = model.gradients()
        with tf_writer.as_default(step=step):
            summary.gradients(grads, model.variables, histograms=step % 2 == 0)
        return summary.gradients(grads, model.variables, step=step, histograms=step % 2 == 0,
                                 writer=own_writer)

    assert all(bool(log(tf.constant(step, tf.int64))) for step in range(3))
    tf_writer.close()
    own_writer.close()
    runs = tg.read_logdir(str(tmp_path))
    via_tf, via_writer = runs["tf_writer"]["gradients"], runs["gradient_writer"]["gradients"]
    assert via_writer.variables == via_tf.variables
    np.testing.assert_array_equal(via_writer.values, via_tf.values)
    assert via_writer.histograms.steps.tolist() == via_tf.histograms.steps.tolist() == [0, 2]


def test_statistics_are_computed_where_the_gradients_are_not_pinned_to_the_cpu(tmp_path):
    # `tf.summary.write` runs its tensor callable under device("cpu:0"): on a GPU that would copy
    # every gradient to the host. The traced step must leave the statistics unplaced (the
    # placer puts them with the gradients); only the written summary is on the CPU.
    variable = tf.Variable(tf.ones([64, 8]), name="kernel")
    writer = tf.summary.create_file_writer(str(tmp_path))

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(x @ variable))
        grads = tape.gradient(loss, [variable])
        with writer.as_default(step=1):
            summary.gradients(grads, [variable], histograms=True)

    operations = step.get_concrete_function(tf.TensorSpec([4, 64])).graph.get_operations()
    reductions = [op for op in operations if op.type in ("Sum", "Max", "Min", "Sqrt", "Abs")]
    assert reductions and all("CPU" not in op.device for op in reductions), [
        (op.name, op.device) for op in reductions if "CPU" in op.device]
    assert any(op.type == "WriteSummary" for op in operations)


def test_the_loss_is_written_beside_the_statistics_by_either_writer_inside_tf_function(tmp_path):
    model = Model()
    tf_writer = tf.summary.create_file_writer(str(tmp_path / "tf_writer"))
    own_writer = tg.GradientWriter(str(tmp_path / "gradient_writer"))
    losses = [0.5, float("nan"), 0.25]

    @tf.function
    def log(step, loss):
        grads = model.gradients()
        with tf_writer.as_default(step=step):
            summary.gradients(grads, model.variables, loss=loss)
        return summary.gradients(grads, model.variables, step=step, writer=own_writer, loss=loss)

    for step, loss in enumerate(losses):
        assert bool(log(tf.constant(step, tf.int64), tf.constant(loss, tf.float32)))
    tf_writer.close()
    own_writer.close()
    runs = tg.read_logdir(str(tmp_path))
    for run in ("tf_writer", "gradient_writer"):
        series = runs[run]["gradients"]
        assert series.loss_source == "gradients_loss" and series.loss_logged.all()
        assert series.loss[0] == 0.5 and np.isnan(series.loss[1]) and series.loss[2] == 0.25
