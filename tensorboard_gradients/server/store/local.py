"""`LocalSource`: a stats tag of a local logdir, read by the plugin from its event files.

For a local logdir the plugin reads every tag of its own (`LocalReader`), so both loaders show
the same steps: a record failing its checksum costs its own step only (TensorBoard's Python
loader stops reading the file there, its Rust loader serves the wrong values), every writer's
steps show when two wrote the same run, anything named like an event file that is not a regular
file (a FIFO, a socket) is reported and skipped without hiding other runs, and the runs list
comes from the plugin's own scan (`event_scan`: each file scanned once, then its new bytes).
TensorBoard is told to keep a single point of this plugin's tags (`plugin.GradientsLoader`).

Each tag's steps are located from their records' first bytes and read back a few thousand at a
time (`local_tag.LocalTag`, which keeps its digest up to date as the run grows, in the
background for long runs); the tags kept are bounded by the bytes of their digests.
"""

import collections
import dataclasses
import functools
import logging
import threading
import time
from typing import Dict, Optional, Tuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.format import metadata, reader
from tensorboard_gradients.format.series import GradientSeries, loss_curve, series_from_points
from tensorboard_gradients.server.store import traffic
from tensorboard_gradients.server.store.event_scan import EventFileIntegrity, Located, RunLook
from tensorboard_gradients.server.store.local_tag import LocalTag, is_long
from tensorboard_gradients.server.store.source import (
    HistogramAt, RunSource, TagInfo, UnknownError, UnreadableTagError, nearest_index,
    parsed_content,
)

logger = logging.getLogger(__name__)

_DEFAULTS = analysis.Thresholds()


class LocalSource(RunSource):
    """One stats tag of a local run as one look at its files found it. Its `LocalTag` (kept
    across looks: it grows with the run) is brought up to date when an answer first reads
    steps: listing the runs reads none."""

    def __init__(self, reader: "LocalReader", look: RunLook, like: GradientSeries,
                 parsed: metadata.PluginData,
                 histograms: Optional[Tuple[metadata.PluginData, Located]],
                 mismatch: Optional[str]):
        super().__init__(like)
        self._reader, self._look, self._parsed = reader, look, parsed
        self._located = look.located(like.tag)
        self._histograms = histograms
        self._mismatch = mismatch
        self._local_tag: Optional[LocalTag] = None
        self._lock = threading.Lock()
        self._long = is_long(len(self._located.steps), len(like.variables),
                             len(like.stat_names))

    def _tag(self) -> LocalTag:
        with self._lock:
            if self._local_tag is None:
                self._local_tag = self._reader.updated(self._look, self.like, self._parsed)
            return self._local_tag

    def steps(self) -> np.ndarray:
        return self._tag().steps if self._local_tag is not None else self._located.steps

    def rows(self, start: int, stop: int) -> GradientSeries:
        return self._tag().rows(start, stop)

    def reading(self, thresholds: analysis.Thresholds):
        # A short tag is read by the request (well under a second); a long one's default digest
        # may be fed in the background meanwhile: the answer then says how far it got.
        return self._tag().reading(thresholds, wait=not self._long or thresholds != _DEFAULTS)

    def progress(self, thresholds: analysis.Thresholds) -> int:
        return self._tag().progress(thresholds, wait=not self._long or thresholds != _DEFAULTS)

    @property
    def has_histograms(self) -> bool:
        return self._histograms is not None

    def histogram_near(self, step: int) -> HistogramAt:
        """Read from the one record of that step (a long run's histograms are never held)."""
        if self._histograms is None:
            why = f": {self._mismatch}" if self._mismatch else ""
            raise UnknownError(f"no histograms were logged for run {self.run!r}, tag "
                               f"{self.tag!r}{why}")
        parsed, where = self._histograms
        histogram_tag = metadata.histogram_tag(self.tag)
        left_out = self._look.damage().steps_of(histogram_tag)
        kept = [i for i, s in enumerate(where.steps.tolist()) if s not in left_out]
        if not kept:
            raise UnknownError(f"no histograms were logged for run {self.run!r}, tag "
                               f"{self.tag!r}")
        steps = where.steps[kept]
        index = nearest_index(steps, step)
        point = (where.steps[kept[index]], where.wall_times[kept[index]],
                 where.locations[kept[index]])
        lost = []
        read = reader.read_back(histogram_tag, parsed, [point],
                                lambda *report: lost.append(report[-1]))
        if lost:
            raise UnreadableTagError(self.run, histogram_tag, lost[0])
        return HistogramAt(steps, index, float(point[1]), read[0][2], parsed.log10_edges,
                           parsed.bins)

    def damage(self):
        tag = self.tag
        epochs_tag = metadata.epochs_tag(self.like.name)
        histogram_tag = metadata.histogram_tag(tag)
        run_damage = self._look.damage()
        lost_steps, lost_messages = self._reader.lost(self.run, tag)
        messages = (run_damage.messages_for(
            tag, (histogram_tag, f"its histograms ({histogram_tag!r})"),
            (epochs_tag, f"its epoch marks ({epochs_tag!r})"))
            + ((self._mismatch,) if self._mismatch else ()) + lost_messages)
        return len(run_damage.steps_of(tag)) + lost_steps, messages


