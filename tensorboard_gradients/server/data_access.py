"""Gradient series read through TensorBoard's data provider, cached until the run changes.

The plugin's way to the data (works with both loaders). Every route needs whole series
(classes depend on each variable's history, merged columns must see every step), so a series is
read once and kept (`cache`), keyed by the tag's ``(max_step, max_wall_time)`` from the cheap
``list_tensors`` call: a run that stopped changing is never read twice, a run still training is
re-read when it grew. A tag of a local logdir too long for that (`long_runs.is_long`) is read
from its event files instead, into a `long_runs.LongRun` that grows with the run, and digested
in the background as TensorBoard reads the logdir (`GradientData.digest_long_runs`).

One bad file must never break the tab for everything else:

* A tag whose metadata does not parse, or whose series cannot be built, is a per-tag error
  (`TagInfo.error`, `UnreadableTagError`): the plugin lists it with its message and serves every
  other tag as usual.
* Logged tensors are checked against their tag's metadata BEFORE they are decoded
  (`decode_guard`: TensorBoard would expand a few-byte record declaring 4.4 TB).
* Event files of a local logdir are checked for records that fail their checksum
  (`integrity`): TensorBoard's Rust loader serves such a record's wrong values, its Python
  loader stops reading the file there. The steps of a damaged record that still parses are left
  out of the served series and counted; records that do not parse are reported per file.
* Histograms whose variables differ from their stats tag's are left out whole, by the rule
  `read_logdir` follows too (`reader.histograms_mismatch`).

What was left out is never silent: `Loaded.damaged` counts the stats tag's steps left out,
`Loaded.damage` says why (`damage`), and also names what its histograms and epoch marks lost
(their damaged records, refused epoch marks, histograms left out). Histogram tensors refused
before decoding are only known once the histograms are read (`GradientData.histograms`): they
are left out of the histogram answers and logged, not counted on the stats tag.
"""

import collections
import contextlib
import dataclasses
import logging
import os
import threading
import time
from typing import Dict, FrozenSet, Optional, Tuple

import numpy as np
from tensorboard.data import provider

from tensorboard_gradients import analysis
from tensorboard_gradients.format import metadata, reader
from tensorboard_gradients.format.inventory import Inventory
from tensorboard_gradients.format.series import (
    GradientHistograms,
    GradientSeries,
    expected_shape,
    histograms_from_points,
    series_from_points,
)
from tensorboard_gradients.server.cache import Cache
from tensorboard_gradients.server.damage import refusal_message
from tensorboard_gradients.server.decode_guard import decoding_as, install_decode_guard
from tensorboard_gradients.server import integrity, traffic
from tensorboard_gradients.server.long_runs import LongRun, is_long

logger = logging.getLogger(__name__)

_ALL_POINTS = 10**9
# The Rust data server answers ReadTensors in ONE gRPC message and TensorBoard's client refuses
# messages over 256 MiB (server_ingester.py); a tag bigger than that is read sampled (flagged).
_GRPC_MESSAGE_LIMIT = 256 * 1024 * 1024
_SAMPLED_READ_BYTES = 200 * 1024 * 1024
# Cached series kept in memory (least recently used first out; the newest always stays).
DEFAULT_CACHE_BYTES = 2 * 1024**3
# Long tags whose digests are kept (each ~2-3 bytes per cell: 250 MB for 1,000 x 100,000).
MAX_LONG_RUNS = 4
# The plugin whose tags `GradientData.inventory` names: what a training job logs first (its loss).
_INVENTORIED_PLUGIN = "scalars"


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
    # derivation and its parameters; the newest few are kept (`GradientData.memo`).
    derived: "collections.OrderedDict[tuple, object]" = dataclasses.field(
        default_factory=collections.OrderedDict
    )
    # A tag too long to hold (`long_runs`): ``series`` then has its variables and stats but no
    # steps, and the routes answer from this.
    long_run: Optional[LongRun] = None


def _too_big_for_grpc(error) -> bool:
    code = getattr(error, "code", None)
    return callable(code) and getattr(code(), "name", "") == "RESOURCE_EXHAUSTED"


