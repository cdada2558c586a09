"""`GradientSeries`: the logged history of one tag as numpy arrays, and the one place that turns
logged points (from event files or TensorBoard's data provider) into it, each point checked
against its tag's metadata before it is decoded (`decode_tensor`).
"""

import dataclasses
import logging
import math
from typing import Iterable, Optional, Tuple

import numpy as np

from tensorboard_gradients.format import columns, metadata

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GradientHistograms:
    """The log10|g| histograms of one tag: ``counts[step, variable, bin]``."""

    steps: np.ndarray
    wall_times: np.ndarray
    counts: np.ndarray
    log10_edges: Tuple[float, ...]
    bin_labels: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class GradientSeries:
    """Every logged step of one run's tag: ``values[step, variable, stat]``.

    Rows are in model order (input side first). A missing gradient is NaN in every stat (see
    `missing`); a gradient with NaN/Inf entries has ``nan_count``/``inf_count`` > 0.
    """

    run: str
    tag: str
    name: str
    variables: Tuple[str, ...]
    layers: Tuple[str, ...]
    shapes: Tuple[Optional[Tuple[int, ...]], ...]
    stat_names: Tuple[str, ...]
    steps: np.ndarray
    wall_times: np.ndarray
    values: np.ndarray
    histograms: Optional[GradientHistograms] = None
    # Where epochs start, when a training monitor marked them: the first step of each epoch and
    # its 0-based epoch index (None when the writer recorded no epochs).
    epoch_starts: Optional[np.ndarray] = None
    epoch_indices: Optional[np.ndarray] = None
    # Logged points refused as damaged (see `decode_tensor`): shown to the user, never plotted.
    damaged_points: int = 0
    # The training loss at each of `steps` (float64; a loss that was NaN or Inf is kept as it
    # was) and where one was logged (``loss_logged``; elsewhere ``loss`` is NaN), from the
    # ``<name>_loss`` tag or the run's own loss scalar (`loss_source` names which); all three
    # None when the run logged no loss.
    loss: Optional[np.ndarray] = None
    loss_logged: Optional[np.ndarray] = None
    loss_source: Optional[str] = None
    # Every statistic is logged at least every this many rows, the rows between are norms-only
    # (`Layout.stats_every`, format 1.6; see `full_rows`).
    stats_every: int = 1
    # Of `stat_names`, those logged at the norms-only rows too (`Layout.every_step`); None: every
    # one of `columns.EVERY_STEP_STATS` among them (format 1.6).
    every_step: Optional[Tuple[str, ...]] = None

    def __post_init__(self):
        if self.every_step is None:
            object.__setattr__(self, "every_step", columns.every_step_stats_1_6(self.stat_names))
        if self.loss is not None and not (self.loss.shape == self.loss_logged.shape
                                          == self.steps.shape):
            raise ValueError(f"{len(self.loss)} losses for {len(self.steps)} steps")

    def at_rows(self, rows) -> "GradientSeries":
        """This series cut to ``rows`` (a slice, or an index or mask array, of its steps), with
        their losses."""
        cut = {} if self.loss is None else dict(loss=self.loss[rows],
                                                loss_logged=self.loss_logged[rows])
        return dataclasses.replace(self, steps=self.steps[rows], wall_times=self.wall_times[rows],
                                   values=self.values[rows], **cut)

    def stat(self, name: str) -> np.ndarray:
        """``[steps, variables]`` of one statistic, e.g. ``series.stat("l2_norm")``.

        Besides the logged stats (`stat_names`), the ratios of `columns.DERIVED_STATS` when their inputs
        were logged (NaN where the weight norm is 0 or missing); see `available_stats`.
        """
        if name in self.stat_names:
            return self.values[:, :, self.stat_names.index(name)]
        if name not in self.available_stats:
            raise KeyError(
                f"no stat {name!r} in {self.run}/{self.tag}; have {list(self.available_stats)}"
            )
        numerator, denominator = (self.stat(n) for n in columns.DERIVED_STATS[name])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(denominator > 0, numerator / denominator, np.nan)

    def inputs_of(self, name: str) -> Tuple[str, ...]:
        """The logged stats `stat` computes ``name`` from: a derived ratio's two, else itself."""
        return tuple(columns.DERIVED_STATS.get(name, (name,)))

    def layer_combination(self, name: str) -> Optional[str]:
        """How a layer combines its variables' ``name`` (`columns.Stat.layer_combination`, one
        of `analysis.layers.KINDS`); None for a stat this version does not know (a newer
        writer's), which then has no value by layer."""
        stat = columns.BY_NAME.get(name)
        return None if stat is None else stat.layer_combination

    @property
    def available_stats(self) -> Tuple[str, ...]:
        """The logged stats, then the derived ratios whose inputs were logged."""
        derived = tuple(
            name for name, inputs in columns.DERIVED_STATS.items()
            if all(i in self.stat_names for i in inputs)
        )
        return self.stat_names + derived

    @property
    def unlogged_stats(self) -> Tuple[str, ...]:
        """The gradient stats (`columns.GRADIENT_STATS`) this tag does not hold: from format 1.3
        a writer logs only those it was asked for (`columns.gradient_stats`, never fewer than
        `columns.REQUIRED_STATS`); () for a tag that holds them all, as every earlier one does."""
        return tuple(name for name in columns.GRADIENT_STATS if name not in self.stat_names)

    @property
    def missing(self) -> np.ndarray:
        """``[steps, variables]``: True where the variable had no gradient at that step."""
        return np.isnan(self.stat("size"))

    @property
    def full_rows(self) -> np.ndarray:
        """``bool[steps]``: the steps that hold every logged statistic, False at the norms-only
        steps (format 1.6), which hold only `every_step`, the rest NaN.

        A norms-only step is one where some variable has a gradient and none has a value in the
        marker column: ``zero_fraction`` when logged (a number for every gradient with entries),
        else the first logged stat outside the every-step ones. Read, not assumed from the
        cadence: a step logged by hand (`GradientMonitor.log`) holds every statistic. (Without
        ``zero_fraction``, a step at which every gradient was entirely NaN/Inf has no min or max
        either and reads as norms-only: the same NaN cells, named "not logged".)"""
        sparse = [n for n in self.stat_names if n not in self.every_step]
        if not sparse:
            return np.ones(len(self.steps), dtype=bool)
        marker = "zero_fraction" if "zero_fraction" in sparse else sparse[0]
        present = ~self.missing
        with_value = ~np.isnan(self.stat(marker)) & present
        return ~present.any(axis=1) | with_value.any(axis=1)

    def logged_rows(self, name: str) -> np.ndarray:
        """``bool[steps]``: the steps that logged stat ``name`` (one of `available_stats`):
        every step for `every_step` and the ratios of two of them, `full_rows` for the others.
        Rules that need another stat judge these steps only."""
        if columns.logged_every_step(name, self.every_step):
            return np.ones(len(self.steps), dtype=bool)
        return self.full_rows


