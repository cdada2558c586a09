"""Gradient series read through TensorBoard's data provider, cached until the run changes.

The plugin's only way to the data (works with both loaders). Every route needs whole series
(classes depend on each variable's history, merged columns must see every step), so a series is
read once and kept, keyed by the tag's ``(max_step, max_wall_time)`` from the cheap
``list_tensors`` call: a run that stopped changing is never read twice, a run still training is
re-read when it grew.

One bad file must never break the tab for everything else:

* A tag whose metadata does not parse, or whose series cannot be built, is a per-tag error
  (`TagInfo.error`, `UnreadableTagError`): the plugin lists it with its message and serves every
  other tag as usual.
* Logged tensors are checked against their tag's metadata BEFORE they are decoded. Both data
  providers decode inside ``read_tensors`` with `tensor_util.make_ndarray`, which expands a
  one-value ("splat") tensor to whatever shape it declares: a 537-byte record declaring a
  [1048576, 1048576] float32 tensor asks for 4.4 TB, so every read of its tag would fail (and a
  smaller bomb would hold gigabytes of server memory). No provider API hands out the undecoded
  proto, and both providers (the Python loader's ``backend/event_processing/data_provider.py``,
  the Rust loader's ``data/grpc_provider.py``) call ``tensor_util.make_ndarray`` through the
  module attribute at call time, on the thread that called ``read_tensors``. That attribute is
  therefore the one hook before decoding: `install_decode_guard` replaces it, once per process,
  by a function that IS the original except on a thread inside this module's ``read_tensors``
  call, where it decodes with `decode_tensor` against the shape the metadata gives and
  turns a refused tensor into None, which `reader` counts as a damaged point.
* Event files of a local logdir are checked for records that fail their checksum
  (`EventFileIntegrity`): TensorBoard's Rust loader serves such a record's wrong values, its
  Python loader stops reading the file there. The steps of a damaged record that still parses
  are left out of the served series and counted; records that do not parse are reported per
  file. Each file is scanned once and then only its new bytes, so a request on unchanged files
  costs one ``stat`` per file.
* Histograms whose variables differ from their stats tag's are left out whole, by the rule
  `read_logdir` follows too (`reader.histograms_mismatch`).

What was left out is never silent: `Loaded.damaged` counts the stats tag's steps left out,
`Loaded.damage` says why, and also names what its histograms and epoch marks lost (their damaged
records, refused epoch marks, histograms left out). Histogram tensors refused before decoding
are only known once the histograms are read (`GradientData.histograms`): they are left out of
the histogram answers and logged, not counted on the stats tag.
"""

import collections
import contextlib
import dataclasses
import functools
import logging
import os
import threading
from typing import Dict, FrozenSet, Optional, Tuple

import numpy as np
from tensorboard.data import provider
from tensorboard.util import tensor_util

from tensorboard_gradients import analysis
from tensorboard_gradients.format import event_files, metadata, reader
from tensorboard_gradients.format.series import DamagedPointError, GradientHistograms, GradientSeries, decode_tensor, expected_shape, histograms_from_points, series_from_points

logger = logging.getLogger(__name__)

_ALL_POINTS = 10**9
# The Rust data server answers ReadTensors in ONE gRPC message and TensorBoard's client refuses
# messages over 256 MiB (server_ingester.py); a tag bigger than that is read sampled (flagged).
_GRPC_MESSAGE_LIMIT = 256 * 1024 * 1024
_SAMPLED_READ_BYTES = 200 * 1024 * 1024
# Cached series kept in memory (least recently used first out; the newest always stays).
DEFAULT_CACHE_BYTES = 2 * 1024**3
_DERIVED_PER_SERIES = 12


class UnknownError(LookupError):
    """An unknown run, tag, variable or stat (the plugin answers 404)."""


class UnreadableTagError(ValueError):
    """A tag whose metadata or data cannot be read (the plugin answers 400; ``runs`` lists the
    tag with `reason`)."""

    def __init__(self, run: str, tag: str, reason: str):
        super().__init__(f"run {run!r}, tag {tag!r}: {reason}")
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class TagInfo:
    parsed: Optional[metadata.PluginData]  # None when unreadable (see `error`)
    signature: tuple
    error: Optional[str] = None


