"""`read_logdir`: the logged gradient history back as numpy arrays (TF-free).

Reads the event files directly (not through TensorBoard's loaders, which sample a few points per
tag), so every logged step comes back.

One bad file never hides the rest of a logdir: a run, file or tag that cannot be read is skipped
and reported as a `Problem` (`read_logdir_report` returns them, `read_logdir` logs them), and
every logged tensor is checked against its tag's metadata before it is decoded (`decode_tensor`).
Unlike TensorBoard's loaders, a record failing its checksum is skipped and the rest of its file
read (the Python loader stops reading the file there; the Rust loader serves the damaged values),
and points a later file logged under other metadata for the same tag are refused (both loaders
would show them under the first metadata's variable names).
"""

import dataclasses
import logging
import os
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

from tensorboard_gradients import event_files, metadata

logger = logging.getLogger(__name__)


# Ratios computed on read (never stored): name -> (numerator stat, denominator stat).
# grad/weight is what an SGD step scales by the learning rate; update/weight is the step's real
# relative size (healthy around 1e-3, see `analysis.Thresholds`).
DERIVED_STATS = {
    "grad_weight_ratio": ("l2_norm", "weight_l2_norm"),
    "update_weight_ratio": ("update_l2_norm", "weight_l2_norm"),
}


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

    def stat(self, name: str) -> np.ndarray:
        """``[steps, variables]`` of one statistic, e.g. ``series.stat("l2_norm")``.

        Besides the logged stats (`stat_names`), the ratios of `DERIVED_STATS` when their inputs
        were logged (NaN where the weight norm is 0 or missing); see `available_stats`.
        """
        if name in self.stat_names:
            return self.values[:, :, self.stat_names.index(name)]
        if name not in self.available_stats:
            raise KeyError(
                f"no stat {name!r} in {self.run}/{self.tag}; have {list(self.available_stats)}"
            )
        numerator, denominator = (self.stat(n) for n in DERIVED_STATS[name])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(denominator > 0, numerator / denominator, np.nan)

    @property
    def available_stats(self) -> Tuple[str, ...]:
        """The logged stats, then the derived ratios whose inputs were logged."""
        derived = tuple(
            name for name, inputs in DERIVED_STATS.items()
            if all(i in self.stat_names for i in inputs)
        )
        return self.stat_names + derived

    @property
    def missing(self) -> np.ndarray:
        """``[steps, variables]``: True where the variable had no gradient at that step."""
        return np.isnan(self.stat("size"))


def expected_shape(parsed: metadata.PluginData) -> Tuple[int, ...]:
    """The shape of one logged matrix of a tag (``()`` for epoch marks)."""
    if parsed.kind == metadata.KIND_EPOCHS:
        return ()
    columns = len(parsed.layout.stats) if parsed.kind == metadata.KIND_STATS else len(parsed.bins)
    return (len(parsed.layout.variables), columns)


class DamagedPointError(ValueError):
    """A logged point whose tensor does not match its tag's metadata (crafted, damaged or written
    by a process with another layout under the same tag); it is refused, never decoded."""


# dtype enum of `TensorProto` (types.proto) -> (numpy dtype, the repeated field holding values).
_FLOAT_DTYPES = {
    1: (np.float32, "float_val"),  # DT_FLOAT
    2: (np.float64, "double_val"),  # DT_DOUBLE
    19: (np.float16, "half_val"),  # DT_HALF
}


