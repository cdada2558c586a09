"""The TF-free GradientWriter: statistics, histograms, missing gradients and layout changes."""

import glob
import logging
import os

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format import columns, metadata
from tensorboard_gradients.format.layout import layer_of

from conftest import assert_row_matches, norm_rtol, reference_histogram, reference_stats

RNG = np.random.default_rng(7)

EDGE_CASES = {
    "dense/kernel": RNG.normal(size=(16, 8)).astype(np.float32),
    "dense/bias": np.array([np.nan, np.inf, -np.inf, 0.0, 2.0, -3.0], np.float32),
    "zeros/kernel": np.zeros((5, 5), np.float32),
    "scalar": np.float32(-0.25),
    "half/kernel": RNG.normal(size=(7,)).astype(np.float16),
    "huge/kernel": np.array([2e30, -3e30, 1e30], np.float32),  # squares overflow float32
    "all_nan/kernel": np.full((3,), np.nan, np.float32),
    "empty/kernel": np.zeros((0, 4), np.float32),
}


def _write_and_read(logdir, gradients, **kwargs):
    with tg.GradientWriter(logdir) as writer:
        tag = writer.write(3, gradients, **kwargs)
    return tg.read_logdir(logdir)["."][tag]


def test_statistics_match_independent_numpy(logdir):
    weights = {name: np.ones(np.shape(g), np.float32) * 0.5 for name, g in EDGE_CASES.items()}
    series = _write_and_read(logdir, EDGE_CASES, weights=weights)
    assert series.stat_names == columns.GRADIENT_STATS + columns.WEIGHT_STATS
    assert list(series.steps) == [3]
    for name, gradient in EDGE_CASES.items():
        assert_row_matches(series, 0, name, reference_stats(gradient, weights[name]))


def test_overflowing_squares_still_give_a_finite_norm(logdir):
    series = _write_and_read(logdir, {"huge/kernel": EDGE_CASES["huge/kernel"]})
    norm = series.stat("l2_norm")[0, 0]
    assert np.isfinite(norm)
    np.testing.assert_allclose(norm, np.sqrt(14) * 1e30, rtol=norm_rtol(14))


def test_nan_and_inf_are_counted_not_propagated(logdir):
    series = _write_and_read(logdir, {"dense/bias": EDGE_CASES["dense/bias"]})
    row = dict(zip(series.stat_names, series.values[0, 0]))
    assert row["nan_count"] == 1 and row["inf_count"] == 2
    assert row["l2_norm"] == pytest.approx(np.sqrt(13.0))
    assert row["min"] == -3.0 and row["max"] == 2.0


def test_missing_gradient_is_missing_not_zero(logdir, caplog):
    gradients = {"used/kernel": np.ones((2, 2)), "unused/kernel": None}
    with caplog.at_level(logging.WARNING):
        with tg.GradientWriter(logdir) as writer:
            for step in range(3):
                writer.write(step, gradients)
    warnings = [r for r in caplog.records if "unused/kernel" in r.getMessage()]
    assert len(warnings) == 1, "a missing gradient is reported once, not every step"
    series = tg.read_logdir(logdir)["."]["gradients"]
    assert series.missing[:, 1].all() and not series.missing[:, 0].any()
    assert np.isnan(series.stat("l2_norm")[:, 1]).all()
    assert (series.stat("l2_norm")[:, 0] == 2.0).all()


def test_histograms_on_fixed_edges(logdir):
    series = _write_and_read(logdir, EDGE_CASES, histograms=True)
    histograms = series.histograms
    assert histograms is not None and list(histograms.steps) == [3]
    assert histograms.log10_edges == columns.HISTOGRAM_LOG10_EDGES
    assert len(histograms.bin_labels) == columns.HISTOGRAM_BINS
    for index, (name, gradient) in enumerate(EDGE_CASES.items()):
        np.testing.assert_array_equal(
            histograms.counts[0, index], reference_histogram(gradient), err_msg=name
        )
        assert histograms.counts[0, index].sum() == np.size(gradient)


def test_histograms_have_their_own_frequency(logdir):
    with tg.GradientWriter(logdir) as writer:
        for step in range(10):
            writer.write(step, {"a/kernel": np.ones(3)}, histograms=step % 5 == 0)
    series = tg.read_logdir(logdir)["."]["gradients"]
    assert list(series.steps) == list(range(10))
    assert list(series.histograms.steps) == [0, 5]


def test_changed_variable_set_starts_a_new_tag(logdir):
    with tg.GradientWriter(logdir) as writer:
        first = writer.write(0, {"a/kernel": np.ones(3)})
        second = writer.write(1, {"a/kernel": np.ones(3), "b/kernel": np.ones(2)})
        back = writer.write(2, {"a/kernel": np.ones(3)})
    assert (first, second, back) == ("gradients", "gradients_varset2", "gradients")
    run = tg.read_logdir(logdir)["."]
    assert list(run["gradients"].steps) == [0, 2]
    assert run["gradients_varset2"].variables == ("a/kernel", "b/kernel")
    assert run["gradients_varset2"].name == "gradients"


def test_float64_gradients_keep_their_range(logdir):
    series = _write_and_read(logdir, {"wide/kernel": np.array([1e300, -2e300])})
    assert series.values.dtype == np.float64
    np.testing.assert_allclose(series.stat("abs_max")[0, 0], 2e300)


def test_bad_input_is_a_clear_error(logdir):
    writer = tg.GradientWriter(logdir)
    with pytest.raises(ValueError, match="at least one gradient"):
        writer.write(0, {})
    with pytest.raises(ValueError, match="weights missing"):
        writer.write(0, {"a/kernel": np.ones(2)}, weights={})
    with pytest.raises(TypeError, match="not numeric"):
        writer.write(0, {"a/kernel": np.array(["x"])})
    writer.close()


