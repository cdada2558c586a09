"""The diagnosis rules on synthetic series: what must alert, and what must not."""

import dataclasses
import warnings

import numpy as np
import pytest

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import groups
from tensorboard_gradients.analysis.evidence import Evidence
from tensorboard_gradients.analysis.layers import Layers
from tensorboard_gradients.format.layout import Layout
from tensorboard_gradients.format.reader import GradientSeries

from test_analysis_stream import random_series

STEPS = 300


def make_series(norms, variables, zero_fraction=None, nonfinite=None, missing=None,
                weights=None, updates=None, shapes=None):
    """A series whose l2_norm is ``norms[step, variable]`` (other stats consistent enough)."""
    norms = np.asarray(norms, dtype=np.float64)
    layout = Layout.create(
        variables, shapes or [(8, 8)] * len(variables), with_weights=weights is not None,
        with_updates=updates is not None,
    )
    values = np.zeros(norms.shape + (len(layout.stats),))
    column = {name: i for i, name in enumerate(layout.stats)}
    values[..., column["l2_norm"]] = norms
    values[..., column["size"]] = 64
    values[..., column["zero_fraction"]] = 0.0 if zero_fraction is None else zero_fraction
    if nonfinite is not None:
        values[..., column["nan_count"]] = nonfinite
    if weights is not None:
        values[..., column["weight_l2_norm"]] = weights
    if updates is not None:
        values[..., column["update_l2_norm"]] = updates
    if missing is not None:
        values[missing] = np.nan
    return GradientSeries(
        run="run", tag="gradients", name="gradients", variables=layout.variables,
        layers=layout.layers, shapes=layout.shapes, stat_names=layout.stats,
        steps=np.arange(norms.shape[0]) * 10, wall_times=np.arange(norms.shape[0], dtype=float),
        values=values,
    )


def deep_net(depth=12, scale=0.1, noise=0.1, steps=STEPS, seed=0):
    """A healthy deep ReLU net: every layer's kernel and bias within a few x of each other."""
    rng = np.random.default_rng(seed)
    variables = []
    for layer in range(depth):
        variables += [f"dense_{layer:02d}/kernel", f"dense_{layer:02d}/bias"]
    levels = np.tile([scale, scale / 3], depth)
    norms = levels * 10 ** rng.normal(scale=noise, size=(steps, len(variables)))
    return norms, variables


def kinds(alerts):
    return sorted({(a.kind, a.rule) for a in alerts})


def test_healthy_deep_relu_net_has_no_alerts_and_all_cells_ok():
    norms, variables = deep_net()
    series = make_series(norms, variables)
    assert analysis.diagnose(series) == []
    assert (analysis.classify(series) == analysis.OK).all()


def test_one_noisy_step_is_not_an_alert_nor_a_highlighted_cell():
    norms, variables = deep_net()
    norms[150, 3] = 1e-9  # below the absolute floor, once
    norms[200, :6] *= 1e-6  # three layers collapse relative to depth, once
    series = make_series(norms, variables)
    assert analysis.diagnose(series) == []
    assert (analysis.classify(series) == analysis.OK).all()


def test_a_legitimately_small_final_bias_is_not_flagged():
    norms, variables = deep_net()
    variables += ["logits/kernel", "logits/bias"]
    final = np.column_stack([np.full(STEPS, 0.3), np.full(STEPS, 1e-5)])
    series = make_series(np.column_stack([norms, final]), variables)
    assert analysis.diagnose(series) == []


def test_input_side_layers_vanishing_by_depth_are_flagged_per_layer():
    norms, variables = deep_net()
    norms[100:140, :4] *= 1e-5  # dense_00 and dense_01, 40 logged steps, above the floor
    series = make_series(norms, variables)
    alerts = analysis.diagnose(series)
    assert kinds(alerts) == [("vanishing", "depth")]  # and no spike when they recover
    assert sorted(a.layer for a in alerts) == ["dense_00", "dense_01"]
    for alert in alerts:
        assert alert.variable is None and alert.severity == "warning"
        assert (alert.first_step, alert.last_step, alert.steps) == (1000, 1390, 40)
        assert alert.value < 1e-4 and "output-side" in alert.message
    classes = analysis.classify(series)
    assert (classes[100:140, :4] == analysis.VANISHING).all()
    assert (classes[:100] == analysis.OK).all() and (classes[140:] == analysis.OK).all()