def expected_shape(parsed: metadata.PluginData) -> Tuple[int, ...]:
    """The shape of one logged matrix of a tag (``()`` for epoch marks and losses)."""
    if parsed.kind in (metadata.KIND_EPOCHS, metadata.KIND_LOSS):
        return ()
    width = len(parsed.layout.stats) if parsed.kind == metadata.KIND_STATS else len(parsed.bins)
    return (len(parsed.layout.variables), width)


class DamagedPointError(ValueError):
    """A logged point whose tensor does not match its tag's metadata (crafted, damaged or written
    by a process with another layout under the same tag); it is refused, never decoded."""


# dtype enum of `TensorProto` (types.proto) -> (numpy dtype, the repeated field holding values).
_FLOAT_DTYPES = {
    1: (np.float32, "float_val"),  # DT_FLOAT
    2: (np.float64, "double_val"),  # DT_DOUBLE
    19: (np.float16, "half_val"),  # DT_HALF
}


def check_tensor(tensor, expected: Tuple[int, ...], content_length: Optional[int] = None) -> None:
    """`DamagedPointError` unless the `TensorProto` is a float matrix of exactly ``expected``
    shape (the checks of `decode_tensor`, without decoding). ``content_length``: the length of
    its ``tensor_content`` where the content itself was left out (`segment_index`)."""
    _checked(tensor, expected, content_length)