def test_layer_names_follow_the_framework_conventions():
    assert layer_of("dense_3/kernel") == "dense_3"
    assert layer_of("model/block/conv/kernel:0") == "model/block/conv"
    assert layer_of("layer1.0.conv1.weight") == "layer1.0.conv1"
    assert layer_of("bias") == "bias"


def test_a_nan_elsewhere_does_not_change_the_finite_rows(logdir):
    """Steps with NaN/Inf take the masked path; finite rows must come out the same as without."""
    finite = {"a/kernel": RNG.normal(size=(30,)), "b/kernel": RNG.normal(size=(4, 4)) * 1e3}
    poisoned = dict(finite, **{"c/kernel": np.array([np.nan, 1.0])})
    with tg.GradientWriter(logdir) as writer:
        writer.write(0, finite)
    with tg.GradientWriter(logdir + "_poisoned") as writer:
        writer.write(0, poisoned)
    clean = tg.read_logdir(logdir)["."]["gradients"].values[0]
    masked = tg.read_logdir(logdir + "_poisoned")["."]["gradients"].values[0, :2]
    # float64, two summation orders of at most 30 entries: 2 (n + 8) u = 8e-15 each; 1e-12 also
    # covers means near 0, whose error is relative to mean_abs (<= 10x the mean here).
    np.testing.assert_allclose(masked, clean, rtol=1e-12)


def _digest_records(logdir):
    """The steps of the digest records in a run directory, and the records, in file order."""
    from tensorboard_gradients.format import event_files, metadata

    found = []
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in event_files.read_events(path):
            for value in event.summary.value:
                if value.tag.endswith(metadata.DIGEST_TAG_SUFFIX):
                    found.append((event.step, metadata.decode_digest(value.tensor.string_val[0])))
    return found


def _write_steps(writer, steps):
    gradients = {"dense/kernel": RNG.normal(size=(4, 3)), "dense/bias": RNG.normal(size=(3,))}
    for step in steps:
        writer.write(step, gradients)


def test_the_digest_is_written_every_1000_steps_and_at_close(logdir):
    """Short runs (the plugin reads them whole) get no record; longer ones one per 1,000 steps
    and one at close, each at the last step it covers and following the one before."""
    with tg.GradientWriter(logdir) as writer:
        _write_steps(writer, range(999))
    assert _digest_records(logdir) == []
    with tg.GradientWriter(logdir + "/long") as writer:
        _write_steps(writer, range(2500))
    records = _digest_records(logdir + "/long")
    assert [step for step, _ in records] == [999, 1999, 2499]
    assert [int(r["first_row"]) for _, r in records] == [0, 1000, 2000]
    assert [len(r["steps"]) for _, r in records] == [1000, 1000, 500]
    with tg.GradientWriter(logdir + "/off", digest=False) as writer:
        _write_steps(writer, range(2500))
    assert _digest_records(logdir + "/off") == []


def test_a_failing_digest_never_stops_training(logdir, monkeypatch, caplog):
    """The digest runs beside training: when it fails (here: out of memory) every step is
    still written, the failure is logged once, and the records written before are voided so
    that TensorBoard reads the steps."""
    from tensorboard_gradients.analysis import digest

    real_feed = digest.Digest.feed
    calls = []

    def fails_second_time(self, rows, **options):
        calls.append(len(rows.steps))
        if len(calls) == 2:
            raise MemoryError("no room")
        return real_feed(self, rows, **options)

    monkeypatch.setattr(digest.Digest, "feed", fails_second_time)
    with caplog.at_level(logging.INFO, logger="tensorboard_gradients"):
        with tg.GradientWriter(logdir) as writer:
            _write_steps(writer, range(3500))
    assert len(tg.read_logdir(logdir)["."]["gradients"].steps) == 3500
    records = _digest_records(logdir)
    assert len(records) == 2 and "void" in records[-1][1] and calls == [1000, 1000]
    assert sum("stops the digest" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("array", [
    np.float32(1.5), np.float64(-2.0), np.array(np.nan, np.float32),
    np.ones((1,), np.float64), np.zeros((0, 3), np.float32),
    RNG.normal(size=(28, 12)).astype(np.float32), RNG.normal(size=(3, 64)),
    np.array([[np.nan, np.inf], [-np.inf, -0.0]], np.float32),
    RNG.normal(size=(4, 6)).astype(np.float32)[:, ::2],  # not contiguous
    np.arange(6, dtype=np.int64).reshape(2, 3),  # not a float: TensorBoard's converter
])
def test_the_writers_tensor_protos_are_tensorboards_byte_for_byte(array):
    from tensorboard.util import tensor_util

    from tensorboard_gradients.format.writer import tensor_proto

    assert (tensor_proto(array).SerializeToString()
            == tensor_util.make_tensor_proto(array).SerializeToString())


def test_a_bytes_payload_is_written_whole_trailing_nul_bytes_included():
    """A digest record's payload ends in NUL bytes whenever its last float is 0: numpy's bytes
    arrays drop them, so bytes must reach the tensor as given, by protobuf and by hand."""
    from tensorboard.compat.proto import summary_pb2

    from tensorboard_gradients.format import wire
    from tensorboard_gradients.format.writer import tensor_proto

    payload = metadata.encode_digest({"last": np.array([1.5, 0.0], np.float32)})
    assert payload.endswith(b"\x00\x00\x00\x00")
    assert tensor_proto(payload).string_val == [payload]
    value = summary_pb2.Summary.Value.FromString(wire.tensor_value("gradients_digest", payload))
    assert value.tensor.string_val == [payload]
    assert metadata.decode_digest(value.tensor.string_val[0])["last"].tolist() == [1.5, 0.0]