@dataclasses.dataclass
class Loaded:
    """One cached series and what was derived from it."""

    series: GradientSeries
    sampled: Optional[str]  # why not every logged step is present, or None
    # Logged steps of the stats tag left out as damaged (refused tensors, records failing their
    # checksum) and the sentences that explain them, any damaged file of the run, and what its
    # histograms and epoch marks lost.
    damaged: int = 0
    damage: Tuple[str, ...] = ()
    # What routes derived from it (classes, alerts, encoded answers), by a key naming the
    # derivation and its parameters; the newest few are kept.
    derived: "collections.OrderedDict[tuple, object]" = dataclasses.field(
        default_factory=collections.OrderedDict
    )


def _too_big_for_grpc(error) -> bool:
    code = getattr(error, "code", None)
    return callable(code) and getattr(code(), "name", "") == "RESOURCE_EXHAUSTED"


def _counted(count: int, singular: str, plural: str) -> str:
    return f"{count} {singular if count == 1 else plural}"


# ---------------------------------------------------------------------------------------------
# Decoding checked against the metadata (see the module docstring for why this is a hook).


class _DecodeExpectation(threading.local):
    shape: Optional[Tuple[int, ...]] = None  # set while this thread reads one of our tags
    refusals: Optional[collections.Counter] = None  # why tensors were refused, by reason


_EXPECTATION = _DecodeExpectation()
_INSTALL_LOCK = threading.Lock()


def _guarded(original):
    @functools.wraps(original)
    def make_ndarray(tensor):
        shape = _EXPECTATION.shape
        if shape is None:
            return original(tensor)
        try:
            return decode_tensor(tensor, shape)
        except DamagedPointError as error:
            _EXPECTATION.refusals[str(error)] += 1
            return None

    make_ndarray.gradients_decode_guard = True
    return make_ndarray


def install_decode_guard():
    """Makes `tensor_util.make_ndarray` check our tags' tensors before decoding (idempotent)."""
    with _INSTALL_LOCK:
        if not getattr(tensor_util.make_ndarray, "gradients_decode_guard", False):
            tensor_util.make_ndarray = _guarded(tensor_util.make_ndarray)


@contextlib.contextmanager
def _decoding_as(shape: Tuple[int, ...], refusals: collections.Counter):
    _EXPECTATION.shape, _EXPECTATION.refusals = shape, refusals
    try:
        yield
    finally:
        _EXPECTATION.shape = _EXPECTATION.refusals = None


def _refusal_message(count: int, refusals: collections.Counter, what: str = "this tag") -> str:
    """The sentence for ``count`` logged steps of ``what`` refused before decoding."""
    reasons = [reason for reason, _ in refusals.most_common(2)] or [
        "not a float matrix of the shape its metadata gives"
    ]
    return (
        f"{_counted(count, f'logged step of {what} was', f'logged steps of {what} were')} "
        f"refused as damaged: {'; '.join(reasons)}"
    )


# ---------------------------------------------------------------------------------------------
# Records failing their checksum in a local logdir.


@dataclasses.dataclass
class _FileScan:
    """What the records of one event file told so far; the next scan resumes at `offset`."""

    size: int = -1
    mtime_ns: int = -1
    offset: int = 0
    damaged_steps: Dict[str, set] = dataclasses.field(default_factory=dict)  # tag -> steps
    unreadable: int = 0  # records failing their checksum that do not parse either
    broken_at: Optional[int] = None  # a record length failing its checksum: nothing after it