def layer_norms_and_reference(series, thresholds=analysis.Thresholds()):
    """(``[steps, layers]`` layer norms, ``[steps]`` output-side reference), computed here as
    `Thresholds` documents them: layers' finite norms together, the median of the last quarter
    of the layers that are below ``exploding_norm``."""
    layers = Layers.of(series.layers)
    norms = layers.root_sum_squares(Evidence(series, thresholds, analysis.RULES).finite_norms)
    output_side = norms[:, -max(1, int(np.ceil(len(layers.names)
                                             * thresholds.depth_reference_fraction))):]
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN step has no reference
        reference = np.nanmedian(np.where(output_side >= thresholds.exploding_norm, np.nan,
                                          output_side), axis=1)
    return norms, reference


def shrink_output_side(norms, start=100, stop=200, factor=1e-2):
    """The last three layers' (the output side's) norms times ``factor``, reached log-linearly
    from step ``start`` to ``stop``: the output side converges while the input side stalls."""
    fall = np.interp(np.arange(len(norms)), [start, stop], [0.0, np.log10(factor)])
    norms[:, -6:] *= 10 ** fall[:, None]


def depth_findings(alerts):
    return [(a.layer, a.first_step, a.last_step, a.steps) for a in alerts
            if (a.kind, a.rule) == ("vanishing", "depth")]


def test_a_vanished_layer_stays_flagged_while_the_output_side_shrinks_toward_it():
    norms, variables = deep_net()
    norms[:, :2] *= 1e-5  # dense_00 vanished from the start, and stays where it is
    shrink_output_side(norms)
    series = make_series(norms, variables)
    layer_norms, reference = layer_norms_and_reference(series)
    ratios = layer_norms[:, 0] / reference
    assert ratios[:100].max() < 1e-4 < ratios[200:].min()  # the output side came down to it
    alerts = analysis.diagnose(series)
    assert kinds(alerts) == [("vanishing", "depth")]
    assert depth_findings(alerts) == [("dense_00", 0, (STEPS - 1) * 10, STEPS)]
    classes = analysis.classify(series)
    assert (classes[:, :2] == analysis.VANISHING).all() and (classes[:, 2:] == analysis.OK).all()


def test_a_vanished_layer_that_recovers_by_itself_is_no_longer_flagged():
    norms, variables = deep_net()
    norms[:, :2] *= 1e-5
    shrink_output_side(norms)
    norms[250:, :2] *= 1e3  # dense_00 back above 1e-4 x the output side's norm at step 0
    series = make_series(norms, variables)
    layer_norms, reference = layer_norms_and_reference(series)
    assert layer_norms[250:, 0].min() > 1e-4 * reference[0]
    # It ends where the layer's recovery begins (held for sustain_steps).
    assert depth_findings(analysis.diagnose(series)) == [("dense_00", 0, 2490, 250)]
    classes = analysis.classify(series)
    assert (classes[:250, :2] == analysis.VANISHING).all()
    assert (classes[250:] == analysis.OK).all()