def decode_tensor(tensor, expected: Tuple[int, ...]) -> np.ndarray:
    """The float array of a logged `TensorProto`, checked against its tag's metadata FIRST.

    TensorBoard's `make_ndarray` expands a tensor to its declared shape before anything checks
    it: a 537-byte record declaring 4.4 TB would exhaust memory. Here the declared shape, dtype
    and byte count are compared with what the metadata says (``expected``) before one element is
    decoded, so the memory spent is bounded by the metadata, which the reader holds anyway.

    Raises:
      DamagedPointError: the tensor is not a float matrix of exactly ``expected`` shape.
    """
    shape = tuple(d.size for d in tensor.tensor_shape.dim)
    if shape != tuple(expected):
        raise DamagedPointError(f"a tensor of shape {list(shape)[:8]} where the metadata says "
                                f"{list(expected)}")
    if tensor.dtype not in _FLOAT_DTYPES:
        raise DamagedPointError(f"a tensor of dtype {tensor.dtype} where floats are expected")
    dtype, field = _FLOAT_DTYPES[tensor.dtype]
    count = int(np.prod(expected, dtype=np.int64))
    if tensor.tensor_content:
        if len(tensor.tensor_content) != count * np.dtype(dtype).itemsize:
            raise DamagedPointError(f"{len(tensor.tensor_content)} content bytes for {count} "
                                    f"{np.dtype(dtype).name} values")
        return np.frombuffer(tensor.tensor_content, dtype=dtype).reshape(expected).copy()
    values = getattr(tensor, field)
    if len(values) not in (1, count):
        raise DamagedPointError(f"{len(values)} values for {count} entries")
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
    )


