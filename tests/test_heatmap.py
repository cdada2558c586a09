"""Merging heatmap columns never hides the worst cell; the epoch axis."""

import numpy as np
import pytest

from tensorboard_gradients import analysis
from tensorboard_gradients.format.reader import GradientSeries
from tensorboard_gradients.analysis import heatmap

OK, VAN, EXP, NF, MISS = (analysis.OK, analysis.VANISHING, analysis.EXPLODING,
                          analysis.NONFINITE, analysis.MISSING)


def series_of(values, epoch_starts=None, epoch_indices=None, steps=None):
    values = np.asarray(values, dtype=np.float64)
    count = values.shape[0]
    return GradientSeries(
        run="r", tag="t", name="t", variables=tuple(f"v{i}" for i in range(values.shape[1])),
        layers=tuple(f"v{i}" for i in range(values.shape[1])), shapes=((1,),) * values.shape[1],
        stat_names=("l2_norm",), steps=np.arange(count) if steps is None else np.asarray(steps),
        wall_times=np.arange(count, dtype=float) + 100, values=values[..., None],
        epoch_starts=None if epoch_starts is None else np.asarray(epoch_starts),
        epoch_indices=None if epoch_indices is None else np.asarray(epoch_indices),
    )


def test_one_exploding_step_among_thousands_keeps_its_column_and_value():
    values = np.ones((10_000, 2))
    classes = np.full(values.shape, OK, dtype=np.int8)
    values[7_777, 0], classes[7_777, 0] = 1e6, EXP
    values[1_234, 1], classes[1_234:1_240, 1] = 1e-12, VAN
    matrix = heatmap.build(series_of(values), "l2_norm", classes, max_columns=100)
    assert matrix.values.shape == (2, 100) and matrix.downsampled
    column = np.searchsorted(matrix.steps, 7_777, side="right") - 1
    assert matrix.classes[0, column] == EXP and matrix.values[0, column] == 1e6
    assert (np.delete(matrix.classes[0], column) == OK).all()
    column = np.searchsorted(matrix.steps, 1_234, side="right") - 1
    assert matrix.classes[1, column] == VAN and matrix.values[1, column] == 1e-12
    assert matrix.steps[column] <= 1_234 <= matrix.last_steps[column]


def test_merge_rules_per_class():
    values = np.array([[1.0, 2.0, 3.0, np.nan], [5.0, 7.0, 1.0, np.nan]]).T  # 4 steps, 2 vars
    classes = np.array([[OK, OK, OK, MISS], [EXP, NF, OK, MISS]], dtype=np.int8).T
    merged, worst = heatmap.merge(values, classes, np.array([0, 3]))
    assert worst.tolist() == [[OK, NF], [MISS, MISS]]
    assert merged[0, 0] == pytest.approx(2.0)  # mean of healthy steps, missing ignored
    assert merged[0, 1] == 7.0  # the non-finite step's value
    assert np.isnan(merged[1]).all()
    merged, worst = heatmap.merge(values, classes, np.array([0]))
    assert worst.tolist() == [[OK, NF]] and merged[0, 0] == pytest.approx(2.0)


def test_no_merging_when_steps_fit():
    values = np.arange(12.0).reshape(6, 2)
    classes = np.full(values.shape, OK, dtype=np.int8)
    matrix = heatmap.build(series_of(values), "l2_norm", classes, max_columns=6)
    assert not matrix.downsampled
    assert matrix.values.tolist() == values.T.tolist()
    assert matrix.steps.tolist() == matrix.last_steps.tolist() == list(range(6))
    assert heatmap.build(series_of(values), "l2_norm", classes).values.shape == (2, 6)


@pytest.mark.parametrize("count,limit", [(1, 1), (10, 3), (10_001, 1_000), (999, 1_000)])
def test_step_groups_cover_every_step_within_the_limit(count, limit):
    starts = heatmap.step_groups(count, limit)
    assert len(starts) <= limit and starts[0] == 0 and (np.diff(starts) > 0).all()
    assert starts[-1] < count


def test_epoch_axis_one_column_per_epoch_worst_kept():
    values = np.ones((30, 1))
    classes = np.full(values.shape, OK, dtype=np.int8)
    classes[17, 0], values[17, 0] = NF, 9.0
    # Logging began at step 2; epoch 1 had no logged step (marks at 10 and 10 collapse).
    series = series_of(values, epoch_starts=[0, 10, 10, 20], epoch_indices=[0, 1, 2, 3],
                       steps=np.arange(30) + 2)
    matrix = heatmap.build(series, "l2_norm", classes, by_epoch=True)
    assert matrix.epoch_index.tolist() == [0, 2, 3]
    assert matrix.steps.tolist() == [0, 10, 20]  # each epoch's first step
    assert matrix.last_steps.tolist() == [9, 19, 31]
    assert matrix.classes[0].tolist() == [OK, NF, OK] and matrix.values[0, 1] == 9.0
    merged = heatmap.build(series, "l2_norm", classes, max_columns=2, by_epoch=True)
    assert merged.downsampled and merged.epoch_index.tolist() == [0, 3]
    assert merged.classes[0].tolist() == [NF, OK]