def _checked(tensor, expected, content_length=None):
    """(numpy dtype, the field holding the values, the packed content bytes) of a tensor that
    passes the checks of `decode_tensor` (the content is read once: each read copies it)."""
    shape = tuple([d.size for d in tensor.tensor_shape.dim])
    if shape != tuple(expected):
        raise DamagedPointError(f"a tensor of shape {list(shape)[:8]} where the metadata says "
                                f"{list(expected)}")
    if tensor.dtype not in _FLOAT_DTYPES:
        raise DamagedPointError(f"a tensor of dtype {tensor.dtype} where floats are expected")
    dtype, field = _FLOAT_DTYPES[tensor.dtype]
    count = math.prod(expected)
    content = tensor.tensor_content
    length = len(content) if content_length is None else content_length
    if length:
        if length != count * np.dtype(dtype).itemsize:
            raise DamagedPointError(f"{length} content bytes for {count} "
                                    f"{np.dtype(dtype).name} values")
    elif len(getattr(tensor, field)) not in (1, count):
        raise DamagedPointError(f"{len(getattr(tensor, field))} values for {count} entries")
    return dtype, field, content


def decode_tensor(tensor, expected: Tuple[int, ...]) -> np.ndarray:
    """The float array of a logged `TensorProto`, checked against its tag's metadata FIRST.

    TensorBoard's `make_ndarray` expands a tensor to its declared shape before anything checks
    it: a 537-byte record declaring 4.4 TB would exhaust memory. Here the declared shape, dtype
    and byte count are compared with what the metadata says (``expected``) before one element is
    decoded, so the memory spent is bounded by the metadata, which the reader holds anyway.

    Raises:
      DamagedPointError: the tensor is not a float matrix of exactly ``expected`` shape.
    """
    dtype, field, content = _checked(tensor, expected)
    if content:  # a fresh bytes object: the array can own it without a copy
        return np.frombuffer(content, dtype=dtype).reshape(expected)
    values = getattr(tensor, field)
    if dtype == np.float16:  # half_val holds the IEEE bits in ints
        array = np.asarray(values, dtype=np.uint16).view(np.float16)
    else:
        array = np.asarray(values, dtype=dtype)
    # One value stands for every entry (TensorFlow's splat encoding): bounded by `expected`.
    return np.full(expected, array[0], dtype=dtype) if len(values) == 1 else array.reshape(expected)


def _stacked(where: str, tag: str, expected: Tuple[int, ...], points: Iterable):
    """(steps, wall_times, stacked matrices, damaged count) of ``(step, wall_time, matrix)`` points.

    Sorted by step; a rewritten step keeps its last value. A point whose matrix is None (refused
    by `decode_tensor` before decoding) or is not a float array of the tag's metadata shape is
    skipped and counted as damaged, with a warning: it was crafted, corrupted, or written by a
    process with another layout under the same tag, and showing it would misname its rows.
    """
    by_step = {}
    damaged = 0
    for step, wall_time, matrix in points:
        if matrix is None or matrix.shape != expected or matrix.dtype.kind != "f":
            damaged += 1
            continue
        by_step[int(step)] = (wall_time, matrix)
    if damaged:
        logger.warning(
            "%s: skipped %d damaged step(s) of tag %r (not a float matrix of the shape its "
            "metadata gives)", where, damaged, tag,
        )
    steps = sorted(by_step)
    wall_times = np.array([by_step[s][0] for s in steps], dtype=np.float64)
    if steps:
        matrices = np.stack([by_step[s][1] for s in steps])
    else:
        matrices = np.zeros((0,) + expected, dtype=np.float32)
    return np.array(steps, dtype=np.int64), wall_times, matrices, damaged