# The kinds of `Problem`, by what was lost.
UNREADABLE = "unreadable"  # nothing of a file, or of a tag that may hold statistics, was read
DAMAGED = "damaged"  # records, points or a tag's histograms were left out; the rest is read


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something under a logdir that `read_logdir_report` could not read, in whole or in part."""

    kind: str  # UNREADABLE or DAMAGED
    run: str
    tag: Optional[str]  # None: it concerns a whole file or directory
    path: str  # the event file (or directory) at fault
    message: str  # what is wrong and what was left out

    def __str__(self):
        tag = "" if self.tag is None else f", tag {self.tag!r}"
        return f"run {self.run!r}{tag}, file {self.path!r}: {self.message}"

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LogdirReport:
    """What `read_logdir_report` read: the series that could be read, and what could not."""

    runs: Dict[str, Dict[str, GradientSeries]]
    problems: Tuple[Problem, ...]


# Distinct reasons named per tag and file when points are refused (the count says the rest).
_REASONS_SHOWN = 3


@dataclasses.dataclass
class _Tag:
    """One tag of a run: its first metadata (which defines it, as in TensorBoard) and points."""

    parsed: metadata.PluginData
    content: bytes
    path: str  # the file that declared it first
    points: List[tuple] = dataclasses.field(default_factory=list)  # (step, wall_time, matrix)
    refused_points: int = 0

    def refusal(self, plugin_data) -> Optional[str]:
        """Why points under this later metadata must not be read as the tag's, or None.

        TensorBoard keeps a tag's first metadata only; a later file (another writer, an older
        version) may declare other variables under the same tag, and its rows would then be
        shown under the first file's names.
        """
        if plugin_data.content == self.content:
            return None
        if plugin_data.plugin_name != metadata.PLUGIN_NAME:
            return f"a later metadata there belongs to plugin {plugin_data.plugin_name!r}"
        try:
            parsed = metadata.parse_plugin_data(plugin_data.content)
        except metadata.UnsupportedFormatError as error:
            return f"a later metadata there cannot be read ({error})"
        if _rows_and_columns(parsed) == _rows_and_columns(self.parsed):
            return None
        return (f"a later metadata there declares {_layout_summary(parsed)}, the tag's first "
                f"(in {self.path!r}) {_layout_summary(self.parsed)}: its rows would be misnamed")


def _rows_and_columns(parsed: metadata.PluginData) -> tuple:
    """What a logged matrix's rows and columns mean (`Layout.rows_and_columns`, plus the kind
    and histogram bins)."""
    layout = parsed.layout
    return (parsed.kind, parsed.bins) + (layout.rows_and_columns if layout else ())


def histograms_mismatch(stats_tag: str, stats: metadata.PluginData, histograms_tag: str,
                        histograms: metadata.PluginData) -> Optional[str]:
    """Why the histograms tag ``histograms_tag`` is left out next to its stats tag, or None.

    The one rule of `read_logdir` and of the plugin (`data_access`), so they cannot disagree.
    Our writers log a tag's histograms with the layout of its statistics (the tag is chosen by
    the variable names), so histograms of other variables were written under this name by
    another process or layout: matching their rows by name would show one model's histograms
    next to another model's statistics. They are left out whole; the statistics are kept.
    """
    if histograms.layout.variables == stats.layout.variables:
        return None
    return (f"histograms left out: {histograms_tag!r} is {_layout_summary(histograms)} where "
            f"{stats_tag!r} is {_layout_summary(stats)}, so their rows would be misnamed")


def _layout_summary(parsed: metadata.PluginData) -> str:
    if parsed.layout is None:
        return f"an {parsed.kind} tag"
    variables = parsed.layout.variables
    shown = ", ".join(repr(v) for v in variables[:3]) + (", ..." if len(variables) > 3 else "")
    stats = f" x {len(parsed.layout.stats)} stats" if parsed.kind == metadata.KIND_STATS else ""
    return f"a {parsed.kind} tag of {len(variables)} variable(s) ({shown}){stats}"


class _RunReader:
    """Reads one run's event files in order, keeping what can be trusted, reporting the rest."""

    def __init__(self, run: str, problems: List[Problem]):
        self.run = run
        self.problems = problems
        self.tags: Dict[str, _Tag] = {}
        self.unreadable_tags = set()

    def report(self, kind: str, tag: Optional[str], path: str, message: str):
        self.problems.append(Problem(kind, self.run, tag, path, message))

    def read_file(self, path: str):
        damage = event_files.ReadDamage()
        # This file's refusal reason per tag (None: its points are the tag's), set by the
        # metadata the file declares, and per tag [points refused, their first few reasons].
        refusals: Dict[str, Optional[str]] = {}
        refused: Dict[str, list] = {}
        events = 0
        try:
            for event in event_files.read_events(path, damage):
                events += 1
                for value in event.summary.value:
                    self._take(path, event, value, refusals, refused)
        except OSError as error:
            read = "read only in part" if events else "not read"
            self.report(UNREADABLE, None, path, f"{read}: {error}")
        if damage:
            kind = DAMAGED if events else UNREADABLE
            self.report(kind, None, path, str(damage) if events else f"no record read: {damage}")
        for tag, (count, reasons) in refused.items():
            self.tags[tag].refused_points += count
            self.report(DAMAGED, tag, path, f"{count} point(s) refused: {'; '.join(reasons)}")

    def _take(self, path, event, value, refusals, refused):
        if value.tag in self.unreadable_tags:
            return
        plugin_data = value.metadata.plugin_data
        tag = self.tags.get(value.tag)
        if tag is None:
            if plugin_data.plugin_name != metadata.PLUGIN_NAME:
                return  # another plugin's tag (or a value before any metadata: as TensorBoard)
            try:
                parsed = metadata.parse_plugin_data(plugin_data.content)
            except metadata.UnsupportedFormatError as error:
                self.unreadable_tags.add(value.tag)
                self.report(UNREADABLE, value.tag, path, f"tag skipped: {error}")
                return
            tag = self.tags[value.tag] = _Tag(parsed, plugin_data.content, path)
        if plugin_data.plugin_name:
            refusals[value.tag] = tag.refusal(plugin_data)
        reason = refusals.get(value.tag)
        if reason is None:
            try:
                matrix = decode_tensor(value.tensor, expected_shape(tag.parsed))
            except DamagedPointError as error:
                reason = str(error)
            else:
                tag.points.append((event.step, event.wall_time, matrix))
                return
        counted = refused.setdefault(value.tag, [0, []])
        counted[0] += 1
        if reason not in counted[1] and len(counted[1]) < _REASONS_SHOWN:
            counted[1].append(reason)

    def collect_series(self) -> Dict[str, GradientSeries]:
        """``{tag: GradientSeries}`` of the stats tags with readable points (once all files are
        read); a stats tag none of whose points could be read is reported `UNREADABLE`."""
        result = {}
        for name, tag in self.tags.items():
            if tag.parsed.kind != metadata.KIND_STATS:
                continue
            if not tag.points:
                if tag.refused_points:
                    self.report(UNREADABLE, name, tag.path, f"tag skipped: none of its "
                                f"{tag.refused_points} logged point(s) could be read")
                continue
            epochs = self._tag_of_kind(metadata.epochs_tag(tag.parsed.name), metadata.KIND_EPOCHS)
            series = series_from_points(
                self.run, name, tag.parsed, tag.points, epochs.points if epochs else (),
                self._histograms(name, tag),
            )
            result[name] = dataclasses.replace(
                series, damaged_points=series.damaged_points + tag.refused_points
            )
        return result

    def _tag_of_kind(self, name: str, kind: str) -> Optional[_Tag]:
        tag = self.tags.get(name)
        return tag if tag is not None and tag.parsed.kind == kind else None

    def _histograms(self, stats_name: str, stats: _Tag) -> Optional[GradientHistograms]:
        name = metadata.histogram_tag(stats_name)
        tag = self._tag_of_kind(name, metadata.KIND_HISTOGRAMS)
        if tag is None:
            return None
        mismatch = histograms_mismatch(stats_name, stats.parsed, name, tag.parsed)
        if mismatch:
            self.report(DAMAGED, name, tag.path, mismatch)
            return None
        return histograms_from_points(self.run, name, tag.parsed, tag.points)