def test_epoch_axis_without_marks_is_a_clear_error():
    values = np.ones((5, 1))
    with pytest.raises(heatmap.NoEpochsError, match="no epoch marks"):
        heatmap.build(series_of(values), "l2_norm", np.ones((5, 1), np.int8), by_epoch=True)


def test_steps_logged_before_every_epoch_mark_join_the_first_epoch():
    values = np.ones((5, 1))
    series = series_of(values, epoch_starts=[10, 20], epoch_indices=[3, 4])
    matrix = heatmap.build(series, "l2_norm", np.ones((5, 1), np.int8), by_epoch=True)
    assert matrix.epoch_index.tolist() == [3] and matrix.last_steps.tolist() == [4]


def test_zoom_keeps_a_step_range_at_full_resolution_with_whole_run_classes():
    values = np.arange(100.0)[:, None]
    classes = np.full(values.shape, OK, dtype=np.int8)
    classes[55, 0] = EXP
    series = series_of(values, steps=np.arange(100) * 10)
    matrix = heatmap.build(series, "l2_norm", classes, max_columns=20, step_range=(500, 590))
    assert matrix.steps.tolist() == list(range(500, 600, 10)) and not matrix.downsampled
    assert matrix.classes[0].tolist() == [OK] * 5 + [EXP] + [OK] * 4
    assert matrix.values[0, 5] == 55.0
    coarse = heatmap.build(series, "l2_norm", classes, max_columns=2, step_range=(0, 999))
    assert coarse.downsampled and coarse.classes[0].tolist() == [OK, EXP]
    empty = heatmap.build(series, "l2_norm", classes, step_range=(5000, 6000))
    assert empty.values.shape == (1, 0) and empty.steps.tolist() == []


def test_zoom_on_the_epoch_axis_starts_with_the_epoch_containing_the_range():
    values = np.ones((40, 1))
    classes = np.full(values.shape, OK, dtype=np.int8)
    series = series_of(values, epoch_starts=[0, 10, 20, 30], epoch_indices=[0, 1, 2, 3])
    matrix = heatmap.build(series, "l2_norm", classes, by_epoch=True, step_range=(15, 25))
    assert matrix.epoch_index.tolist() == [1, 2]
    assert matrix.steps.tolist() == [10, 20]  # epoch 1 starts at 10, before the range
    assert matrix.last_steps.tolist() == [19, 25]


def _merged_by_hand(values, classes, starts):
    """The never-hide-the-worst rule cell by cell: (values shown, worst class) per column."""
    ends = list(starts[1:]) + [len(values)]
    shown = np.full((len(starts),) + values.shape[1:], np.nan)
    worst = np.zeros((len(starts), values.shape[1]), dtype=np.int8)
    for column, (start, end) in enumerate(zip(starts, ends)):
        for variable in range(values.shape[1]):
            cells = classes[start:end, variable]
            worst[column, variable] = top = cells.max()
            for stat in np.ndindex(values.shape[2:]):
                picked = values[start:end, variable][(slice(None),) + stat][cells == top]
                picked = picked[~np.isnan(picked)]
                if top == MISS or not picked.size:
                    continue
                shown[(column, variable) + stat] = (
                    picked.min() if top == VAN else picked.max() if top > VAN else picked.mean())
    return shown, worst


@pytest.mark.parametrize("seed", range(60))
def test_groups_merged_in_stages_equal_the_rule_applied_to_the_steps(seed):
    """A long run's blocks (`analysis.digest`) merge groups of groups, in one or more stages,
    equal-length or not: every stage must give what the rule gives on the steps themselves."""
    random = np.random.default_rng(seed)
    steps, variables = int(random.integers(1, 60)), int(random.integers(1, 5))
    shape = (steps, variables) + ((int(random.integers(1, 4)),) if seed % 2 else ())
    values = 10.0 ** random.uniform(-9, 3, size=shape)
    values[random.random(shape) < 0.1] = np.nan
    # Mostly one class per variable (as runs are), with runs of others mixed in.
    classes = np.repeat(random.choice([OK, OK, VAN, EXP], size=(1, variables)), steps, axis=0)
    odd = random.random(classes.shape) < random.choice([0.0, 0.05, 0.3])
    classes[odd] = random.choice([OK, VAN, EXP, NF, MISS], size=int(odd.sum()))
    classes = classes.astype(np.int8)

    def random_starts(count):
        if random.random() < 0.5:  # equal groups, as step_groups and the digest's blocks
            return heatmap.step_groups(count, int(random.integers(1, count + 1)))
        cuts = random.choice(np.arange(1, count), size=min(count - 1, int(random.integers(0, 8))),
                             replace=False) if count > 1 else []
        return np.sort(np.append(0, cuts)).astype(np.int64)

    groups, rows = heatmap.Groups.of_steps(values, classes), np.arange(steps)
    for _ in range(int(random.integers(1, 4))):
        starts = random_starts(len(rows))
        groups, rows = groups.merged(starts), rows[starts]
        shown, worst = _merged_by_hand(values.reshape(steps, variables, -1), classes, rows)
        assert groups.worst.tolist() == worst.tolist()
        # Sums of up to 60 values of 12 decades in another order: relative 1e-12 is ~1e4 ulps.
        np.testing.assert_allclose(groups.values().reshape(shown.shape), shown, rtol=1e-12)