@dataclasses.dataclass(frozen=True)
class RunDamage:
    """The damaged records of one run's event files."""

    # tag -> {step of a damaged record that still parses: event file name}
    steps: Dict[str, Dict[int, str]] = dataclasses.field(default_factory=dict)
    file_messages: Tuple[str, ...] = ()  # damage that cannot be pinned to a tag

    def steps_of(self, tag: str) -> FrozenSet[int]:
        return frozenset(self.steps.get(tag, ()))

    def signature(self, *tags: str) -> tuple:
        return tuple(self.steps_of(tag) for tag in tags) + (self.file_messages,)

    def messages_for(self, tag: str, *companions: Tuple[str, str]) -> Tuple[str, ...]:
        """Sentences on the damaged records of ``tag``, then of each ``(tag, what)`` of
        ``companions`` (its histograms and epochs tags, named ``what``), then on the files."""
        sentences = []
        for name, what in ((tag, "this tag"),) + companions:
            by_file = collections.Counter(self.steps.get(name, {}).values())
            sentences.extend(
                f"{_counted(count, f'logged step of {what} was', f'logged steps of {what} were')}"
                f" left out: {'its record' if count == 1 else 'their records'} in {file} "
                f"{'fails its checksum' if count == 1 else 'fail their checksums'} (damaged on "
                "disk; TensorBoard's Python loader stops reading that file there, so its later "
                "steps may be missing too)"
                for file, count in sorted(by_file.items())
            )
        return tuple(sentences) + self.file_messages


_NO_DAMAGE = RunDamage()


class EventFileIntegrity:
    """Checks the record checksums of a local logdir's event files, per run (thread-safe).

    A file is scanned once, then only its new bytes while it grows (one ``stat`` per file when
    nothing changed); a file that shrank or was rewritten in place is scanned again. Memory is
    bounded by the largest record, as in `event_files.read_events`, and by what was found.
    A logdir that is not a local directory (``gs://...``, several logdirs) is not checked.
    """

    def __init__(self, logdir: Optional[str]):
        self._root = os.path.realpath(logdir) if logdir and os.path.isdir(logdir) else None
        self._files: Dict[str, _FileScan] = {}
        self._lock = threading.Lock()

    def run(self, run: str) -> RunDamage:
        directory = self._directory(run)
        if directory is None:
            return _NO_DAMAGE
        steps, messages = {}, []
        with self._lock:
            for name, path in _event_files(directory):
                try:
                    scan = self._scanned(path)
                except FileNotFoundError:
                    continue  # deleted since it was listed
                except OSError as error:
                    messages.append(f"{name} cannot be checked: {error.strerror or error}")
                    continue
                for tag, tag_steps in scan.damaged_steps.items():
                    steps.setdefault(tag, {}).update(dict.fromkeys(tag_steps, name))
                if scan.unreadable:
                    messages.append(
                        f"{_counted(scan.unreadable, 'record', 'records')} of {name} "
                        f"{'fails its' if scan.unreadable == 1 else 'fail their'} checksum and "
                        "cannot be read: the steps they held are missing"
                    )
                if scan.broken_at is not None:
                    messages.append(
                        f"{name} is damaged at byte {scan.broken_at} (a record length fails "
                        "its checksum): nothing after it can be read"
                    )
        return RunDamage(steps, tuple(messages)) if steps or messages else _NO_DAMAGE

    def _directory(self, run: str) -> Optional[str]:
        """The run's directory, if it lies inside the logdir (run names are relative paths)."""
        if self._root is None:
            return None
        directory = os.path.realpath(os.path.join(self._root, *run.split("/")))
        inside = directory == self._root or directory.startswith(self._root + os.sep)
        return directory if inside and os.path.isdir(directory) else None

    def _scanned(self, path: str) -> _FileScan:
        status = os.stat(path)
        scan = self._files.get(path)
        if scan is not None and (scan.size, scan.mtime_ns) == (status.st_size, status.st_mtime_ns):
            return scan
        if scan is None or status.st_size <= scan.size:  # new, shrunk or rewritten in place
            scan = _FileScan()
        if scan.broken_at is None:
            _scan_records(path, scan, status.st_size)
        # Only once scanned: a read that failed half way resumes at the last record it read.
        scan.size, scan.mtime_ns = status.st_size, status.st_mtime_ns
        self._files[path] = scan
        return scan