def read_logdir_report(logdir: str) -> LogdirReport:
    """Reads every gradient summary under ``logdir``, and reports what could not be read.

    One bad file never hides the rest: a run, file or tag that cannot be read is skipped and
    reported as a `Problem`; the others come back whole. What is refused, and how:

    - a file that is not a regular file (a FIFO, a device), cannot be opened or read, or of
      which not one record is intact: `UNREADABLE`, skipped;
    - damaged records (see `event_files.read_events`): skipped, counted per file (`DAMAGED`);
      when the framing breaks, the rest of that file is not read;
    - a tag whose (first) metadata is malformed or of a newer major format version (the
      message says to upgrade): `UNREADABLE`, skipped;
    - points whose tensor is not what the metadata declares (`decode_tensor`: refused before
      decoding), or that a later file logged under other metadata for the same tag (their rows
      would be misnamed): `DAMAGED`, refused and counted in ``series.damaged_points``; a stats
      tag with no readable point at all is `UNREADABLE`;
    - histograms whose variables differ from their stats tag's (`histograms_mismatch`, the
      plugin's rule too): `DAMAGED`, left out (the statistics are kept).

    Returns:
      A `LogdirReport`: ``runs`` as `read_logdir` returns it, ``problems`` in reading order.

    Raises:
      FileNotFoundError: ``logdir`` is not a directory.
    """
    if not os.path.isdir(logdir):
        raise FileNotFoundError(f"no such log directory: {logdir!r}")
    problems: List[Problem] = []

    def run_name(directory: str) -> str:
        return os.path.relpath(directory, logdir).replace(os.sep, "/")

    def unlisted(error: OSError):
        problems.append(Problem(UNREADABLE, run_name(error.filename), None, error.filename,
                                f"directory not listed: {error}"))

    runs = {}
    for directory, _, files in sorted(os.walk(logdir, onerror=unlisted)):
        event_file_names = [f for f in files if event_files.is_event_file(f)]
        if not event_file_names:
            continue
        run = _RunReader(run_name(directory), problems)
        for filename in sorted(event_file_names):
            run.read_file(os.path.join(directory, filename))
        series = run.collect_series()
        if series:
            runs[run.run] = series
    return LogdirReport(runs=runs, problems=tuple(problems))


def read_logdir(logdir: str) -> Dict[str, Dict[str, GradientSeries]]:
    """Reads every gradient summary under ``logdir`` (every step: no sampling).

    What cannot be read is skipped with a warning per problem (see `read_logdir_report`, which
    also returns them); the rest comes back.

    Returns:
      ``{run: {tag: GradientSeries}}`` where a run is an event-file directory relative to
      ``logdir`` (``"."`` for ``logdir`` itself, as TensorBoard names it). Histograms logged for a
      tag are attached to its series as ``series.histograms``.

    Raises:
      FileNotFoundError: ``logdir`` does not exist.
    """
    report = read_logdir_report(logdir)
    for problem in report.problems:
        logger.warning("%s gradients data: %s", problem.kind.capitalize(), problem)
    return report.runs