def histograms_from_points(where, tag, parsed, points) -> Optional[GradientHistograms]:
    """The `GradientHistograms` of a histograms tag's points (None when there are none)."""
    steps, wall_times, counts, _ = _stacked(where, tag, expected_shape(parsed), points)
    if not len(steps):
        return None
    return GradientHistograms(
        steps=steps,
        wall_times=wall_times,
        counts=counts,
        log10_edges=parsed.log10_edges,
        bin_labels=parsed.bins,
    )


def loss_curve(where: str, tag: str, points: Iterable) -> Tuple[np.ndarray, np.ndarray]:
    """``(steps, float64 losses)`` of a loss tag's ``(step, wall_time, value)`` points, the last
    write of a step winning, in step order."""
    by_step = {}
    for step, _, value in points:
        value = np.asarray(value)
        if value.size != 1 or value.dtype.kind not in "iuf":
            logger.warning("%s: a point of %s at step %s is not one number: left out", where,
                           tag, step)
            continue
        by_step[int(step)] = float(value.reshape(()))
    steps = np.array(sorted(by_step), dtype=np.int64)
    return steps, np.array([by_step[s] for s in steps.tolist()], dtype=np.float64)


def aligned_loss(steps: np.ndarray, curve: Tuple[np.ndarray, np.ndarray]):
    """``(losses, logged)``: the loss of ``curve`` (`loss_curve`) at each of ``steps`` and
    whether it has one there (where not, the loss is NaN)."""
    curve_steps, losses = curve
    aligned = np.full(len(steps), np.nan)
    found = np.zeros(len(steps), dtype=bool)
    if len(curve_steps):
        where = np.minimum(np.searchsorted(curve_steps, steps), len(curve_steps) - 1)
        found = curve_steps[where] == steps
        aligned[found] = losses[where[found]]
    return aligned, found


def with_loss(series: GradientSeries, curve, source: Optional[str]) -> GradientSeries:
    """``series`` with the loss of ``curve`` at its steps (None, or no step: no loss)."""
    if curve is None or not len(curve[0]):
        return dataclasses.replace(series, loss=None, loss_logged=None, loss_source=None)
    loss, logged = aligned_loss(series.steps, curve)
    return dataclasses.replace(series, loss=loss, loss_logged=logged, loss_source=source)


def series_from_points(
    run: str,
    tag: str,
    parsed: metadata.PluginData,
    points: Iterable,
    epoch_points: Iterable = (),
    histograms: Optional[GradientHistograms] = None,
) -> GradientSeries:
    """A `GradientSeries` from a stats tag's ``(step, wall_time, matrix)`` points.

    The one place that turns logged points into a series: `read_logdir` feeds it event-file
    records, the plugin feeds it TensorBoard's data provider.
    """
    steps, wall_times, values, damaged = _stacked(run, tag, expected_shape(parsed), points)
    epoch_points = list(epoch_points)
    epoch_starts = epoch_indices = None
    if epoch_points:
        epoch_starts, _, epoch_values, _ = _stacked(
            run, metadata.epochs_tag(parsed.name), (), epoch_points
        )
        epoch_indices = epoch_values.astype(np.int64)
    layout = parsed.layout
    return GradientSeries(
        run=run,
        tag=tag,
        name=parsed.name,
        variables=layout.variables,
        layers=layout.layers,
        shapes=layout.shapes,
        stat_names=layout.stats,
        steps=steps,
        wall_times=wall_times,
        values=values,
        histograms=histograms,
        epoch_starts=epoch_starts,
        epoch_indices=epoch_indices,
        damaged_points=damaged,
        stats_every=layout.stats_every,
        every_step=layout.every_step,
    )
