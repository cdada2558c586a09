"""Rows by layer (`analysis.layers`): a layer's row is its variables' gradients as one tensor."""

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import layers
from tensorboard_gradients.format import columns
from tensorboard_gradients.format.series import GradientSeries


def _logged(tmp_path):
    """(series by variable, the same gradients logged as one tensor per layer)."""
    rng = np.random.default_rng(0)
    with tg.GradientWriter(str(tmp_path / "variables")) as by_variable, \
            tg.GradientWriter(str(tmp_path / "layers")) as by_layer:
        for step in range(6):
            # |mean| >> std for the bias: a pooled std that cancelled would come out 0 here.
            kernel = rng.normal(size=(5, 4)).astype(np.float32) * 10.0 ** -step
            bias = (3.0 + rng.normal(size=4) * 1e-4).astype(np.float32)
            out = rng.normal(size=(4, 2)).astype(np.float32)
            if step == 2:
                kernel[0, 0], out[1, 1] = np.nan, np.inf
            if step == 3:
                out[:] = 0.0
            missing = step == 4  # the bias gets no gradient at this step
            by_variable.write(step, {"dense/kernel": kernel,
                                     "dense/bias": None if missing else bias,
                                     "out/kernel": out, "gone/kernel": None})
            by_layer.write(step, {"dense": kernel if missing else np.concatenate(
                [kernel.ravel(), bias]), "out": out, "gone": None})
    logged = tg.read_logdir(str(tmp_path))
    return logged["variables"]["gradients"], logged["layers"]["gradients"]


def test_a_layer_row_equals_its_gradients_logged_as_one_tensor(tmp_path):
    by_variable, by_layer = _logged(tmp_path)
    combined = layers.combined(by_variable)
    assert combined.variables == ("dense", "out", "gone") == combined.layers
    assert combined.shapes[:2] == ((24,), (8,))
    for stat in by_variable.stat_names:
        if stat == "size":  # the layer logged alone at step 4 is the kernel only
            continue
        expected, got = by_layer.stat(stat), combined.stat(stat)
        assert np.array_equal(np.isnan(expected), np.isnan(got)), stat
        if stat.endswith("count"):
            np.testing.assert_array_equal(got, expected, err_msg=stat)
            continue
        # float32 statistics combined in float64: each input is within a few float32 ulps
        # (1e-7 relative) of exact, and every rule is a well-conditioned sum of non-negative
        # terms (or a max), so 1e-5 of the values' scale holds with room. The mean's scale is
        # mean |g|, since the mean cancels itself.
        scale = np.maximum(np.abs(expected), by_layer.stat("mean_abs"))
        error = np.abs(got - expected)[~np.isnan(expected)]
        assert (error <= 1e-5 * scale[~np.isnan(expected)]).all(), (stat, error.max())
    assert combined.stat("std")[0, 0] > 0  # the pooled std of a constant-ish bias did not cancel
    assert np.isnan(combined.stat("l2_norm")[:, 2]).all()  # no gradient at all: missing


def test_a_layers_class_is_its_worst_variables():
    order = layers.Layers.of(["a", "b", "a", "c", "b"])  # reused layers interleave
    assert order.names == ["a", "b", "c"] and order.rows.tolist() == [0, 1, 0, 2, 1]
    classes = np.array([[analysis.OK, analysis.VANISHING, analysis.NONFINITE, analysis.MISSING,
                         analysis.OK]], dtype=np.int8)
    assert order.worst_classes(classes).tolist() == [[analysis.NONFINITE, analysis.VANISHING,
                                                      analysis.MISSING]]


def test_every_logged_statistic_has_a_value_by_layer():
    """Each stat's `columns` row names how a layer combines it: none reads NaN in the Layers
    view where its variables have values."""
    rng = np.random.default_rng(0)
    stats = columns.LOGGED_STATS
    values = rng.uniform(0.1, 0.9, size=(3, 4, len(stats))).astype(np.float32)
    values[:, :, [stats.index("nan_count"), stats.index("inf_count")]] = 0.0
    values[:, :, stats.index("size")] = 6.0
    by_variable = GradientSeries(
        run="run", tag="gradients", name="gradients",
        variables=("a/kernel", "a/bias", "b/kernel", "b/bias"), layers=("a", "a", "b", "b"),
        shapes=((6,),) * 4, stat_names=stats, steps=np.arange(3), wall_times=np.zeros(3),
        values=values)
    by_layer = layers.combined(by_variable)
    assert by_layer.variables == ("a", "b")
    for name in by_layer.available_stats:
        assert not np.isnan(by_layer.stat(name)).any(), name


def test_a_statistic_without_a_known_layer_combination_is_refused():
    with pytest.raises(TypeError):  # no default: a new row must say how a layer combines it
        columns.Stat("new", "new", columns.LOG, columns.GRADIENT, "a new statistic")
    with pytest.raises(ValueError, match="layer_combination 'averaged' is not one of"):
        columns.Stat("new", "new", columns.LOG, columns.GRADIENT, "a new statistic", "averaged")
