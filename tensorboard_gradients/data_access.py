"""Gradient series read through TensorBoard's data provider, cached until the run changes.

The plugin's only way to the data (works with both loaders). Every route needs whole series
(classes depend on each variable's history, merged columns must see every step), so a series is
read once and kept, keyed by the tag's ``(max_step, max_wall_time)`` from the cheap
``list_tensors`` call: a run that stopped changing is never read twice, a run still training is
re-read when it grew.
"""

import collections
import dataclasses
import logging
import threading
from typing import Dict, Optional

import numpy as np
from tensorboard.data import provider

from tensorboard_gradients import analysis, metadata, reader

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


@dataclasses.dataclass(frozen=True)
class TagInfo:
    parsed: Optional[metadata.PluginData]  # None when unreadable (see `error`)
    signature: tuple
    error: Optional[str] = None


@dataclasses.dataclass
class Loaded:
    """One cached series and what was derived from it."""

    series: reader.GradientSeries
    sampled: Optional[str]  # why not every logged step is present, or None
    # What routes derived from it (classes, alerts, encoded heatmaps), by a key naming the
    # derivation and its parameters; the newest few are kept.
    derived: "collections.OrderedDict[tuple, object]" = dataclasses.field(
        default_factory=collections.OrderedDict
    )


def _too_big_for_grpc(error) -> bool:
    code = getattr(error, "code", None)
    return callable(code) and getattr(code(), "name", "") == "RESOURCE_EXHAUSTED"


class GradientData:
    """Lists and loads the plugin's tags for one TensorBoard (thread-safe)."""

    def __init__(self, data_provider, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self._provider = data_provider
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
                result.setdefault(run, {})[tag] = info
        return result

    def stats_tag(self, tags, run: str, tag: str) -> TagInfo:
        """The `TagInfo` of a stats tag; `UnknownError` / `ValueError` (unreadable format)."""
        info = tags.get(run, {}).get(tag)
        if info is None:
            if run not in tags:
                raise UnknownError(f"no gradients for run {run!r}")
            raise UnknownError(f"no gradients tag {tag!r} in run {run!r}")
        if info.error:
            raise ValueError(f"run {run!r}, tag {tag!r}: {info.error}")
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
        signature = info.signature + (epochs_info.signature if epochs_info else None,)
        key = ("series", experiment, run, tag)
        cached = self._cached(key, signature)
        if cached is not None:
            return cached
        points, sampled = self._read(ctx, experiment, run, tag, info.parsed)
        epoch_points = ()
        if epochs_info is not None:
            epoch_points, _ = self._read(ctx, experiment, run, epochs_tag, epochs_info.parsed)
        loaded = Loaded(
            series=reader.series_from_points(run, tag, info.parsed, points, epoch_points),
            sampled=sampled,
        )
        self._store(key, loaded, signature, loaded.series.values.nbytes)
        return loaded

    def histograms(self, ctx, experiment, run: str, tag: str, tags=None):
        """The `GradientHistograms` logged next to a stats tag; `UnknownError` if there are none."""
        tags = self.tags(ctx, experiment) if tags is None else tags
        self.stats_tag(tags, run, tag)
        histogram_tag = metadata.histogram_tag(tag)
        info = tags[run].get(histogram_tag)
        if info is None or info.parsed is None:
            raise UnknownError(f"no histograms were logged for run {run!r}, tag {tag!r}")
        key = ("histograms", experiment, run, tag)
        cached = self._cached(key, info.signature)
        if cached is not None:
            return cached
        points, _ = self._read(ctx, experiment, run, histogram_tag, info.parsed)
        histograms = reader.histograms_from_points(run, histogram_tag, info.parsed, points)
        if histograms is None:
            raise UnknownError(f"no histograms were logged for run {run!r}, tag {tag!r}")
        self._store(key, histograms, info.signature, histograms.counts.nbytes)
        return histograms

    def analysis(self, loaded: Loaded, thresholds: analysis.Thresholds) -> analysis.Analysis:
        """`analysis.analyze` of a loaded series: classes and alerts (memoised per thresholds)."""
        return self.memo(loaded, ("analysis", thresholds),
                         lambda: analysis.analyze(loaded.series, thresholds))

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
        """(points as (step, wall_time, ndarray), why sampled or None)."""

        def read(downsample):
            result = self._provider.read_tensors(
                ctx,
                experiment_id=experiment,
                plugin_name=metadata.PLUGIN_NAME,
                downsample=downsample,
                run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]),
            )
            return [(d.step, d.wall_time, d.numpy) for d in result.get(run, {}).get(tag, ())]

        try:
            return read(_ALL_POINTS), None
        except Exception as error:  # noqa: BLE001 - only the gRPC size error is handled
            if not _too_big_for_grpc(error):
                raise
        # float32 statistics (float64 ones when a gradient was float64: then halve again).
        point_bytes = 4 * max(1, int(np.prod(reader.expected_shape(parsed))))
        kept = max(1, _SAMPLED_READ_BYTES // point_bytes)
        while True:
            logger.warning(
                "run %r tag %r exceeds the data server's %d MiB per-read limit; reading %d "
                "sampled steps", run, tag, _GRPC_MESSAGE_LIMIT >> 20, kept,
            )
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
        )

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


@dataclasses.dataclass(frozen=True)
class _Entry:
    value: object
    signature: tuple
    nbytes: int