def test_a_noisy_step_or_a_network_wide_rise_is_not_a_recovery():
    norms, variables = deep_net()
    norms[:, :2] *= 1e-5
    # 3 steps (fewer than sustain_steps) far above its recovery level: a noisy batch.
    norms[150:153, :2] *= 1e4
    # Every layer's gradient 100x from step 200 (its loss grew): dense_00 is above the level
    # where its finding began, but still 1e-5 of the output side's at the same step.
    norms[200:] *= 100
    series = make_series(norms, variables)
    layer_norms, reference = layer_norms_and_reference(series)
    assert (layer_norms[200:, 0] > 1e-4 * reference[0]).all()
    assert depth_findings(analysis.diagnose(series)) == [
        ("dense_00", 0, (STEPS - 1) * 10, STEPS)]
    assert (analysis.classify(series)[:, :2] == analysis.VANISHING).all()
    # Held for sustain_steps, the same 3 steps are a recovery (and the layer vanishes again).
    assert depth_findings(analysis.diagnose(series, sustain_steps=3)) == [
        ("dense_00", 0, (STEPS - 1) * 10, STEPS - 3)]
    assert (analysis.classify(series, analysis.Thresholds(sustain_steps=3))[150:153, :2]
            == analysis.OK).all()


def in_long_runs(flags, length):
    """``flags`` where a cell is in a run of at least ``length`` True cells down its column,
    found one run at a time."""
    found = np.zeros_like(flags)
    for column in range(flags.shape[1]):
        step = 0
        while step < len(flags):
            end = step
            while end < len(flags) and flags[end, column]:
                end += 1
            found[step:end, column] = end - step >= length
            step = max(end, step + 1)
    return found


def vanishing_step_by_step(series, thresholds):
    """(``[steps, layers]`` below the floor, ``[steps, layers]`` in a depth finding), as
    `Thresholds` documents the vanishing rule, one layer and one step at a time."""
    norms, reference = layer_norms_and_reference(series, thresholds)
    sustain = thresholds.sustain_steps
    with np.errstate(invalid="ignore", divide="ignore"):
        floor = in_long_runs(norms < thresholds.vanishing_norm, sustain)
        below = norms / reference[:, None] < thresholds.depth_ratio
    onsets = in_long_runs(below, sustain)
    depth = np.zeros_like(below)
    for layer in range(norms.shape[1] if norms.shape[1] > 1 else 0):  # one layer: no depth
        level = None
        for step in range(len(norms)):
            ahead = slice(step, step + sustain)
            if (level is not None and step + sustain <= len(norms)
                    and not below[ahead, layer].any() and (norms[ahead, layer] >= level).all()):
                level = None  # the first of sustain_steps steps back above it
            if level is None and onsets[step, layer]:
                level = np.float32(thresholds.depth_ratio * reference[step])
            depth[step, layer] = level is not None and not np.isnan(norms[step, layer])
    return floor, depth


@pytest.mark.parametrize("seed", range(80))
def test_the_vanishing_rule_is_its_documented_definition_step_by_step(seed):
    series, thresholds = random_series(seed)
    floor, depth = vanishing_step_by_step(series, thresholds)
    rule = next(rule for rule in analysis.RULES if rule.name == "vanishing")
    cells = Evidence(series, thresholds, analysis.RULES).cells(rule)
    rows = Layers.of(series.layers).rows
    np.testing.assert_array_equal(cells, (floor | depth)[:, rows] & ~np.isnan(series.stat("size")))
    names = Layers.of(series.layers).names
    assert sorted(depth_findings(analysis.diagnose(series, thresholds))) == sorted(
        (names[layer], int(series.steps[steps[0]]), int(series.steps[steps[-1]]), len(steps))
        for layer, steps in ((layer, np.flatnonzero(depth[:, layer]))
                             for layer in range(depth.shape[1])) if len(steps))


def test_an_exploding_output_side_does_not_make_healthy_layers_vanish():
    norms, variables = deep_net()
    norms[200:, -6:] *= 1e6  # the last three layers explode; the others are unchanged
    alerts = analysis.diagnose(make_series(norms, variables))
    assert {a.kind for a in alerts} == {"exploding"}
    classes = analysis.classify(make_series(norms, variables))
    assert (classes[200:, :-6] == analysis.OK).all()


