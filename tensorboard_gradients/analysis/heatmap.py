"""The layer x step matrix the Gradients tab draws, with columns merged without hiding the worst.

Pure numpy. A column is a group of consecutive logged steps (or an epoch). Merging keeps, per
variable, the worst `analysis.CLASSES` code of the group and a value that shows it: the largest
value among the exploding / non-finite steps, the smallest among the vanishing ones, the mean of
the healthy ones, NaN when every step of the group is missing. So one exploding step among 10,000
still colours its column at any zoom level.
"""

import dataclasses
import math
from typing import Optional, Tuple

import numpy as np

from tensorboard_gradients import analysis


class NoEpochsError(ValueError):
    """The series has no epoch marks, so there is no layer-by-epoch view."""


NO_EPOCHS = ("this run has no epoch marks (the Keras GradientMonitor records them; "
             "GradientWriter.write_epoch adds them to other loops), so it has no epoch axis")


@dataclasses.dataclass(frozen=True)
class Heatmap:
    """Columns of one stat: ``values``/``classes`` are ``[variables, columns]``."""

    steps: np.ndarray  # first logged step of each column (an epoch's first step on the epoch axis)
    last_steps: np.ndarray  # last logged step of each column
    wall_times: np.ndarray  # wall time of each column's first step
    values: np.ndarray
    classes: np.ndarray  # `analysis.CLASSES` codes
    epoch_index: Optional[np.ndarray]  # per column, on the epoch axis only
    downsampled: bool  # True when a column merges several steps (several epochs by epoch)


