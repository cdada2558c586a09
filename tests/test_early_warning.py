"""The early warning on real training (`benchmarks/early_warning.py`'s CI subset): PyTorch runs
that blow up as the literature reports (Adam's preconditioner collapsing under a vanishing
gradient, a learning rate raised 30x, one ramped past stability) and healthy controls, trained here with the
`GradientMonitor` given the loss, scored as the benchmark scores them."""

import sys

import pytest

from support import ROOT

pytest.importorskip("torch")
pytest.importorskip("sklearn")
sys.path.insert(0, str(ROOT / "benchmarks"))
import early_warning  # noqa: E402  (benchmarks/early_warning.py)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    result = early_warning.collect(dict(early_warning.QUICK,
                                        keep=str(tmp_path_factory.mktemp("instability"))))
    assert not [row for row in result["rows"] if "error" in row], result["rows"]
    return result


def test_the_ci_subset_holds_a_spike_and_a_healthy_control_of_each_half(scored):
    cases = {(row["half"], row["sick"]) for row in scored["rows"]}
    assert cases == {("tune", True), ("held_out", True), ("held_out", False)}


def test_loss_spikes_are_warned_ahead_and_healthy_runs_get_no_warning(scored):
    sick, healthy_alarms = early_warning.totals(scored["rows"])["ours"]
    assert sick.onsets >= 9  # the set still spikes as calibrated (8 Adam spikes, the jump's,
    # the ramp's)
    assert sick.recall >= 0.8, sick
    assert sick.precision >= 0.8, sick
    assert min(sick.leads) >= 1
    assert healthy_alarms == 0


def test_more_precise_than_both_references_and_quieter_on_healthy_runs(scored):
    """The ZClip-like reference warns on about as many spikes (its z > 2.5 tail fires every few
    dozen steps on any run), the OLMo-like one on few: ours must be the one to trust."""
    ours, ours_on_healthy = early_warning.totals(scored["rows"])["ours"]
    for reference in ("zclip", "olmo"):
        theirs, theirs_on_healthy = early_warning.totals(scored["rows"])[reference]
        assert ours.precision > theirs.precision, reference
        assert ours_on_healthy <= theirs_on_healthy, reference


def test_a_raised_learning_rate_is_warned_at_the_step_that_takes_it(scored):
    """Nothing in the loss or the gradient precedes the first step after a raised rate; the
    optimizer's update of the step that took it does (the monitor is given the optimizer)."""
    row = next(row for row in scored["rows"]
               if (row["case"], row["detector"]) == ("mlp_lr_jump", "ours"))
    assert row["score"].warned == row["score"].onsets == 1
    assert row["score"].leads == [2]  # the update of step 400; the loss spikes from step 402