def test_absolute_floor_judges_whole_layers_and_needs_sustained_steps():
    norms, variables = deep_net()
    norms[50:60, 4:6] = 1e-9  # layer dense_02: kernel and bias
    norms[80:83, 6:8] = 1e-9  # layer dense_03, for 3 < sustain_steps
    series = make_series(norms, variables)
    alerts = analysis.diagnose(series, depth_ratio=1e-12)  # the depth rule would fire too
    assert [(a.kind, a.rule, a.variable, a.layer, a.first_step, a.last_step)
            for a in alerts] == [("vanishing", "absolute", None, "dense_02", 500, 590)]
    # The layer's norm: both variables' together.
    assert alerts[0].value == pytest.approx(np.sqrt(2) * 1e-9)
    assert alerts[0].message.startswith("layer dense_02: gradient norm stayed below 1e-07")
    classes = analysis.classify(series)
    assert (classes[50:60, 4:6] == analysis.VANISHING).all()
    assert (classes[:50] == analysis.OK).all()
    longer = analysis.diagnose(series, sustain_steps=3, depth_ratio=1e-12)
    assert {a.layer for a in longer} == {"dense_02", "dense_03"}


def test_a_tiny_variable_next_to_a_training_one_is_not_vanishing():
    # A healthy MobileNet's batch-norm betas that feed another normalisation get 1e-8 gradients
    # (the next layer subtracts their shift) while their gammas train: not a vanishing layer.
    norms, variables = deep_net()
    norms[:, 5] = 2e-8
    series = make_series(norms, variables)
    assert analysis.diagnose(series) == []
    assert (analysis.classify(series) == analysis.OK).all()


def test_nonfinite_reports_first_step_and_every_variable_hit_there():
    norms, variables = deep_net()
    counts = np.zeros_like(norms)
    counts[120, [7, 2]] = [5, 1]
    counts[121:, :] = 64  # everything is NaN afterwards
    alerts = analysis.diagnose(make_series(norms, variables, nonfinite=counts))
    nonfinite = [a for a in alerts if a.kind == "nonfinite"]
    assert len(nonfinite) == len(variables)
    assert all(a.severity == "critical" for a in nonfinite)
    first = [a for a in nonfinite if a.first_step == 1200]
    assert [a.variable for a in first] == [variables[2], variables[7]]  # model order
    assert alerts[:2] == first  # most urgent first
    assert all("first non-finite" in a.message for a in first)
    assert not any("first non-finite" in a.message for a in nonfinite[2:])
    assert first[1].steps == STEPS - 120
    classes = analysis.classify(make_series(norms, variables, nonfinite=counts))
    assert classes[120, 7] == analysis.NONFINITE and classes[120, 0] == analysis.OK


def test_an_all_nan_gradient_is_nonfinite_only_not_vanishing_dead_or_off_band():
    # What a diverged run logs: every entry NaN, so the norm over finite entries is 0, the zero
    # fraction 0, and the update/weight ratio meaningless. Only the nonfinite rule may speak.
    norms, variables = deep_net()
    counts = np.zeros_like(norms)
    counts[150:, :] = 64
    norms[150:, :] = 0.0
    ratios = np.where(np.arange(STEPS)[:, None] >= 150, 0.0, 1e-3)
    series = make_series(norms, variables, nonfinite=counts, zero_fraction=0.0,
                         weights=np.ones_like(norms), updates=ratios * np.ones_like(norms))
    assert kinds(analysis.diagnose(series)) == [("nonfinite", "count")]
    assert (analysis.classify(series)[150:] == analysis.NONFINITE).all()


def test_exploding_absolute_and_global_norm():
    norms, variables = deep_net()
    norms[250, 4] = 5e3
    series = make_series(norms, variables)
    alerts = analysis.diagnose(series)
    critical = [a for a in alerts if a.severity == "critical"]
    assert kinds(critical) == [("exploding", "absolute"), ("exploding", "global")]
    absolute = next(a for a in critical if a.rule == "absolute")
    assert (absolute.variable, absolute.first_step, absolute.value) == (variables[4], 2500, 5e3)
    glob = next(a for a in critical if a.rule == "global")
    assert glob.variable is None and glob.layer is None and glob.value >= 5e3
    assert analysis.classify(series)[250, 4] == analysis.EXPLODING


