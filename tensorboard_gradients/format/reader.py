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

import collections
import dataclasses
import logging
import os
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorboard_gradients.format import event_files, inventory, metadata, storage
from tensorboard_gradients.format.series import (
    DamagedPointError,
    GradientSeries,
    check_tensor,
    decode_tensor,
    expected_shape,
    histograms_from_points,
    loss_curve,
    series_from_points,
    with_loss,
)

logger = logging.getLogger(__name__)


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
    # (step, wall_time, (file, record offset, value index)): where each point lies, checked
    # against the metadata but not decoded (`LoggedSeries` reads them back, a few at a time).
    points: List[tuple] = dataclasses.field(default_factory=list)
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

    The one rule of `read_logdir` and of the plugin (`server.store`), so they cannot disagree.
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

    def __init__(self, run: str, problems: List[Problem], other_tags: Dict[str, set],
                 loss_scalars: Sequence[str] = metadata.LOSS_SCALARS):
        self.run = run
        self.problems = problems
        self.tags: Dict[str, _Tag] = {}
        # The run's own loss scalars (`metadata.LOSS_SCALARS`), for names logged without their
        # ``<name>_loss`` tag: {scalar tag: [(step, wall_time, value)]}.
        self.loss_scalars = tuple(loss_scalars)
        self.scalar_losses: Dict[str, list] = {}
        self.unreadable_tags = set()
        # {plugin name: tags} that other plugins logged: what to name when there are no gradients.
        self.other_tags = other_tags

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
            for offset, event in event_files.located_events(path, damage):
                events += 1
                for index, value in enumerate(event.summary.value):
                    self._take((path, offset, index), event, value, refusals, refused)
        except OSError as error:
            read = "read only in part" if events else "not read"
            self.report(UNREADABLE, None, path, f"{read}: {error}")
        if damage:
            kind = DAMAGED if events else UNREADABLE
            self.report(kind, None, path, str(damage) if events else f"no record read: {damage}")
        for tag, (count, reasons) in refused.items():
            self.tags[tag].refused_points += count
            self.report(DAMAGED, tag, path, f"{count} point(s) refused: {'; '.join(reasons)}")

    def _take(self, location, event, value, refusals, refused):
        path = location[0]
        if value.tag in self.unreadable_tags:
            return
        plugin_data = value.metadata.plugin_data
        tag = self.tags.get(value.tag)
        if tag is None:
            if plugin_data.plugin_name != metadata.PLUGIN_NAME:
                # Another plugin's tag (or a value before any metadata: as TensorBoard); a bare
                # simple_value is a legacy scalar (torch.utils.tensorboard writes them).
                other = plugin_data.plugin_name or (
                    "scalars" if value.HasField("simple_value") else None)
                if other:
                    self.other_tags.setdefault(other, set()).add(value.tag)
                if other == "scalars" and value.tag in self.loss_scalars:
                    self._take_loss_scalar(event, value)
                return
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
                check_tensor(value.tensor, expected_shape(tag.parsed))
            except DamagedPointError as error:
                reason = str(error)
            else:
                tag.points.append((event.step, event.wall_time, location))
                return
        counted = refused.setdefault(value.tag, [0, []])
        counted[0] += 1
        if reason not in counted[1] and len(counted[1]) < _REASONS_SHOWN:
            counted[1].append(reason)

    def _take_loss_scalar(self, event, value):
        number = scalar_value(value)
        if number is not None:  # else not a scalar: not a loss this reader can take
            self.scalar_losses.setdefault(value.tag, []).append(
                (event.step, event.wall_time, number))

    def _loss_of(self, name: str):
        """``(curve, source)`` of the loss for summary name ``name`` (`series.loss_curve`):
        its ``<name>_loss`` tag, else the first of the run's loss scalars logged; None."""
        tag_name = metadata.loss_tag(name)
        tag = self._tag_of_kind(tag_name, metadata.KIND_LOSS)
        source = metadata.loss_source(
            name, lambda t: bool(tag.points) if t == tag_name and tag is not None
            else bool(self.scalar_losses.get(t)), self.loss_scalars)
        if source is None:
            return None
        points = (read_back(tag_name, tag.parsed, tag.points, self.report) if source == tag_name
                  else self.scalar_losses[source])
        return loss_curve(self.run, source, points), source

    def collect_series(self) -> Dict[str, "LoggedSeries"]:
        """``{tag: LoggedSeries}`` of the stats tags with readable points (once all files are
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
            result[name] = LoggedSeries(
                self.run, name, tag, epochs, self._histograms(name, tag), self.report,
                self._loss_of(tag.parsed.name))
        return result

    def _tag_of_kind(self, name: str, kind: str) -> Optional[_Tag]:
        tag = self.tags.get(name)
        return tag if tag is not None and tag.parsed.kind == kind else None

    def _histograms(self, stats_name: str, stats: _Tag) -> Optional[_Tag]:
        name = metadata.histogram_tag(stats_name)
        tag = self._tag_of_kind(name, metadata.KIND_HISTOGRAMS)
        if tag is None:
            return None
        mismatch = histograms_mismatch(stats_name, stats.parsed, name, tag.parsed)
        if mismatch:
            self.report(DAMAGED, name, tag.path, mismatch)
            return None
        return tag


class LoggedSeries:
    """A stats tag of a run as its event files hold it: every logged step located, none decoded
    until asked for, so a run of any length is read in memory bounded by the rows asked for.

    ``steps``/``wall_times`` are the logged steps in order (a rewritten step: its last write);
    `rows` reads some of them back and `series` all of them, as `GradientSeries`.
    """

    def __init__(self, run: str, tag: str, stats: _Tag, epochs: Optional[_Tag],
                 histograms: Optional[_Tag], report, loss=None):
        self.run, self.tag = run, tag
        self.loss = loss  # (curve, source) of the run's loss (`_RunReader._loss_of`), or None
        self.parsed = stats.parsed
        self._stats, self._epochs, self._histograms = stats, epochs, histograms
        self._report = report
        by_step = {int(step): (wall_time, location) for step, wall_time, location in stats.points}
        self.steps = np.array(sorted(by_step), dtype=np.int64)
        self.wall_times = np.array([by_step[s][0] for s in self.steps.tolist()], np.float64)
        self.locations = [by_step[s][1] for s in self.steps.tolist()]
        self.refused_points = stats.refused_points

    def __len__(self):
        return len(self.steps)

    def rows(self, start: int, stop: int) -> GradientSeries:
        """The logged steps ``start:stop`` (no epochs, no histograms; their loss) as a
        `GradientSeries`; a point that no longer reads back is left out and reported."""
        rows = located_rows(self.run, self.tag, self.parsed, self, start, stop, self._report)
        return rows if self.loss is None else with_loss(rows, *self.loss)

    def series(self) -> GradientSeries:
        """Every logged step, its epoch marks and histograms, as a `GradientSeries`."""
        def decoded(tag: _Tag, name: str):
            return read_back(name, tag.parsed, tag.points, self._report)

        histograms = None
        if self._histograms is not None:
            name = metadata.histogram_tag(self.tag)
            histograms = histograms_from_points(
                self.run, name, self._histograms.parsed, decoded(self._histograms, name))
        epochs = () if self._epochs is None else decoded(
            self._epochs, metadata.epochs_tag(self.parsed.name))
        steps = self.rows(0, len(self))
        points = zip(steps.steps.tolist(), steps.wall_times.tolist(), steps.values)
        series = series_from_points(self.run, self.tag, self.parsed, points, epochs, histograms)
        if self.loss is not None:
            series = with_loss(series, *self.loss)
        return dataclasses.replace(
            series, damaged_points=series.damaged_points + self.refused_points)


def located_rows(run, tag, parsed, located, start: int, stop: int, report) -> GradientSeries:
    """The logged steps ``start:stop`` of ``located`` (``steps``, ``wall_times`` and
    ``locations`` of a stats tag's points, in step order) read back as a `GradientSeries`
    (no epochs, no histograms); what does not read back is left out (`read_back`)."""
    points = zip(located.steps[start:stop].tolist(), located.wall_times[start:stop].tolist(),
                 located.locations[start:stop])
    return series_from_points(run, tag, parsed, read_back(tag, parsed, points, report))


def located_events(points, location):
    """Per event file, its ``points`` in record order and an iterator of each one's event
    (None where its record no longer reads back), ``location(point)`` being ``(path, record
    offset, value index)``: ``(path, points, events)``. The iterator raises `OSError` where it
    stops reading."""
    for path, in_file, records in located_records(points, location):
        yield path, in_file, map(event_files.event_of, records)


def located_records(points, location):
    """`located_events` with each point's `event_files.Record` (None where it no longer reads
    back whole) in place of its event. A local file is read as its iterator is; the records in
    a bucket are fetched `RECORDS_PER_FETCH` at a time (`event_files.records_located`: a
    round of concurrent requests each)."""
    by_file = collections.defaultdict(list)
    for point in points:
        by_file[location(point)[0]].append(point)
    for in_file in by_file.values():
        in_file.sort(key=lambda point: location(point)[1])
    remote = _Fetched([(path, location(point)[1]) for path, in_file in by_file.items()
                       if storage.is_url(path) for point in in_file])
    first = 0  # the position in ``remote`` of the next remote file's first record
    for path, in_file in by_file.items():
        offsets = [location(point)[1] for point in in_file]
        if storage.is_url(path):
            yield path, in_file, remote.records(first, len(offsets))
            first += len(offsets)
        else:
            yield path, in_file, _records_in(path, offsets)


# Records fetched from a bucket at a time (`located_records`): all of a long run's digest
# records (~100 of up to a few MB) in one round of requests, while a read of many steps holds
# ~6 MB of 1,000 variables' statistics at a time, not the run.
RECORDS_PER_FETCH = 128


class _Fetched:
    """The records at ``locations`` (``(path, offset)`` in a bucket), fetched
    `RECORDS_PER_FETCH` at a time as they are read, from wherever a reader asks; the next
    ones are fetched while a reader goes through these (a thread of their own, which a
    reader that stops reading leaves to end by itself)."""

    def __init__(self, locations):
        self._locations, self._start, self._records = locations, 0, []
        self._next = None  # (start, thread, [records]) of the next records being fetched

    def records(self, first: int, count: int):
        """The records at positions ``first`` to ``first + count``; raises the `OSError` of
        the first that could not be read."""
        for position in range(first, first + count):
            if not self._start <= position < self._start + len(self._records):
                self._start, self._records = position, self._fetched(position)
                self._fetch_next(position + len(self._records))
            record = self._records[position - self._start]
            if isinstance(record, OSError):
                raise record
            yield record

    def _fetched(self, start: int) -> list:
        if self._next is not None and self._next[0] == start:
            _, thread, fetched = self._next
            thread.join()
            if fetched:
                return fetched[0]
        return self._fetch(start)

    def _fetch_next(self, start: int):
        self._next = None
        if start >= len(self._locations):
            return
        fetched = []
        thread = threading.Thread(target=lambda: fetched.append(self._fetch(start)),
                                  daemon=True, name="tensorboard-gradients fetch ahead")
        thread.start()
        self._next = (start, thread, fetched)

    def _fetch(self, start: int) -> list:
        return event_files.records_located(self._locations[start:start + RECORDS_PER_FETCH])


def _records_in(path, offsets):
    with event_files.open_regular_file(path) as file:
        yield from event_files.records_at(file, offsets)


def scalar_value(value) -> Optional[float]:
    """The number of an ordinary scalar summary value (a legacy ``simple_value``, as
    `torch.utils.tensorboard` writes, or a scalar tensor, as ``tf.summary.scalar``); None for
    anything else."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    try:
        return float(decode_tensor(value.tensor, ()))
    except DamagedPointError:
        return None


