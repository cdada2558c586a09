"""`AnalysisStream`: a series fed a few steps at a time is judged exactly as a whole series,
in memory bounded by the rules' windows."""

import dataclasses
import math

import numpy as np
import pytest

from tensorboard_gradients import analysis
from tensorboard_gradients.format import columns
from tensorboard_gradients.format.layout import Layout
from tensorboard_gradients.format.series import GradientSeries


def random_series(seed):
    """A small series with every finding the rules know (spikes, vanishing stretches, an output
    side falling toward the rest, dead and non-finite steps, missing cells and columns, update
    ratios out of band), random thresholds and irregular step numbers."""
    rng = np.random.default_rng(seed)
    variables, steps = int(rng.integers(1, 14)), int(rng.integers(0, 260))
    names = [f"layer_{int(rng.integers(0, variables // 2 + 1)):02d}/v{i}"
             for i in range(variables)]
    shapes = [None if rng.random() < 0.1 else tuple(rng.integers(1, 9, size=rng.integers(1, 3)))
              for _ in names]
    with_updates = rng.random() < 0.3
    layout = Layout.create(names, shapes, with_weights=with_updates or rng.random() < 0.5,
                           with_updates=with_updates)
    column = {name: i for i, name in enumerate(layout.stats)}
    norms = (10 ** rng.uniform(-9, 4, size=variables)
             * 10 ** rng.normal(scale=rng.uniform(0.01, 0.5), size=(steps, variables)))
    for _ in range(rng.integers(0, 6) if steps else 0):
        norms[rng.integers(steps), rng.integers(variables)] *= 10 ** rng.uniform(0.5, 6)
    for _ in range(rng.integers(0, 4) if steps else 0):
        start = int(rng.integers(steps))
        stop = start + int(rng.integers(1, 40))
        norms[start:stop, rng.integers(variables)] *= 10 ** -rng.uniform(2, 9)
    values = np.zeros((steps, variables, len(layout.stats)),
                      dtype=np.float64 if rng.random() < 0.2 else np.float32)
    values[..., column["l2_norm"]] = norms
    values[..., column["size"]] = 64
    values[..., column["zero_fraction"]] = np.where(
        rng.random((steps, variables)) < 0.05, 1.0, rng.uniform(0, 0.5, (steps, variables)))
    if steps and rng.random() < 0.4:
        start = int(rng.integers(steps))
        values[start:start + int(rng.integers(1, 50)), rng.integers(variables),
               column["zero_fraction"]] = 1.0
    values[..., column["nan_count"]] = (
        rng.random((steps, variables)) < rng.choice([0, 0.002, 0.02])) * rng.integers(1, 50)
    values[..., column["inf_count"]] = (rng.random((steps, variables)) < 0.003) * 2
    if "weight_l2_norm" in column:
        values[..., column["weight_l2_norm"]] = 10 ** rng.uniform(-1, 1, size=variables) * (
            rng.random((steps, variables)) >= 0.01)
    if with_updates:
        noise = 10 ** rng.normal(scale=0.3, size=(steps, variables))
        values[..., column["update_l2_norm"]] = 10 ** rng.uniform(-7, 1, size=variables) * noise
    missing = rng.random((steps, variables)) < rng.choice([0, 0.05, 0.3])
    if rng.random() < 0.2:
        missing[:, rng.integers(variables)] = True
    if steps and rng.random() < 0.2:
        start = int(rng.integers(steps))
        missing[start:start + int(rng.integers(1, 60)), rng.integers(variables)] = True
    values[missing] = np.nan
    step_numbers = np.cumsum(rng.integers(1, 5, size=steps)) + int(rng.integers(0, 100))
    thresholds = analysis.Thresholds(
        sustain_steps=int(rng.integers(1, 9)), spike_window=int(rng.integers(1, 41)),
        spike_zscore=float(rng.uniform(1, 6)), exploding_norm=float(10 ** rng.uniform(-3, 4)),
    ) if rng.random() < 0.7 else analysis.Thresholds()
    if steps and rng.random() < 0.5:
        # The output side converges: it falls toward layers it found vanishing, which stay
        # flagged until they recover by themselves (or do, in a stretch above).
        start = int(rng.integers(steps))
        values[start:, -max(1, variables // 4):, column["l2_norm"]] *= 10 ** -np.linspace(
            0, rng.uniform(1, 6), steps - start)[:, None]
    loss = {}
    if rng.random() < 0.6:
        # A noisy loss with climbs and spikes (some with the gradient), NaN and Inf steps, and
        # steps without a logged loss.
        curve = np.exp(rng.normal(scale=rng.uniform(0.01, 0.6), size=steps)) * 2.0
        for _ in range(rng.integers(0, 6) if steps else 0):
            start = int(rng.integers(steps))
            climb = 10 ** np.linspace(0, rng.uniform(0.1, 2), int(rng.integers(1, 8)))
            curve[start:start + len(climb)] *= climb[:steps - start]
            values[start:start + len(climb), :, column["l2_norm"]] *= rng.uniform(0.5, 20)
        curve[rng.random(steps) < 0.01] = np.nan
        curve[rng.random(steps) < 0.005] = np.inf
        logged = rng.random(steps) >= rng.choice([0, 0.1, 0.5])
        loss = dict(loss=np.where(logged, curve, np.nan), loss_logged=logged)
    if rng.random() < 0.5:
        thresholds = dataclasses.replace(thresholds, loss_window=int(rng.integers(1, 30)),
                                         loss_episode_steps=int(rng.integers(1, 30)),
                                         precursor_sustained_steps=int(rng.integers(1, 7)),
                                         precursor_jump_ratio=float(rng.uniform(2, 30)))
    stats_every = 1
    if rng.random() < 0.35:
        # Norms-only rows (format 1.6): every stat at most every `stats_every` rows, from a
        # random first one, and at a few rows between (steps logged by hand).
        stats_every = int(rng.integers(2, 13))
        full = np.zeros(steps, dtype=bool)
        full[int(rng.integers(stats_every)) if steps else 0::stats_every] = True
        full |= rng.random(steps) < 0.05
        sparse = [i for i, name in enumerate(layout.stats)
                  if name not in columns.EVERY_STEP_STATS]
        values[np.ix_(~full, np.arange(variables), sparse)] = np.nan
    series = GradientSeries(
        run="run", tag="gradients", name="gradients", variables=layout.variables,
        layers=layout.layers, shapes=layout.shapes, stat_names=layout.stats,
        steps=step_numbers, wall_times=np.arange(steps, dtype=float), values=values, **loss,
        stats_every=stats_every,
    )
    return series, thresholds


def _prefix(series, rows):
    return series.at_rows(slice(0, rows))


def _feed(stream, series, start, end):
    """Feeds rows ``start:end`` of ``series`` (with their losses) to ``stream``."""
    return stream.feed_rows(series.at_rows(slice(start, end)))


def _same_alerts(got, expected):
    """Alert lists equal field by field (NaN values equal NaN: a value over no finite step)."""
    def fields(alert):
        return [("nan" if isinstance(v, float) and math.isnan(v) else v)
                for v in alert.to_json().values()]
    return [fields(a) for a in got] == [fields(a) for a in expected]


@pytest.mark.parametrize("seed", range(150))
def test_a_series_fed_in_random_pieces_is_judged_as_the_whole_series(seed):
    series, thresholds = random_series(seed)
    whole = analysis.analyze(series, thresholds)
    rng = np.random.default_rng(1000 + seed)
    count = len(series.steps)
    cuts = sorted(rng.choice(np.arange(1, count), size=min(count - 1, int(rng.integers(0, 12))),
                             replace=False).tolist()) if count > 1 else []
    stream = analysis.AnalysisStream(series, thresholds)
    decided = []
    for start, end in zip([0] + cuts, cuts + [count]):
        decided.append(_feed(stream, series, start, end))
        # Until the stream is closed, decided + provisional = the analysis of the steps so far.
        so_far = analysis.analyze(_prefix(series, end), thresholds)
        np.testing.assert_array_equal(
            np.concatenate(decided + [stream.provisional_classes()]), so_far.classes)
        assert _same_alerts(stream.alerts(), so_far.alerts)
        assert stream.final_rows == sum(len(d) for d in decided)
    decided.append(stream.close())
    np.testing.assert_array_equal(np.concatenate(decided), whole.classes)
    assert _same_alerts(stream.alerts(), whole.alerts)


@pytest.mark.parametrize("seed", range(60))
def test_every_alert_is_raised_at_the_first_step_a_stream_fed_step_by_step_reports_it(seed):
    """`Alert.raised_step`: feeding the run one step at a time (no look-ahead), the alert
    (its rule, subject and first step) first appears after the step ``raised_step``."""
    series, thresholds = random_series(seed)
    stream, first_seen = analysis.AnalysisStream(series, thresholds), {}
    for row, step in enumerate(series.steps.tolist()):
        _feed(stream, series, row, row + 1)
        for alert in stream.alerts():
            first_seen.setdefault(_identity(alert), step)
    stream.close()
    # Fed step by step, the stream judges as the whole series (a spike's excursion that
    # crosses a block boundary is scored on both sides of it).
    assert _same_alerts(stream.alerts(), analysis.analyze(series, thresholds).alerts)
    for alert in stream.alerts():
        assert first_seen[_identity(alert)] == alert.raised_step, alert
        assert alert.first_step <= alert.raised_step <= alert.last_step or (
            alert.kind == "update_ratio" and alert.raised_step >= alert.first_step)


def _identity(alert):
    return (alert.kind, alert.rule, alert.variable, alert.layer, alert.first_step)


def test_a_long_run_fed_step_by_step_keeps_only_its_windows():
    series, _ = random_series(7)
    thresholds = analysis.Thresholds(spike_window=10, sustain_steps=4)
    rng = np.random.default_rng(0)
    values = np.repeat(series.values[:1], 2000, axis=0) * 10 ** rng.normal(
        scale=0.1, size=(2000, len(series.variables), 1))
    long_run = dataclasses.replace(series, steps=np.arange(2000), wall_times=np.arange(2000.0),
                                   values=values.astype(np.float32), loss=None, loss_logged=None)
    stream = analysis.AnalysisStream(long_run, thresholds)
    decided = []
    for row in range(2000):
        decided.append(stream.feed(long_run.steps[row:row + 1], long_run.wall_times[row:row + 1],
                                   long_run.values[row:row + 1]))
        # Kept: the spike block of the first undecided row and the sustain context before it.
        assert stream.rows - stream._kept_from <= 10 + 2 * 3 + 1
    decided.append(stream.close())
    whole = analysis.analyze(long_run, thresholds)
    np.testing.assert_array_equal(np.concatenate(decided), whole.classes)
    assert _same_alerts(stream.alerts(), whole.alerts)


def test_steps_must_increase_and_nothing_follows_a_close():
    series, _ = random_series(3)
    stream = analysis.AnalysisStream(series)
    stream.feed([5, 6], [0.0, 0.0], series.values[:1].repeat(2, axis=0)[:, :, :])
    with pytest.raises(ValueError, match="increase"):
        stream.feed([6], [0.0], series.values[:1])
    with pytest.raises(ValueError, match="shape"):
        stream.feed([7], [0.0], series.values[:1, :1])
    stream.close()
    with pytest.raises(ValueError, match="closed"):
        stream.feed([8], [0.0], series.values[:1])


def _through_a_record(arrays):
    """``arrays`` as a reader gets them back from a digest record (`metadata.encode_digest`)."""
    from tensorboard_gradients.format import metadata

    return metadata.decode_digest(metadata.encode_digest(arrays))


@pytest.mark.parametrize("seed", range(150))
def test_a_stream_resumed_from_its_written_state_goes_on_as_if_never_stopped(seed):
    """A stream's `state`, written after random feeds (one record per feed: the whole-run
    rules' records in pieces) and read back, with its kept rows read again: the resumed stream
    fed the rest judges the run as the whole series (another process takes up a run where the
    writer of its first steps left it)."""
    series, thresholds = random_series(seed)
    rng = np.random.default_rng(2000 + seed)
    count = len(series.steps)
    if count < 2:
        return
    cuts = sorted(rng.choice(np.arange(1, count), size=min(count - 1, int(rng.integers(1, 8))),
                             replace=False).tolist())
    stop_at = int(rng.integers(len(cuts)))  # the writer stops after this feed
    stream, states, final_rows = analysis.AnalysisStream(series, thresholds), [], 0
    for start, end in zip([0] + cuts[:stop_at], cuts[:stop_at + 1]):
        _feed(stream, series, start, end)
        states.append(_through_a_record(stream.state(final_rows)))
        final_rows = stream.final_rows
    rows, kept_from = stream.rows, int(states[-1]["stream_kept_from"])
    resumed = analysis.AnalysisStream.resumed(
        series, thresholds, states,
        series.at_rows(slice(kept_from, rows)), series.steps[:rows])
    decided = [np.zeros((0, len(series.variables)), np.int8)]
    later = [c for c in cuts if c > rows]
    for start, end in zip([rows] + later, later + [count]):
        decided.append(_feed(resumed, series, start, end))
        so_far = analysis.analyze(_prefix(series, end), thresholds)
        np.testing.assert_array_equal(
            np.concatenate(decided + [resumed.provisional_classes()]),
            so_far.classes[final_rows:])
        assert _same_alerts(resumed.alerts(), so_far.alerts)


def _stalled_layer_series():
    """8 layers over 400 steps: layer dense_0 vanished (1e-5 of the others) until step 300,
    the output side falling 100x from step 50 to 150 (toward it), then dense_0 recovers."""
    rng = np.random.default_rng(5)
    names = [f"dense_{i}/kernel" for i in range(8)]
    layout = Layout.create(names, [(8, 8)] * len(names), with_weights=False)
    norms = 0.1 * 10 ** rng.normal(scale=0.1, size=(400, len(names)))
    norms[:300, 0] *= 1e-5
    norms[:, -2:] *= 10 ** np.interp(np.arange(400), [50, 150], [0, -2])[:, None]
    values = np.zeros(norms.shape + (len(layout.stats),), np.float32)
    values[..., layout.stats.index("l2_norm")] = norms
    values[..., layout.stats.index("size")] = 64
    return GradientSeries(
        run="run", tag="gradients", name="gradients", variables=layout.variables,
        layers=layout.layers, shapes=layout.shapes, stat_names=layout.stats,
        steps=np.arange(400), wall_times=np.arange(400.0), values=values)


def test_a_finding_longer_than_a_round_keeps_its_recovery_level_from_round_to_round():
    """The depth finding spans 300 steps, the stream keeps at most 17 rows: the level the
    finding began with is carried round to round (and through a written state), so a stream
    fed a step at a time, or resumed in the middle, ends it where the whole series does."""
    series = _stalled_layer_series()
    thresholds = analysis.Thresholds(spike_window=10, sustain_steps=4)
    whole = analysis.analyze(series, thresholds)
    assert [(a.kind, a.rule, a.layer, a.first_step, a.last_step) for a in whole.alerts] == [
        ("vanishing", "depth", "dense_0", 0, 299)]
    stream = analysis.AnalysisStream(series, thresholds)
    decided, states = [], []
    for row in range(400):
        decided.append(stream.feed(series.steps[row:row + 1], series.wall_times[row:row + 1],
                                   series.values[row:row + 1]))
        assert stream.rows - stream._kept_from <= 10 + 2 * 3 + 1
        if row == 199:
            states.append(_through_a_record(stream.state(0)))
    decided.append(stream.close())
    np.testing.assert_array_equal(np.concatenate(decided), whole.classes)
    assert _same_alerts(stream.alerts(), whole.alerts)

    kept_from = int(states[0]["stream_kept_from"])
    resumed = analysis.AnalysisStream.resumed(
        series, thresholds, states,
        dataclasses.replace(series, steps=series.steps[kept_from:200],
                            wall_times=series.wall_times[kept_from:200],
                            values=series.values[kept_from:200]),
        series.steps[:200])
    rest = [resumed.feed(series.steps[200:], series.wall_times[200:], series.values[200:],
                         last=True)]
    np.testing.assert_array_equal(
        np.concatenate([np.concatenate(decided)[:int(states[0]["stream_final_rows"])]] + rest),
        whole.classes)
    assert _same_alerts(resumed.alerts(), whole.alerts)


def test_the_dead_rule_counts_the_steps_that_logged_the_zero_fraction():
    """Between full steps only the norms are logged (format 1.6): a variable dead at 5 full
    steps in a row is dead, however many norms-only steps lie between; one dead at a single
    full step is not, though the norms-only steps after it hold no sign of recovery."""
    layout = Layout.create(["a/kernel", "b/kernel"], [(4, 4), (4, 4)], with_weights=False)
    column = {name: i for i, name in enumerate(layout.stats)}
    steps, every = 100, 10
    values = np.zeros((steps, 2, len(layout.stats)), np.float32)
    values[..., column["l2_norm"]] = 1.0
    values[..., column["size"]] = 16
    values[..., column["zero_fraction"]] = 0.1
    values[::every, 0, column["zero_fraction"]] = 1.0  # dead at every full step
    values[50, 1, column["zero_fraction"]] = 1.0  # dead at one full step only
    sparse = [i for i, name in enumerate(layout.stats) if name not in columns.EVERY_STEP_STATS]
    full = np.arange(steps) % every == 0
    values[np.ix_(~full, [0, 1], sparse)] = np.nan
    series = GradientSeries(
        run="run", tag="gradients", name="gradients", variables=layout.variables,
        layers=layout.layers, shapes=layout.shapes, stat_names=layout.stats,
        steps=np.arange(steps), wall_times=np.zeros(steps), values=values, stats_every=every)
    np.testing.assert_array_equal(series.full_rows, full)
    assert series.logged_rows("l2_norm").all()
    dead = [a for a in analysis.analyze(series).alerts if a.kind == "dead"]
    assert [(a.variable, a.first_step, a.steps) for a in dead] == [("a/kernel", 0, 10)]
    assert dead[0].raised_step == 40  # the 5th full step (sustain_steps)
    stream = analysis.AnalysisStream(series)
    for row in range(steps):
        _feed(stream, series, row, row + 1)
    stream.close()
    assert _same_alerts(stream.alerts(), analysis.analyze(series).alerts)