def test_global_norm_alone_can_explode():
    variables = [f"d{i}/kernel" for i in range(100)]
    norms = np.full((STEPS, 100), 50.0)  # each variable below 1e3, together 500
    norms[200:] = 150.0  # together 1500
    alerts = analysis.diagnose(make_series(norms, variables))
    assert [(a.kind, a.rule, a.first_step) for a in alerts if a.severity == "critical"] == [
        ("exploding", "global", 2000)
    ]


def test_spike_against_running_median_but_not_a_small_bump():
    norms, variables = deep_net(noise=0.05)
    norms[200, 9] *= 30  # 30x: a spike, far below the absolute ceiling
    norms[220, 11] *= 2  # 2x: normal variation
    series = make_series(norms, variables)
    alerts = analysis.diagnose(series)
    spikes = [a for a in alerts if a.rule == "spike"]
    assert [(a.kind, a.variable, a.first_step) for a in spikes] == [("spike", variables[9], 2000)]
    assert spikes[0].severity == "warning" and spikes[0].value >= 5
    ratio = float(spikes[0].message.split("spiked to ")[1].split("x its")[0])
    assert 20 < ratio < 45
    assert not [a for a in alerts if a.kind == "exploding"]  # far below the ceiling
    classes = analysis.classify(series)
    assert classes[200, 9] == analysis.SPIKE and classes[220, 11] == analysis.OK
    # No history yet: the first spike_window steps are judged by the absolute ceiling only.
    early, _ = deep_net(noise=0.05)
    early[10, 9] *= 30
    assert not [a for a in analysis.diagnose(make_series(early, variables)) if a.rule == "spike"]


def test_a_rise_of_orders_of_magnitude_that_stays_is_a_surge_below_the_ceiling():
    """Issue 35: a blow-up over tens of steps changes level, so it is no spike; risen 1e4x and
    staying there, it is a surge, of the variable and of the global norm, raised when it has
    lasted sustain_steps; a 10x change of level is not one."""
    norms, variables = deep_net(noise=0.05)
    norms[150:, 5] *= np.minimum(1e4, 10.0 ** ((np.arange(STEPS - 150) + 1) / 2))  # 20 steps up
    norms[150:, 9] *= 10  # a change of level
    series = make_series(norms, variables)
    surges = [a for a in analysis.diagnose(series) if a.rule in ("surge", "global_surge")]
    assert sorted((a.rule, str(a.variable)) for a in surges) == [("global_surge", "None"),
                                                                 ("surge", variables[5])]
    limit = analysis.Thresholds().surge_ratio
    for alert in surges:
        assert alert.severity == "warning", "without a loss nothing else can tell"
        assert alert.value >= limit and alert.last_step > alert.first_step
        assert alert.raised_step == alert.first_step + 10 * (analysis.Thresholds().sustain_steps - 1)
        assert not any(norms[:, 5] >= analysis.Thresholds().exploding_norm), "below the ceiling"
    # The loss logged at those steps: the loss-spike rule judges consequences, a surge is info.
    with_loss = dataclasses.replace(series, loss=np.ones(STEPS), loss_logged=np.ones(STEPS, bool))
    assert {a.severity for a in analysis.diagnose(with_loss) if a.rule.endswith("surge")} == {"info"}


def test_a_jump_of_a_norm_far_below_the_rest_is_not_a_spike():
    # A vanishing-scale layer's 1e-9 -> 1e-7 (the deep sigmoid net), or a bias far
    # below its kernel: the jump changes no update, so no finding and no spike cell.
    norms, variables = deep_net(noise=0.05)
    norms[:, 3] = 1e-9 * 10 ** np.random.default_rng(1).normal(scale=0.05, size=STEPS)
    norms[200, 3] *= 100
    series = make_series(norms, variables)
    assert not [a for a in analysis.diagnose(series) if a.kind == "spike"]
    assert analysis.classify(series)[200, 3] == analysis.OK
    # The same jump carrying a real share of the global norm is one.
    assert [a.variable for a in analysis.diagnose(series, spike_min_share=1e-9)
            if a.kind == "spike"] == [variables[3]]