def read_back_scalars(tag, points) -> List[tuple]:
    """``(step, wall_time, number)`` of an ordinary scalar tag's ``(step, wall_time, (path,
    record offset, value index))`` points; a point that no longer reads back as a scalar is
    left out."""
    numbers = []
    for _, in_file, events in located_events(points, lambda point: point[2]):
        try:
            for (step, wall_time, (_, _, index)), event in zip(in_file, events):
                value = None if event is None else event.summary.value[index]
                number = None if value is None or value.tag != tag else scalar_value(value)
                if number is not None:
                    numbers.append((step, wall_time, number))
        except (OSError, IndexError):
            continue  # the file changed since: its points are left out
    return numbers


def read_back(tag, parsed, points, report) -> List[tuple]:
    """``(step, wall_time, matrix)`` of ``(step, wall_time, (path, record offset, value index))``
    points of tag ``tag`` (metadata ``parsed``), each checked and decoded (`decode_tensor`). A
    point that no longer reads back as it was located (the file was replaced or damaged since,
    or it was not a tensor of the tag's shape) is left out and reported:
    ``report(DAMAGED, tag, path, message)``."""
    expected = expected_shape(parsed)
    decoded, lost = [], collections.Counter()
    for path, in_file, events in located_events(points, lambda point: point[2]):
        taken = 0  # points of this file decoded or refused
        try:
            for (step, wall_time, (_, _, index)), event in zip(in_file, events):
                taken += 1
                try:
                    value = None if event is None else event.summary.value[index]
                    if value is None or value.tag != tag:
                        raise DamagedPointError("its record no longer reads back (the "
                                                "file changed since it was read)")
                    decoded.append((step, wall_time, decode_tensor(value.tensor, expected)))
                except (IndexError, DamagedPointError) as error:
                    lost[(path, str(error))] += 1
        except OSError as error:
            lost[(path, str(error))] += len(in_file) - taken
    decoded.sort(key=lambda point: point[0])
    for (path, reason), count in lost.items():
        report(DAMAGED, tag, path, f"{count} point(s) left out: {reason}")
    return decoded