def step_groups(count: int, max_columns: Optional[int]) -> np.ndarray:
    """Start index of each column: every step, or equal groups when there are > max_columns."""
    if max_columns is None or count <= max_columns:
        return np.arange(count)
    size = -(-count // max_columns)
    return np.arange(0, count, size)


def epoch_groups(steps: np.ndarray, epoch_starts, epoch_indices):
    """(start index of each epoch's column, epoch index of each column).

    An epoch owns the logged steps from its first step up to the next epoch's first step; steps
    logged before the first mark join the first epoch; an epoch with no logged step (say
    ``every_n_steps`` larger than an epoch) has no column.
    """
    if epoch_starts is None or len(epoch_starts) == 0:
        raise NoEpochsError(NO_EPOCHS)
    positions = np.searchsorted(steps, np.asarray(epoch_starts), side="left")
    indices = np.asarray(epoch_indices)
    inside = positions < len(steps)
    positions, indices = positions[inside], indices[inside]
    if positions.size == 0:  # every mark comes after the last logged step
        return np.zeros(1, dtype=np.int64), np.asarray(epoch_indices)[:1]
    positions[0] = 0
    # Epochs sharing a start position had no logged steps except the last of them.
    last_of_position = np.append(positions[1:] != positions[:-1], True)
    return positions[last_of_position], indices[last_of_position]


@dataclasses.dataclass(frozen=True)
class Groups:
    """Groups of consecutive steps, ready to merge further: ``worst`` is ``[groups, variables]``,
    ``total``/``count`` the same or ``[groups, variables, stats]`` (several stats at once).

    ``worst``: the worst class of the group; ``total``/``count``: over the group's cells of that
    class with a value, their sum (ok), smallest value (vanishing) or largest (exploding,
    non-finite), and how many there are (``total`` is 0 where ``count`` is). Merging groups
    of groups gives what merging their steps gives, so a long run keeps groups of a hundred
    steps (`analysis.digest`) instead of every step.
    """

    worst: np.ndarray
    total: np.ndarray
    count: np.ndarray

    def _per_value(self, array):
        """``array`` (shaped like ``worst``) broadcast to ``total``'s shape."""
        return array if self.total.ndim == 2 else array[..., None]

    def values(self) -> np.ndarray:
        """The value each group shows (the mean, or the extreme of its worst class)."""
        worst = self._per_value(self.worst)
        with np.errstate(invalid="ignore", divide="ignore"):
            merged = np.where(worst >= analysis.VANISHING, self.total, self.total / self.count)
        merged[(worst == analysis.MISSING) | (self.count == 0)] = np.nan
        return merged

    def stat(self, position: int) -> "Groups":
        """The groups of one of several stats."""
        return Groups(self.worst, self.total[..., position], self.count[..., position])

    def merged(self, starts: np.ndarray, dtype=np.float64) -> "Groups":
        """Consecutive groups from each of ``starts`` to the next merged into one, their
        totals summed in ``dtype`` (itself when every group stays alone)."""
        starts = np.asarray(starts, dtype=np.int64)
        if len(starts) == len(self.worst):
            return self
        worst = np.maximum.reduceat(self.worst, starts, axis=0)
        lengths = np.diff(np.append(starts, len(self.worst)))
        # Every merged cell summed as if its parts were all of its class; then the few cells
        # whose parts differ in class, or that show an extreme (a flagged class), are merged
        # again from their own parts only: a spike costs its cells, not its whole column.
        counts = _sums(self.count, starts, np.int32)
        with np.errstate(over="ignore", invalid="ignore"):  # float32 near its limit: inf shows
            totals = _sums(self.total, starts, dtype)
        differs = np.logical_or.reduceat(self.worst != np.repeat(worst, lengths, axis=0),
                                         starts, axis=0)
        groups, columns = np.nonzero(differs | (worst >= analysis.VANISHING))
        if groups.size:
            counts[groups, columns], totals[groups, columns] = self._merged_cells(
                starts[groups], lengths[groups], columns, worst[groups, columns], dtype)
        return Groups(worst, totals, counts)

    def _merged_cells(self, firsts, lengths, columns, worst, dtype):
        """(count, total) of the merged cells whose parts are rows ``firsts[i]`` on
        (``lengths[i]`` of them) of column ``columns[i]``, their worst class ``worst[i]``."""
        ends = np.cumsum(lengths)
        segments = ends - lengths  # where each cell's parts start among all the parts
        rows = np.repeat(firsts - segments, lengths) + np.arange(ends[-1])
        parts = np.repeat(columns, lengths)
        chosen = self._per_value(self.worst[rows, parts] == np.repeat(worst, lengths))
        count, total = self.count[rows, parts], self.total[rows, parts]
        counts = np.add.reduceat(np.where(chosen, count, 0), segments, axis=0, dtype=np.int32)
        with np.errstate(over="ignore", invalid="ignore"):
            sums = np.add.reduceat(np.where(chosen, total, 0), segments, axis=0, dtype=dtype)
        picked = np.where(chosen & (count > 0), total, np.nan).astype(dtype, copy=False)
        worst = self._per_value(worst)
        totals = np.where(worst == analysis.VANISHING, np.fmin.reduceat(picked, segments, axis=0),
                          np.fmax.reduceat(picked, segments, axis=0))
        return counts, np.where(worst >= analysis.VANISHING, totals, sums)

    @classmethod
    def of_steps(cls, values: np.ndarray, classes: np.ndarray) -> "Groups":
        """Each step a group of its own (``values``: ``[steps, variables]`` or ``[steps,
        variables, stats]``)."""
        absent = np.isnan(values)
        missing = classes == analysis.MISSING
        if not missing.any() and not absent.any():  # most steps of most runs: no mask to apply
            return cls(classes, values, np.ones(values.shape, dtype=np.int8))
        absent |= missing if values.ndim == 2 else missing[..., None]
        present = ~absent
        # An absent cell counts 0 and adds 0, so sums need no mask.
        return cls(classes, np.where(present, values, 0), present.view(np.int8))

    @classmethod
    def concatenated(cls, parts) -> "Groups":
        parts = list(parts)
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("worst", "total", "count")))