def test_dead_needs_sustained_zero_fraction():
    norms, variables = deep_net()
    zeros = np.zeros_like(norms)
    zeros[30:60, 3] = 1.0
    zeros[90:93, 4] = 1.0
    alerts = analysis.diagnose(make_series(norms, variables, zero_fraction=zeros))
    assert [(a.kind, a.variable, a.first_step, a.last_step) for a in alerts] == [
        ("dead", variables[3], 300, 590)
    ]


def test_update_ratio_outside_the_band_around_1e3():
    norms, variables = deep_net(depth=3)
    weights = np.ones_like(norms)
    updates = np.full_like(norms, 1e-3)
    updates[:, 0] = 0.5  # rewritten every step
    updates[:, 5] = 1e-8  # barely learning
    alerts = analysis.diagnose(make_series(norms, variables, weights=weights, updates=updates))
    found = {(a.variable, a.rule): a for a in alerts}
    assert set(found) == {(variables[0], "update/weight"), (variables[5], "update/weight")}
    assert found[(variables[0], "update/weight")].value == pytest.approx(0.5)
    assert "above" in found[(variables[0], "update/weight")].message
    assert "below" in found[(variables[5], "update/weight")].message
    assert all(a.severity == "info" for a in alerts)


def test_update_ratio_judges_kernels_not_zero_initialised_biases():
    norms, variables = deep_net(depth=3)
    shapes = [(8, 8) if v.endswith("kernel") else (8,) for v in variables]
    weights = np.ones_like(norms)
    updates = np.full_like(norms, 0.5)  # every variable "rewritten every step"
    alerts = analysis.diagnose(make_series(norms, variables, weights=weights, updates=updates,
                                           shapes=shapes))
    assert sorted(a.variable for a in alerts) == sorted(v for v in variables if v.endswith("kernel"))


def test_the_gradient_weight_ratio_alone_is_not_judged():
    # A healthy AdamW run: gradient/weight ratios of 16 (PyTorch logs weights, not updates).
    # Adam's step does not scale with the gradient, so that ratio says nothing of the update.
    norms, variables = deep_net(depth=3)
    weights = norms / 16.2
    weights[:, 2] = 1e6  # and one 1e-7: without the update, no judgement either way
    assert analysis.diagnose(make_series(norms, variables, weights=weights)) == []


def test_a_variable_that_never_gets_a_gradient_is_a_finding_of_its_own():
    norms, variables = deep_net()
    missing = np.zeros(norms.shape, dtype=bool)
    missing[:, 5] = True  # a branch disconnected from the loss
    missing[::2, 7] = True  # logged every other step only: it does train
    missing[:3, 9] = True  # reached from the fourth step on
    series = make_series(norms, variables, missing=missing)
    classes = analysis.classify(series)
    assert (classes[:, 5] == analysis.MISSING).all()
    alerts = analysis.diagnose(series)
    assert [(a.kind, a.rule, a.variable, a.severity, a.first_step, a.last_step, a.steps)
            for a in alerts] == [("never_updated", "no_gradient", variables[5], "warning", 0,
                                  (STEPS - 1) * 10, STEPS)]
    assert "received no gradient" in alerts[0].message
    # Too few steps to say: the first steps of a run may not reach every branch.
    assert analysis.diagnose(make_series(norms[:4], variables, missing=missing[:4])) == []
    # A gradient at the last step withdraws it, also from a stream fed step by step.
    missing[-1, 5] = False
    stream = analysis.AnalysisStream(series)
    for row in range(STEPS):
        assert [a.kind for a in stream.alerts()] == (
            ["never_updated"] if row >= analysis.Thresholds().sustain_steps else [])
        series_row = make_series(norms, variables, missing=missing)
        stream.feed(series_row.steps[row:row + 1], series_row.wall_times[row:row + 1],
                    series_row.values[row:row + 1])
    assert stream.alerts() == []