def read_logdir_report(logdir: str,
                       loss_scalars: Sequence[str] = metadata.LOSS_SCALARS) -> LogdirReport:
    """Reads every gradient summary under ``logdir``, and reports what could not be read.

    `scan_logdir_report` does the same without decoding a step until asked: for runs too long
    to hold in memory.

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
    scan = scan_logdir_report(logdir, loss_scalars)
    runs = {run: {tag: logged.series() for tag, logged in tags.items()}
            for run, tags in scan.runs.items()}
    return LogdirReport(runs=runs, problems=tuple(scan.problems))


@dataclasses.dataclass(frozen=True)
class LogdirScan:
    """What `scan_logdir_report` found: ``{run: {tag: LoggedSeries}}``, the problems so far
    (reading the series back may add some: the list grows), and an `inventory.Inventory` of
    everything under the logdir (for the message when no run holds gradients)."""

    runs: Dict[str, Dict[str, LoggedSeries]]
    problems: List[Problem]
    inventory: inventory.Inventory


def scan_logdir_report(logdir: str,
                       loss_scalars: Sequence[str] = metadata.LOSS_SCALARS) -> LogdirScan:
    """Locates every logged step under ``logdir`` without decoding any (`LoggedSeries`): the
    rules and problems of `read_logdir_report`, in memory bounded by the number of steps.

    Raises:
      FileNotFoundError: ``logdir`` is not a directory.
    """
    if not storage.is_directory(logdir):
        raise FileNotFoundError(f"no such log directory: {storage.shown(logdir)!r}")
    problems: List[Problem] = []

    def unlisted(error: OSError):
        run = os.path.relpath(error.filename, storage.local_path(logdir)).replace(os.sep, "/")
        problems.append(Problem(UNREADABLE, run, None, error.filename,
                                f"directory not listed: {error}"))

    runs = {}
    all_runs, file_count, other_tags = [], 0, {}
    for directory, run_name, event_file_names in storage.walk_event_directories(
            logdir, event_files.is_event_file, unlisted):
        file_count += len(event_file_names)
        run = _RunReader(run_name, problems, other_tags, loss_scalars)
        all_runs.append(run.run)
        for filename in event_file_names:
            run.read_file(storage.join(directory, filename))
        series = run.collect_series()
        if series:
            runs[run.run] = series
    found = inventory.Inventory(
        location=logdir, exists=True, event_files=file_count, runs=tuple(all_runs),
        tags={plugin: tuple(sorted(tags)) for plugin, tags in other_tags.items()})
    return LogdirScan(runs=runs, problems=problems, inventory=found)


def read_logdir(logdir: str, loss_scalars: Sequence[str] = metadata.LOSS_SCALARS
                ) -> Dict[str, Dict[str, GradientSeries]]:
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
    report = read_logdir_report(logdir, loss_scalars)
    for problem in report.problems:
        logger.warning("%s gradients data: %s", problem.kind.capitalize(), problem)
    return report.runs