def _sums(array: np.ndarray, starts: np.ndarray, dtype) -> np.ndarray:
    """The sums of ``array``'s rows from each of ``starts`` to the next, in ``dtype``. Groups of
    equal length but maybe the last (`step_groups`' columns, a long run's blocks) sum as one
    reshape and the rest, several times faster than reduceat."""
    count = len(array)
    size = int(starts[1]) if len(starts) > 1 else count
    if len(starts) and np.array_equal(starts, np.arange(0, count, max(size, 1))):
        whole = count // size
        sums = np.empty((len(starts),) + array.shape[1:], dtype=dtype)
        # Flattened: numpy casts float32 to float64 sums by long inner loops then, not by the
        # last axis's few stats at a time (15x slower).
        inner = math.prod(array.shape[1:])
        array[:whole * size].reshape(whole, size, inner).sum(
            axis=1, dtype=dtype, out=sums[:whole].reshape(whole, inner))
        if whole < len(starts):
            sums[whole] = array[whole * size:].sum(axis=0, dtype=dtype)
        return sums
    return np.add.reduceat(array, starts, axis=0, dtype=dtype)


def merge(values: np.ndarray, classes: np.ndarray, starts: np.ndarray):
    """``[steps, variables]`` -> ``[columns, variables]`` by the never-hide-the-worst rule."""
    groups = Groups.of_steps(values, classes).merged(starts)
    return groups.values(), groups.worst


def _epochs_in_range(epoch_starts, epoch_indices, first_step, last_step):
    """The epoch marks that matter for steps [first_step, last_step]: the epoch containing
    ``first_step`` (its mark may lie before the range) and every epoch starting inside it."""
    starts, indices = np.asarray(epoch_starts), np.asarray(epoch_indices)
    before = np.flatnonzero(starts <= first_step)
    keep = (starts > first_step) & (starts <= last_step)
    if before.size:
        keep[before[-1]] = True
    return starts[keep], indices[keep]


def build(
    series,
    stat: str,
    classes: np.ndarray,
    max_columns: Optional[int] = None,
    by_epoch=False,
    step_range: Optional[Tuple[int, int]] = None,
) -> Heatmap:
    """The heatmap of ``series.stat(stat)`` coloured by ``classes`` (from `analysis.classify`).

    ``step_range = (first, last)`` keeps the logged steps in that inclusive range (a zoom); the
    classes were judged on the whole series, so a zoomed cell has the class it has unzoomed.

    Raises:
      KeyError: unknown stat.
      NoEpochsError: ``by_epoch`` on a series without epoch marks.
    """
    steps = np.asarray(series.steps)
    window = slice(None)
    epoch_starts, epoch_indices = series.epoch_starts, series.epoch_indices
    if step_range is not None:
        first, last = step_range
        window = slice(np.searchsorted(steps, first, "left"), np.searchsorted(steps, last, "right"))
        if epoch_starts is not None:
            epoch_starts, epoch_indices = _epochs_in_range(epoch_starts, epoch_indices, first, last)
    values, classes, steps = series.stat(stat)[window], classes[window], steps[window]
    wall_times = np.asarray(series.wall_times)[window]
    epoch_index = None
    if by_epoch:
        starts, epoch_index = epoch_groups(steps, epoch_starts, epoch_indices)
        if len(steps) == 0:
            starts = starts[:0]
            epoch_index = epoch_index[:0]
        columns = step_groups(len(starts), max_columns)
        downsampled = len(columns) < len(starts)
        starts, epoch_index = starts[columns], epoch_index[columns]
    else:
        starts = step_groups(len(steps), max_columns)
        downsampled = len(starts) < len(steps)
    merged_values, merged_classes = merge(values, classes, starts)
    ends = np.append(starts[1:], len(steps)) - 1 if len(starts) else starts
    column_steps = steps[starts]
    if by_epoch and len(starts):
        # The column is labelled by where its first epoch starts, even if logging began later.
        marks = dict(zip(np.asarray(series.epoch_indices).tolist(), series.epoch_starts))
        column_steps = np.array([marks[int(i)] for i in epoch_index], dtype=np.int64)
    return Heatmap(
        steps=column_steps,
        last_steps=steps[ends],
        wall_times=wall_times[starts],
        values=merged_values.T,
        classes=merged_classes.T,
        epoch_index=epoch_index,
        downsampled=bool(downsampled),
    )