def test_thresholds_are_overridable_and_validated():
    norms, variables = deep_net()
    series = make_series(norms, variables)
    assert kinds(analysis.diagnose(series, exploding_norm=0.01)) == [("exploding", "absolute")]
    lowered = analysis.Thresholds(exploding_norm=0.01)
    assert analysis.diagnose(series, lowered) == analysis.diagnose(series, exploding_norm=0.01)
    assert (analysis.classify(series, lowered) == analysis.EXPLODING).all()
    with pytest.raises(ValueError, match="known thresholds"):
        analysis.diagnose(series, explode=3)
    for bad in ({"exploding_norm": -1}, {"exploding_norm": float("nan")},
                {"sustain_steps": 0}, {"sustain_steps": 2.5}, {"dead_fraction": 2},
                {"update_ratio_low": 1.0, "update_ratio_high": 0.1}):
        with pytest.raises(ValueError):
            analysis.Thresholds(**bad)
    assert analysis.Thresholds.from_strings({"sustain_steps": "7"}).sustain_steps == 7
    with pytest.raises(ValueError, match="must be a number"):
        analysis.Thresholds.from_strings({"exploding_norm": "<b>"})
    with pytest.raises(ValueError, match="unknown threshold"):
        analysis.Thresholds.from_strings({"nope": "1"})


def test_every_default_is_documented_with_its_rationale():
    doc = analysis.Thresholds.__doc__
    for field in dataclasses.fields(analysis.Thresholds):
        assert f"{field.name} = " in doc or f"{field.name}," in doc, field.name
    for source in ("Pascanu", "Glorot", "CS231n", "llm.c", "epsilon"):
        assert source in doc


def test_alerts_sorted_by_severity_then_first_step():
    norms, variables = deep_net()
    norms[250, 4] = 5e3  # critical at 2500
    norms[100:140, :2] *= 1e-6  # warning from 1000
    counts = np.zeros_like(norms)
    counts[280, 1] = 1  # critical at 2800
    alerts = analysis.diagnose(make_series(norms, variables, nonfinite=counts))
    ranks = [(analysis.SEVERITIES.index(a.severity), a.first_step) for a in alerts]
    assert ranks == sorted(ranks)
    assert alerts[0].first_step == 2500 and alerts[-1].severity == "warning"
    assert all(set(a.to_json()) >= {"kind", "variable", "layer", "first_step", "last_step",
                                    "value", "severity", "message"} for a in alerts)


def test_rule_registry_and_thresholds_agree():
    fields = {f.name: f for f in dataclasses.fields(analysis.Thresholds)}
    parameters = [p for rule in analysis.RULES for p in rule.parameters]
    assert tuple(parameters) == analysis.PARAMETERS
    assert [p.name for p in parameters] == list(fields)  # every field owned by exactly one rule
    for parameter in parameters:
        assert fields[parameter.name].default == parameter.default
        assert fields[parameter.name].type is parameter.type in (int, float)
        assert parameter.label and parameter.doc.strip()
        assert f"{parameter.name} = " in analysis.Thresholds.__doc__
    assert analysis.KINDS == tuple(dict.fromkeys(rule.kind for rule in analysis.RULES))
    assert len({rule.name for rule in analysis.RULES}) == len(analysis.RULES)
    assert {rule.cell_class for rule in analysis.RULES} - {None} == {
        analysis.VANISHING, analysis.SPIKE, analysis.EXPLODING, analysis.NONFINITE
    }