def _event_files(directory: str):
    """``(name, path)`` of the event files directly in ``directory``, sorted."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    return sorted(
        (entry.name, entry.path)
        for entry in entries
        if event_files.is_event_file(entry.name) and entry.is_file()
    )


def _scan_records(path: str, scan: _FileScan, size: int):
    """Reads ``path`` from ``scan.offset`` to ``size``, noting records failing their checksum;
    a record still being written is left for the next scan."""
    framing = event_files.ReadDamage()
    with event_files.open_regular_file(path) as file:
        for record in event_files.iter_records(file, scan.offset, size, framing):
            scan.offset = record.end
            if not record.intact:
                _note_damaged_record(record.data, scan)
    scan.broken_at = framing.framing_broken_at


def _note_damaged_record(record: bytes, scan: _FileScan):
    event = event_files.parse_event(record)
    if event is None:
        scan.unreadable += 1
        return
    for value in event.summary.value:
        scan.damaged_steps.setdefault(value.tag, set()).add(int(event.step))


# ---------------------------------------------------------------------------------------------


class GradientData:
    """Lists and loads the plugin's tags for one TensorBoard (thread-safe).

    ``logdir``: TensorBoard's ``--logdir``; when it is a local directory its event files' record
    checksums are checked too (`EventFileIntegrity`).
    """

    def __init__(self, data_provider, cache_bytes: int = DEFAULT_CACHE_BYTES, *,
                 logdir: Optional[str] = None):
        install_decode_guard()
        self._provider = data_provider
        self._integrity = EventFileIntegrity(logdir)
        self._cache_bytes = cache_bytes
        self._cache: "collections.OrderedDict[tuple, _Entry]" = collections.OrderedDict()
        self._lock = threading.Lock()

    def tags(self, ctx, experiment) -> Dict[str, Dict[str, TagInfo]]:
        """``{run: {tag: TagInfo}}`` of every tag this plugin wrote, any kind."""
        listing = self._provider.list_tensors(
            ctx, experiment_id=experiment, plugin_name=metadata.PLUGIN_NAME
        )
        result = {}
        for run, tags in listing.items():
            for tag, series in tags.items():
                signature = (series.max_step, series.max_wall_time)
                try:
                    info = TagInfo(metadata.parse_plugin_data(series.plugin_content), signature)
                except metadata.UnsupportedFormatError as error:
                    info = TagInfo(None, signature, error=str(error))
                except Exception as error:  # noqa: BLE001 - one tag must not hide every run
                    logger.exception("run %r tag %r: metadata parsing failed", run, tag)
                    info = TagInfo(None, signature, error=f"its metadata cannot be read ({error})")
                result.setdefault(run, {})[tag] = info
        return result

    @staticmethod
    def listed_tags(tags):
        """``(run, tag)`` of what ``runs`` lists: stats tags and tags that cannot be read."""
        for run, run_tags in tags.items():
            for tag, info in run_tags.items():
                if info.parsed is None or info.parsed.kind == metadata.KIND_STATS:
                    yield run, tag

    @staticmethod
    def has_histograms(tags, run: str, tag: str) -> bool:
        """Whether stats tag ``tag`` has histograms that `histograms` serves."""
        return _histograms_next_to(tags, run, tag)[0] is not None

    def stats_tag(self, tags, run: str, tag: str) -> TagInfo:
        """The `TagInfo` of a stats tag; `UnknownError` / `UnreadableTagError`."""
        info = tags.get(run, {}).get(tag)
        if info is None:
            if run not in tags:
                raise UnknownError(f"no gradients for run {run!r}")
            raise UnknownError(f"no gradients tag {tag!r} in run {run!r}")
        if info.error:
            raise UnreadableTagError(run, tag, info.error)
        if info.parsed.kind != metadata.KIND_STATS:
            raise UnknownError(
                f"{tag!r} in run {run!r} is a {info.parsed.kind} tag, not a stats tag"
            )
        return info

    def series(self, ctx, experiment, run: str, tag: str, tags=None) -> Loaded:
        """The whole logged series of a stats tag (cached while its tag is unchanged)."""
        tags = self.tags(ctx, experiment) if tags is None else tags
        info = self.stats_tag(tags, run, tag)
        epochs_tag = metadata.epochs_tag(info.parsed.name)
        epochs_info = tags[run].get(epochs_tag)
        if epochs_info is not None and (
            epochs_info.parsed is None or epochs_info.parsed.kind != metadata.KIND_EPOCHS
        ):
            epochs_info = None  # unreadable: listed with its own error, the series has no epochs
        _, mismatch = _histograms_next_to(tags, run, tag)
        damage = self._integrity.run(run)
        signature = (
            info.signature,
            epochs_info.signature if epochs_info else None,
            mismatch,
            damage.signature(tag, epochs_tag, metadata.histogram_tag(tag)),
        )
        key = ("series", experiment, run, tag)
        cached = self._cached(key, signature)
        if cached is not None:
            return cached
        with _unreadable_as_error(run, tag):
            loaded = self._load_series(ctx, experiment, run, tag, info, epochs_info, damage,
                                       mismatch)
        self._store(key, loaded, signature, loaded.series.values.nbytes)
        return loaded

    def _load_series(self, ctx, experiment, run, tag, info, epochs_info, damage,
                     mismatch) -> Loaded:
        """The series of stats tag ``tag`` and what was left out of it, its epoch marks and its
        histograms (``mismatch``: why they are left out whole, or None)."""
        points, sampled, refusals = self._read(ctx, experiment, run, tag, info.parsed)
        left_out = damage.steps_of(tag)
        epochs_tag = metadata.epochs_tag(info.parsed.name)
        epoch_points, epochs_refused = (), ()
        if epochs_info is not None:
            epoch_points, _, epoch_refusals = self._read(
                ctx, experiment, run, epochs_tag, epochs_info.parsed
            )
            epoch_points = _without_steps(epoch_points, damage.steps_of(epochs_tag))
            refused_marks = sum(matrix is None for _, _, matrix in epoch_points)
            if refused_marks:
                epochs_refused = (_refusal_message(
                    refused_marks, epoch_refusals, f"its epoch marks ({epochs_tag!r})"),)
        series = series_from_points(
            run, tag, info.parsed, _without_steps(points, left_out), epoch_points
        )
        refused = series.damaged_points
        histogram_tag = metadata.histogram_tag(tag)
        return Loaded(
            series=series,
            sampled=sampled,
            damaged=refused + len(left_out),
            damage=((_refusal_message(refused, refusals),) if refused else ())
            + epochs_refused
            + damage.messages_for(tag, (histogram_tag, f"its histograms ({histogram_tag!r})"),
                                  (epochs_tag, f"its epoch marks ({epochs_tag!r})"))
            + ((mismatch,) if mismatch else ()),
        )

    def histograms(self, ctx, experiment, run: str, tag: str,
                   tags=None) -> GradientHistograms:
        """The histograms logged next to a stats tag, their rows its variables; `UnknownError`
        if none were, or they are left out (`reader.histograms_mismatch`)."""
        tags = self.tags(ctx, experiment) if tags is None else tags
        self.stats_tag(tags, run, tag)
        histogram_tag = metadata.histogram_tag(tag)
        info, mismatch = _histograms_next_to(tags, run, tag)
        if info is None:
            if mismatch:
                raise UnknownError(f"run {run!r}, tag {tag!r}: {mismatch}")
            logged = tags[run].get(histogram_tag)
            why = f" that can be read ({logged.error})" if logged and logged.error else ""
            raise UnknownError(f"no histograms{why} were logged for run {run!r}, tag {tag!r}")
        left_out = self._integrity.run(run).steps_of(histogram_tag)
        signature = (info.signature, left_out)
        key = ("histograms", experiment, run, tag)
        cached = self._cached(key, signature)
        if cached is not None:
            return cached
        with _unreadable_as_error(run, histogram_tag):
            points, _, _ = self._read(ctx, experiment, run, histogram_tag, info.parsed)
            histograms = histograms_from_points(
                run, histogram_tag, info.parsed, _without_steps(points, left_out)
            )
        if histograms is None:
            raise UnknownError(f"no histograms were logged for run {run!r}, tag {tag!r}")
        self._store(key, histograms, signature, histograms.counts.nbytes)
        return histograms

    def analysis(self, loaded: Loaded, thresholds: analysis.Thresholds) -> analysis.Analysis:
        """`analysis.analyze` of a loaded series: classes and alerts (memoised per thresholds)."""
        def analyze():
            with _unreadable_as_error(loaded.series.run, loaded.series.tag):
                return analysis.analyze(loaded.series, thresholds)

        return self.memo(loaded, ("analysis", thresholds), analyze)

    def memo(self, loaded: Loaded, key: tuple, compute):
        """``compute()`` once per ``key`` for as long as this loaded series is current."""
        with self._lock:
            if key in loaded.derived:
                loaded.derived.move_to_end(key)
                return loaded.derived[key]
        value = compute()
        with self._lock:
            loaded.derived[key] = value
            while len(loaded.derived) > _DERIVED_PER_SERIES:
                loaded.derived.popitem(last=False)
        return value

    def _read(self, ctx, experiment, run, tag, parsed):
        """(points as (step, wall_time, ndarray or None if refused), why sampled or None,
        refusal reasons)."""
        expected = expected_shape(parsed)
        refusals = collections.Counter()

        def read(downsample):
            with _decoding_as(expected, refusals):
                result = self._provider.read_tensors(
                    ctx,
                    experiment_id=experiment,
                    plugin_name=metadata.PLUGIN_NAME,
                    downsample=downsample,
                    run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]),
                )
            return [(d.step, d.wall_time, d.numpy) for d in result.get(run, {}).get(tag, ())]

        try:
            return read(_ALL_POINTS), None, refusals
        except Exception as error:  # noqa: BLE001 - only the gRPC size error is handled
            if not _too_big_for_grpc(error):
                raise
        # float32 statistics (float64 ones when a gradient was float64: then halve again).
        point_bytes = 4 * max(1, int(np.prod(expected)))
        kept = max(1, _SAMPLED_READ_BYTES // point_bytes)
        while True:
            logger.warning(
                "run %r tag %r exceeds the data server's %d MiB per-read limit; reading %d "
                "sampled steps", run, tag, _GRPC_MESSAGE_LIMIT >> 20, kept,
            )
            refusals.clear()
            try:
                points = read(kept)
                break
            except Exception as error:  # noqa: BLE001
                if not _too_big_for_grpc(error) or kept == 1:
                    raise
                kept = max(1, kept // 2)
        return points, (
            f"this tag holds more data than TensorBoard's data server passes in one read "
            f"({_GRPC_MESSAGE_LIMIT >> 20} MiB), so only {len(points)} sampled steps are shown; "
            "start TensorBoard with --load_fast=false to see every logged step"
        ), refusals

    def _cached(self, key, signature):
        with self._lock:
            entry = self._cache.get(key)
            if entry is None:
                return None
            if entry.signature != signature:
                del self._cache[key]
                return None
            self._cache.move_to_end(key)
            return entry.value

    def _store(self, key, value, signature, nbytes):
        with self._lock:
            self._cache[key] = _Entry(value, signature, nbytes)
            self._cache.move_to_end(key)
            while (
                len(self._cache) > 1
                and sum(e.nbytes for e in self._cache.values()) > self._cache_bytes
            ):
                self._cache.popitem(last=False)


def _histograms_next_to(tags, run: str, tag: str) -> Tuple[Optional[TagInfo], Optional[str]]:
    """The histograms tag of stats tag ``tag`` when it can be served (else None), and why it is
    left out when it was logged for other variables (`reader.histograms_mismatch`, the rule of
    `read_logdir` too). An unreadable histograms tag is listed with its own error."""
    name = metadata.histogram_tag(tag)
    info, stats = tags.get(run, {}).get(name), tags.get(run, {}).get(tag)
    if (info is None or info.parsed is None or info.parsed.kind != metadata.KIND_HISTOGRAMS
            or stats is None or stats.parsed is None
            or stats.parsed.kind != metadata.KIND_STATS):
        return None, None
    mismatch = reader.histograms_mismatch(tag, stats.parsed, name, info.parsed)
    return (None, mismatch) if mismatch else (info, None)


def _without_steps(points, steps: FrozenSet[int]):
    return [point for point in points if point[0] not in steps] if steps else points


@contextlib.contextmanager
def _unreadable_as_error(run: str, tag: str):
    """Turns any failure to build a tag's data into that tag's `UnreadableTagError`, so one bad
    tag never takes a route down for the others (the traceback is logged)."""
    try:
        yield
    except (UnknownError, UnreadableTagError):
        raise
    except Exception as error:  # noqa: BLE001 - reported per tag, see above
        logger.exception("run %r tag %r cannot be read", run, tag)
        raise UnreadableTagError(
            run, tag, f"its data cannot be read ({type(error).__name__}: {error})"
        ) from error


@dataclasses.dataclass(frozen=True)
class _Entry:
    value: object
    signature: tuple
    nbytes: int