class LocalReader:
    """Lists and reads this plugin's tags of a local logdir from its event files (thread-safe).

    ``kept_bytes``: what the digests of the tags kept between requests may hold (least recently
    used first out; the newest always stays)."""

    def __init__(self, scan: EventFileIntegrity, kept_bytes: int):
        self._scan = scan
        self._kept_bytes = kept_bytes
        self._tags: "collections.OrderedDict[Tuple[str, str], LocalTag]" = (
            collections.OrderedDict())
        self._kept_marks = {}  # (run directory, epochs or loss tag) -> (its look, what it holds)
        self._lock = threading.Lock()

    def tags(self, runs=None) -> Dict[str, Dict[str, TagInfo]]:
        """``{run: {tag: TagInfo}}`` of every tag of this plugin in the logdir (or in ``runs``),
        any kind, each with the look at its run's files it was listed from (`TagInfo.look`):
        the run's sources are built from that same look, each file scanned once."""
        result = {}
        for run in self._scan.runs() if runs is None else runs:
            look = self._scan.look(run)
            if look is None:
                continue
            result[run] = {tag: dataclasses.replace(parsed_content(content), look=look)
                           for tag, content in look.contents().items()}
        return result

    def _like(self, look, tag: str, parsed: metadata.PluginData,
              epochs: Optional[metadata.PluginData]) -> GradientSeries:
        """The tag's series without steps, with its epoch marks."""
        like = _empty_series(look.run, tag, parsed)
        marks = None if epochs is None else self._marks(look, metadata.epochs_tag(parsed.name),
                                                        epochs)
        if marks is None:
            return like
        return dataclasses.replace(like, epoch_starts=marks[0], epoch_indices=marks[1])

    def _marks(self, look, epochs_tag: str, parsed: metadata.PluginData):
        """``(first steps, epoch indices)`` of the run's epoch marks (a NaN mark marks nothing),
        read back once per look at the files that changed them."""
        where = look.located(epochs_tag)
        if not len(where.steps):
            return None

        def read(points):
            decoded = reader.read_back(epochs_tag, parsed, points, lambda *report: None)
            decoded = [p for p in decoded if np.isfinite(p[2])]
            return (np.array([p[0] for p in decoded], np.int64),
                    np.array([int(p[2]) for p in decoded], np.int64))

        return self._per_look(look, epochs_tag, where, read)

    def _per_look(self, look, tag: str, where: Located, read):
        """``read(points)`` of the tag's points ``where``, kept until a look at the files finds
        them changed."""
        key = (look.directory, tag)
        with self._lock:
            kept = self._kept_marks.get(key)
        if kept is not None and kept[0] == where.look:
            return kept[1]
        value = read(zip(where.steps.tolist(), where.wall_times.tolist(), where.locations))
        with self._lock:
            self._kept_marks[key] = (where.look, value)
        return value

    def _loss(self, look, name: str):
        """``(curve, source)`` of the run's loss for summary name ``name``
        (`series.loss_curve`): its ``<name>_loss`` tag, else the first of the run's own loss
        scalars (`metadata.LOSS_SCALARS`) logged; None. Read back once per look at the files
        that changed it."""
        loss_tag = metadata.loss_tag(name)
        parsed = parsed_content(look.contents().get(loss_tag, b"")).parsed

        def has_points(tag):
            if tag == loss_tag and (parsed is None or parsed.kind != metadata.KIND_LOSS):
                return False
            return bool(len(look.located(tag).steps))

        tag = metadata.loss_source(name, has_points)
        if tag is None:
            return None
        return self._per_look(look, tag, look.located(tag), functools.partial(
            self._read_loss, look.run, tag, parsed if tag == loss_tag else None))

    @staticmethod
    def _read_loss(run: str, tag: str, parsed: Optional[metadata.PluginData], points):
        """``(curve, tag)`` of the loss tag (``parsed``: its metadata) or the loss scalar
        (``parsed`` None) ``tag``."""
        decoded = (reader.read_back(tag, parsed, points, lambda *report: None)
                   if parsed is not None else reader.read_back_scalars(tag, points))
        return loss_curve(run, tag, decoded), tag

    @staticmethod
    def signature(info: TagInfo) -> tuple:
        """What a `LocalSource` of the tag is built from (the look at its run's files): it is
        built again when the files change."""
        return (info.look.number,)

    def source(self, run: str, tag: str, info: TagInfo, epochs: Optional[metadata.PluginData],
               histograms: Optional[metadata.PluginData], mismatch: Optional[str]) -> LocalSource:
        """The tag as its listing's look at the files found it (nothing read yet)."""
        look = info.look
        where = None if histograms is None else look.located(metadata.histogram_tag(tag))
        return LocalSource(self, look, self._like(look, tag, info.parsed, epochs), info.parsed,
                           None if where is None else (histograms, where), mismatch)

    def updated(self, look: RunLook, like: GradientSeries, parsed) -> LocalTag:
        """The tag's `LocalTag`, given its points, epoch marks (``like``'s) and the writer's
        digest records as the files held them at ``look``."""
        tag = like.tag
        local_tag = self._kept(look.run, tag, parsed)
        written = (look.located(metadata.digest_tag(tag)),
                   look.located(metadata.digest_blocks_tag(tag)))
        marks = None if like.epoch_starts is None else (like.epoch_starts, like.epoch_indices)
        local_tag.update(look.located(tag), marks, written, self._loss(look, like.name))
        return local_tag

    def lost(self, run: str, tag: str):
        """(steps of the tag left out when read back, the sentences that say why): known once
        read."""
        with self._lock:
            local_tag = self._tags.get((run, tag))
        return (0, ()) if local_tag is None else local_tag.lost_report()

    def _kept(self, run: str, tag: str, parsed) -> LocalTag:
        with self._lock:
            local_tag = self._tags.pop((run, tag), None)
            if local_tag is None or local_tag.parsed != parsed:
                local_tag = LocalTag(run, tag, parsed)
            self._tags[(run, tag)] = local_tag
            while (len(self._tags) > 1
                   and sum(kept.nbytes() for kept in self._tags.values()) > self._kept_bytes):
                self._tags.popitem(last=False)
        return local_tag

    def has_room(self, run: str, tag: str) -> bool:
        """Whether the tag is kept, or there is room to keep one more: past that, requests
        choose which stay (a background pass over more would read each again every time)."""
        with self._lock:
            return ((run, tag) in self._tags
                    or sum(kept.nbytes() for kept in self._tags.values()) < self._kept_bytes)

    def long_tags(self):
        """``(look, tag, parsed, epochs parsed)`` of every long stats tag (`local_tag.is_long`)."""
        for run, tags in self.tags().items():
            for tag, info in tags.items():
                parsed = info.parsed
                if parsed is None or parsed.kind != metadata.KIND_STATS:
                    continue
                located = info.look.located(tag)
                if not is_long(len(located.steps), len(parsed.layout.variables),
                               len(parsed.layout.stats)):
                    continue
                epochs = tags.get(metadata.epochs_tag(parsed.name))
                epochs = epochs.parsed if epochs is not None and epochs.parsed is not None and (
                    epochs.parsed.kind == metadata.KIND_EPOCHS) else None
                yield info.look, tag, parsed, epochs

    def long_local_tag(self, look: RunLook, tag: str, parsed, epochs) -> Optional[LocalTag]:
        """A long tag's `LocalTag` brought up to date, when it is kept or there is room for it
        (`has_room`), else None."""
        if not self.has_room(look.run, tag):
            return None
        return self.updated(look, self._like(look, tag, parsed, epochs), parsed)

    def digest_long_tags(self):
        """Brings the default digest of every long tag up to date, as TensorBoard reads the
        logdir: the first heatmap and alerts of a long run then answer at once, and each pass
        reads only the steps logged since the last."""
        for look, tag, parsed, epochs in self.long_tags():
            try:
                local_tag = self.long_local_tag(look, tag, parsed, epochs)
                if local_tag is not None:
                    local_tag.digest(_DEFAULTS, background=True)
            except Exception:  # noqa: BLE001 - one tag must not stop the others
                if traffic.exiting():
                    return
                logger.exception("run %r tag %r could not be digested", look.run, tag)

    def digest_every(self, every: float):
        """Starts `digest_long_tags` in a background thread, every ``every`` seconds (0: once);
        a failure is logged and tried again next time."""
        def loop():
            while True:
                try:
                    self.digest_long_tags()
                except Exception:  # noqa: BLE001 - a background thread must not die of one run
                    if traffic.exiting():
                        return
                    logger.exception("tensorboard-gradients could not digest the long runs")
                if not every:
                    return
                time.sleep(every)

        threading.Thread(target=loop, daemon=True, name="tensorboard-gradients digests").start()


@functools.lru_cache(maxsize=4096)
def _empty_series(run: str, tag: str, parsed: metadata.PluginData) -> GradientSeries:
    return series_from_points(run, tag, parsed, ())