def test_the_tabs_form_parameters_and_class_descriptions():
    form = {p.name: p.label for p in analysis.PARAMETERS if p.in_form}
    assert form == {
        "vanishing_norm": "vanishing below (norm)",
        "exploding_norm": "exploding above (norm)",
        "depth_ratio": "vanishing by depth below (x output layers)",
        "spike_zscore": "spike at robust z-score",
        "loss_spike_ratio": "loss spike at (x its median)",
        "precursor_loss_ratio": "warn at loss (x its median)",
        "sustain_steps": "sustained for (logged steps)",
    }
    assert set(analysis.CLASS_DESCRIPTIONS) == set(analysis.CLASSES)
    assert analysis.CLASS_DESCRIPTIONS["missing"] == "no gradient at this step"
    assert analysis.CLASS_DESCRIPTIONS["nonfinite"] == "NaN/Inf in the gradient"


def test_a_rule_is_found_by_kind_and_raises_only_that_kind():
    assert [rule.name for rule in analysis.rules.of_kind("exploding")] == ["exploding"]
    assert [rule.name for rule in analysis.rules.of_kind("spike")] == ["spike"]
    assert analysis.rules.of_kind("no such kind") == ()
    for kind in analysis.KINDS:
        assert analysis.rules.of_kind(kind), kind
    norms, variables = deep_net()
    norms[100:140, :4] *= 1e-5
    series = make_series(norms, variables)
    (vanishing,) = analysis.rules.of_kind("vanishing")
    builder = analysis.alerts.AlertBuilder(series)
    vanishing.alerts(analysis.evidence.Evidence(series, analysis.Thresholds(), analysis.RULES),
                     builder)
    assert builder.by_urgency() == analysis.diagnose(series)
    assert {a.kind for a in builder.alerts} == {"vanishing"}


def test_alerts_group_into_findings_by_rule_and_overlapping_steps():
    norms, variables = deep_net(noise=0.05)
    norms[31:33, :-1] = 5e3  # 23 of 24 tensors explode at steps 310-320
    counts = np.zeros_like(norms)
    counts[33:, :] = 64  # then everything is NaN
    norms[33:, :] = 0.0
    series = make_series(norms, variables, nonfinite=counts)
    alerts = analysis.diagnose(series)
    found = groups.group(alerts, series.variables, series.layers)
    # The jump past the ceiling is an explosion only, not also a spike.
    assert [(g.kind, g.rule, g.severity, g.first_step, g.last_step, g.subjects, g.of, g.first)
            for g in found] == [
        ("exploding", "global", "critical", 310, 320, 1, 1, "whole model"),
        ("exploding", "absolute", "critical", 310, 320, 23, 24, variables[0]),
        ("nonfinite", "count", "critical", 330, (STEPS - 1) * 10, 24, 24, variables[0]),
    ]
    assert found[1].message == (
        f"23 of 24 tensors exploded (norm above 1000) at steps 310-320, first "
        f"{variables[0]}.")
    assert found[0].message == next(a.message for a in alerts if a.rule == "global")
    # Every alert is in exactly one group, and a group's alerts are its rule's.
    members = sorted(i for g in found for i in g.alerts)
    assert members == list(range(len(alerts)))
    for g in found:
        assert {(alerts[i].kind, alerts[i].rule) for i in g.alerts} == {(g.kind, g.rule)}


def test_separate_stretches_of_one_rule_are_separate_groups_most_urgent_first():
    norms, variables = deep_net(noise=0.05)
    norms[100, 8] *= 30  # a spike at 1000
    norms[200, 10] *= 30  # and one at 2000
    norms[150:160, 0:2] = 1e-9  # layer dense_00 below the floor at 1500-1590
    series = make_series(norms, variables)
    found = groups.group(analysis.diagnose(series, depth_ratio=1e-12), series.variables,
                         series.layers)
    assert [(g.kind, g.first_step, g.subjects, g.unit) for g in found] == [
        ("spike", 1000, 1, "tensor"), ("vanishing", 1500, 1, "layer"),
        ("spike", 2000, 1, "tensor")]
    assert groups.group([], series.variables, series.layers) == []