class GradientData:
    """Lists and loads the plugin's tags for one TensorBoard (thread-safe).

    ``logdir``: TensorBoard's ``--logdir``; when it is a local directory its event files' record
    checksums are checked too (`EventFileIntegrity`).
    """

    def __init__(self, data_provider, cache_bytes: int = DEFAULT_CACHE_BYTES, *,
                 logdir: Optional[str] = None, digest_every: Optional[float] = None):
        install_decode_guard()
        self._provider = data_provider
        self._integrity = integrity.shared(logdir)  # prescanned from TensorBoard's start
        self._cache = Cache(cache_bytes)
        self._long_runs = collections.OrderedDict()  # (run, tag) -> LongRun, oldest first
        self._lock = threading.Lock()
        if digest_every is not None and self._integrity.local:
            threading.Thread(target=self._digest_loop, args=(digest_every,), daemon=True,
                             name="tensorboard-gradients digests").start()

    def _digest_loop(self, every: float):
        """Digests long runs ahead of the first request (`digest_long_runs`), every ``every``
        seconds (0: once); a failure is logged and tried again next time."""
        while True:
            try:
                self.digest_long_runs()
            except Exception:  # noqa: BLE001 - a background thread must not die of one run
                if traffic.exiting():
                    return
                logger.exception("tensorboard-gradients could not digest the long runs")
            if not every:
                return
            time.sleep(every)

    def digest_long_runs(self):
        """Brings the default digest of every long tag of a local logdir up to date, as
        TensorBoard reads the logdir: the first heatmap and alerts of a long run then answer
        at once, and each pass reads only the steps logged since the last."""
        for run in self._integrity.runs():
            tags = self._integrity.tags(run)
            for tag, parsed in tags.items():
                try:
                    self._digest_long_tag(run, tag, parsed, tags)
                except Exception:  # noqa: BLE001 - one tag must not stop the others
                    if traffic.exiting():
                        return
                    logger.exception("run %r tag %r could not be digested", run, tag)

    def _digest_long_tag(self, run, tag, parsed, tags):
        if parsed.kind != metadata.KIND_STATS:
            return
        located = self._long_points(run, tag, parsed)
        if located is None:
            return
        with self._lock:
            # Past the kept number, requests choose which long runs stay: a background pass
            # over more would read each from its first step, every time.
            if (run, tag) not in self._long_runs and len(self._long_runs) >= MAX_LONG_RUNS:
                return
        epochs = tags.get(metadata.epochs_tag(parsed.name))
        if epochs is not None and epochs.kind != metadata.KIND_EPOCHS:
            epochs = None
        long_run, _ = self._updated_long_run(run, tag, parsed, located, epochs)
        long_run.digest(analysis.Thresholds(), background=True)

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

    def inventory(self, ctx, experiment, location: str, local: bool) -> Inventory:
        """What TensorBoard found at ``location`` (its ``--logdir``, or its ``--logdir_spec``):
        whether it is a directory, its runs and their scalar tags, as the data provider lists
        them (it counts no event files). Only a ``local`` location is checked for being a
        directory: a bucket (``gs://...``) or a spec of several logdirs counts as there, and its
        runs say what was found."""
        exists = not local or os.path.isdir(location)
        runs = sorted(run.run_name
                      for run in self._provider.list_runs(ctx, experiment_id=experiment))
        scalars = self._provider.list_scalars(ctx, experiment_id=experiment,
                                              plugin_name=_INVENTORIED_PLUGIN)
        tags = sorted({tag for run_tags in scalars.values() for tag in run_tags})
        return Inventory(location, exists, runs=tuple(runs), tags={_INVENTORIED_PLUGIN: tuple(tags)})

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
        located = self._long_points(run, tag, info.parsed)
        long = located is not None
        if long:
            epochs = None if epochs_info is None else self._integrity.located(run, epochs_tag)
            written = self._integrity.located(run, metadata.digest_tag(tag))
            signature += (len(located.steps), located.steps[-1],
                          None if epochs is None else len(epochs.steps),
                          None if written is None else tuple(written.steps[-1:].tolist()) + (
                              len(written.steps),))
        cached = self._cache.get(key, signature)
        if cached is not None:
            return cached
        with _unreadable_as_error(run, tag):
            if long:
                loaded = self._long_series(run, tag, info, located, epochs_info, epochs, damage,
                                           mismatch)
            else:
                loaded = self._load_series(ctx, experiment, run, tag, info, epochs_info, damage,
                                           mismatch)
        # A long run's memory is its `LongRun`'s, kept apart (`MAX_LONG_RUNS`).
        self._cache.put(key, loaded, signature, 0 if long else loaded.series.values.nbytes)
        return loaded

    def _long_series(self, run, tag, info, located, epochs_info, epochs, damage,
                     mismatch) -> Loaded:
        """A `Loaded` answering from a `LongRun` (brought up to date with the tag's points)."""
        long_run, marks = self._updated_long_run(
            run, tag, info.parsed, located, None if epochs is None else epochs_info.parsed)
        epochs_tag = metadata.epochs_tag(info.parsed.name)
        histogram_tag = metadata.histogram_tag(tag)
        series = dataclasses.replace(
            long_run.like, epoch_starts=None if marks is None else marks[0],
            epoch_indices=None if marks is None else marks[1])
        return Loaded(
            series=series, sampled=None, damaged=len(damage.steps_of(tag)),
            damage=damage.messages_for(tag, (histogram_tag, f"its histograms ({histogram_tag!r})"),
                                  (epochs_tag, f"its epoch marks ({epochs_tag!r})"))
            + ((mismatch,) if mismatch else ()),
            long_run=long_run,
        )

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
                epochs_refused = (refusal_message(
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
            damage=((refusal_message(refused, refusals),) if refused else ())
            + epochs_refused
            + damage.messages_for(tag, (histogram_tag, f"its histograms ({histogram_tag!r})"),
                                  (epochs_tag, f"its epoch marks ({epochs_tag!r})"))
            + ((mismatch,) if mismatch else ()),
        )

    def _long_points(self, run, tag, parsed):
        """Where the points of stats tag ``tag`` lie (`integrity.Located`) when it is a long
        run of a local logdir (`long_runs.is_long`); None otherwise."""
        located = self._integrity.located(run, tag)
        layout = parsed.layout
        if located is None or not is_long(len(located.steps), len(layout.variables),
                                          len(layout.stats)):
            return None
        return located

    def _updated_long_run(self, run, tag, parsed, located, epochs_parsed):
        """(the `LongRun` of a tag, updated with its points and epoch marks; the marks as
        ``(first steps, epoch indices)`` or None)."""
        with self._lock:
            long_run = self._long_runs.pop((run, tag), None)
            if long_run is None or long_run.parsed != parsed:
                long_run = LongRun(run, tag, parsed)
            self._long_runs[(run, tag)] = long_run
            while len(self._long_runs) > MAX_LONG_RUNS:
                self._long_runs.pop(next(iter(self._long_runs)))
        marks = None
        epochs_tag = metadata.epochs_tag(parsed.name)
        epochs = None if epochs_parsed is None else self._integrity.located(run, epochs_tag)
        if epochs is not None and len(epochs.steps):
            points = zip(epochs.steps.tolist(), epochs.wall_times.tolist(), epochs.locations)
            decoded = reader.read_back(epochs_tag, epochs_parsed, points, long_run.lost_point)
            decoded = [p for p in decoded if np.isfinite(p[2])]  # a NaN mark marks nothing
            marks = (np.array([p[0] for p in decoded], np.int64),
                     np.array([int(p[2]) for p in decoded], np.int64))
        written = (self._integrity.located(run, metadata.digest_tag(tag)),
                   self._integrity.located(run, metadata.digest_blocks_tag(tag)))
        long_run.update(located, marks, None if None in written else written)
        return long_run, marks

    def histogram_near(self, ctx, experiment, run: str, tag: str, step: int,
                       tags=None) -> "HistogramAt":
        """The histograms logged next to a stats tag at the logged step nearest ``step`` (ties:
        the earlier), their rows its variables; `UnknownError` if none were, or they are left
        out (`reader.histograms_mismatch`). A long tag's (`long_runs`) is read from its record
        alone; others from the whole histograms, kept."""
        tags = self.tags(ctx, experiment) if tags is None else tags
        info = self.stats_tag(tags, run, tag)
        histogram_tag = metadata.histogram_tag(tag)
        if self._long_points(run, tag, info.parsed) is not None:
            histogram_info = self._histograms_info(tags, run, tag)
            where = self._integrity.located(run, histogram_tag)
            left_out = self._integrity.run(run).steps_of(histogram_tag)
            kept = [i for i, s in enumerate(where.steps.tolist()) if s not in left_out]
            if not kept:
                raise UnknownError(f"no histograms were logged for run {run!r}, tag {tag!r}")
            steps = where.steps[kept]
            index = nearest_index(steps, step)
            point = where.steps[kept[index]], where.wall_times[kept[index]], where.locations[
                kept[index]]
            lost = []
            read = reader.read_back(histogram_tag, histogram_info.parsed, [point],
                                    lambda *report: lost.append(report[-1]))
            if lost:
                raise UnreadableTagError(run, histogram_tag, lost[0])
            return HistogramAt(steps, index, float(point[1]), read[0][2],
                               histogram_info.parsed.log10_edges, histogram_info.parsed.bins)
        histograms = self._histograms(ctx, experiment, run, tag, tags)
        index = nearest_index(histograms.steps, step)
        return HistogramAt(histograms.steps, index, float(histograms.wall_times[index]),
                           histograms.counts[index], histograms.log10_edges,
                           histograms.bin_labels)

    def _histograms_info(self, tags, run: str, tag: str) -> TagInfo:
        """The `TagInfo` of the histograms next to stats tag ``tag`` (`UnknownError`)."""
        histogram_tag = metadata.histogram_tag(tag)
        info, mismatch = _histograms_next_to(tags, run, tag)
        if info is None:
            if mismatch:
                raise UnknownError(f"run {run!r}, tag {tag!r}: {mismatch}")
            logged = tags[run].get(histogram_tag)
            why = f" that can be read ({logged.error})" if logged and logged.error else ""
            raise UnknownError(f"no histograms{why} were logged for run {run!r}, tag {tag!r}")
        return info

    def _histograms(self, ctx, experiment, run: str, tag: str, tags) -> GradientHistograms:
        """The whole histograms logged next to a stats tag, read through TensorBoard."""
        info = self._histograms_info(tags, run, tag)
        histogram_tag = metadata.histogram_tag(tag)
        left_out = self._integrity.run(run).steps_of(histogram_tag)
        signature = (info.signature, left_out)
        key = ("histograms", experiment, run, tag)
        cached = self._cache.get(key, signature)
        if cached is not None:
            return cached
        with _unreadable_as_error(run, histogram_tag):
            points, _, _ = self._read(ctx, experiment, run, histogram_tag, info.parsed)
            histograms = histograms_from_points(
                run, histogram_tag, info.parsed, _without_steps(points, left_out)
            )
        if histograms is None:
            raise UnknownError(f"no histograms were logged for run {run!r}, tag {tag!r}")
        self._cache.put(key, histograms, signature, histograms.counts.nbytes)
        return histograms

    def analysis(self, loaded: Loaded, thresholds: analysis.Thresholds) -> analysis.Analysis:
        """`analysis.analyze` of a loaded series: classes and alerts (memoised per thresholds)."""
        def analyze():
            with _unreadable_as_error(loaded.series.run, loaded.series.tag):
                return analysis.analyze(loaded.series, thresholds)

        return self.memo(loaded, ("analysis", thresholds), analyze)

    def memo(self, loaded: Loaded, key: tuple, compute):
        """``compute()`` once per ``key`` for as long as this loaded series is current."""
        return self._cache.derived(loaded.derived, key, compute)

    def _read(self, ctx, experiment, run, tag, parsed):
        """(points as (step, wall_time, ndarray or None if refused), why sampled or None,
        refusal reasons)."""
        expected = expected_shape(parsed)
        refusals = collections.Counter()

        def read(downsample):
            with decoding_as(expected, refusals):
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


@dataclasses.dataclass(frozen=True)
class HistogramAt:
    """The histograms of one logged step (`GradientData.histogram_near`)."""

    steps: np.ndarray  # every logged step with histograms
    index: int  # this one's position in ``steps``
    wall_time: float
    counts: np.ndarray  # [variables, bins]
    log10_edges: Tuple[float, ...]
    bin_labels: Tuple[str, ...]


def nearest_index(steps: np.ndarray, step: int) -> int:
    """The index of the logged step nearest ``step`` in sorted ``steps`` (ties: the earlier),
    in Python integers: int64 arithmetic would overflow for steps far apart."""
    after = int(np.searchsorted(steps, step))
    candidates = [i for i in (after - 1, after) if 0 <= i < len(steps)]
    return min(candidates, key=lambda i: (abs(int(steps[i]) - step), i))


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
