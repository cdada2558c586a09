"""The early-warning benchmark's ground truth and scoring (benchmarks/instability): what a loss
spike is, when an alarm counts as early, and the two published references it compares with."""

import math
import sys

import numpy as np
import pytest

from support import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from instability import labels, references, scoring  # noqa: E402


def _flat_loss(steps=300, level=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return level * (1 + 0.1 * rng.standard_normal(steps))


def test_a_loss_three_times_its_trailing_median_or_nan_is_a_spike_and_close_ones_are_one_episode():
    losses = _flat_loss()
    losses[100] = 3.5  # 3.5x a median near 1
    losses[110] = 4.0  # 10 steps later: the same episode
    losses[200] = 2.5  # under 3x: no spike
    losses[250] = math.nan
    steps = np.arange(1, len(losses) + 1)
    assert labels.spiking_steps(steps, losses) == [101, 111, 251]
    assert labels.episodes(steps, losses) == [(101, 111), (251, 251)]


def test_the_first_window_of_steps_is_never_a_spike_but_a_nan_there_is():
    losses = _flat_loss(60)
    losses[10] = 100.0  # no 50-step history yet
    losses[20] = math.inf
    assert labels.spiking_steps(np.arange(len(losses)), losses) == [20]


def test_an_alarm_1_to_20_steps_before_an_onset_warns_it_and_the_others_are_at_spike_or_false():
    episodes = [(100, 105), (300, 300)]
    # 85: 15 before the first onset (early); 88 is within 10 steps of 85 (the same alarm);
    # 102: inside the first episode; 200: nothing follows within 20 steps (false);
    # 299 -> 300 is a lead of 1.
    score = scoring.score(episodes, [85, 88, 102, 200, 299])
    assert (score.onsets, score.warned, score.leads) == (2, 2, [15, 1])
    assert (score.followed, score.at_spike, score.false) == (2, 1, 1)
    assert score.recall == 1.0 and score.precision == pytest.approx(2 / 3)


def test_an_alarm_at_the_onset_or_earlier_than_the_horizon_does_not_warn_it():
    score = scoring.score([(100, 100)], [79, 100])
    assert score.warned == 0 and score.leads == []
    assert (score.followed, score.at_spike, score.false) == (0, 1, 1)


def test_healthy_totals_and_empty_fractions():
    empty = scoring.Score()
    assert math.isnan(empty.recall) and math.isnan(empty.precision)
    total = scoring.score([], [10, 50]).add(scoring.score([(5, 5)], [1]))
    assert (total.onsets, total.warned, total.false, total.followed) == (1, 1, 2, 1)


def _norms(steps=400, jump_at=None, factor=50.0, seed=1):
    rng = np.random.default_rng(seed)
    norms = np.exp(0.05 * rng.standard_normal(steps))
    if jump_at is not None:
        norms[jump_at:] *= factor
    return np.arange(1, steps + 1), norms


@pytest.mark.parametrize("detect", [references.zclip_alarms, references.olmo_alarms])
def test_each_reference_alarms_at_a_fifty_fold_jump_and_at_a_nan(detect):
    steps, norms = _norms(jump_at=300)
    norms[350] = math.nan
    alarms = detect(steps, norms)
    assert 301 in alarms and 351 in alarms


def test_on_steady_noise_olmo_is_silent_and_zclip_fires_on_its_z_tail_only():
    """ZClip's z > 2.5 is a one-sided Gaussian tail of 0.6% of steps: on 5% log-normal noise it
    alarms now and then (its false alarms on healthy runs), far from every step."""
    steps, norms = _norms(steps=4000)
    assert references.olmo_alarms(steps, norms) == []
    assert 0 < len(references.zclip_alarms(steps, norms)) < 0.03 * len(steps)


def test_zclip_needs_its_warm_up_and_olmo_its_128_steps():
    steps, norms = _norms(steps=200)
    norms[20] *= 100  # inside ZClip's 25 warm-up steps and OLMo's first 128
    norms[100] *= 100  # past ZClip's warm-up, inside OLMo's first window
    assert 21 not in references.zclip_alarms(steps, norms)
    assert 101 in references.zclip_alarms(steps, norms)
    assert references.olmo_alarms(steps, norms) == []
