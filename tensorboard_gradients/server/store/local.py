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
from tensorboard_gradients.format.series import GradientSeries, series_from_points
from tensorboard_gradients.server.store import traffic
from tensorboard_gradients.server.store.damage import RunDamage
from tensorboard_gradients.server.store.event_scan import EventFileIntegrity, Located
from tensorboard_gradients.server.store.local_tag import LocalTag, is_long
from tensorboard_gradients.server.store.source import (
    HistogramAt, RunSource, TagInfo, UnknownError, UnreadableTagError, nearest_index,
    parsed_info,
)

logger = logging.getLogger(__name__)

_DEFAULTS = analysis.Thresholds()


class LocalSource(RunSource):
    """One stats tag of a local run as it stands now: its `LocalTag` (kept across looks, it
    grows with the run), the damage found in its run's files, and where its histograms lie."""

    def __init__(self, local_tag: LocalTag, like: GradientSeries, damage: RunDamage,
                 histograms: Optional[Tuple[metadata.PluginData, Located]],
                 mismatch: Optional[str]):
        super().__init__(like)
        self._local_tag = local_tag
        self._run_damage = damage
        self._histograms = histograms
        self._mismatch = mismatch
        self._long = is_long(len(local_tag.steps), len(like.variables), len(like.stat_names))

    def steps(self) -> np.ndarray:
        return self._local_tag.steps

    def rows(self, start: int, stop: int) -> GradientSeries:
        return self._local_tag.rows(start, stop)

    def reading(self, thresholds: analysis.Thresholds):
        # A short tag is read by the request (well under a second); a long one's default digest
        # may be fed in the background meanwhile: the answer then says how far it got.
        return self._local_tag.reading(thresholds, wait=not self._long or thresholds != _DEFAULTS)

    def progress(self, thresholds: analysis.Thresholds) -> int:
        return self._local_tag.progress(thresholds,
                                        wait=not self._long or thresholds != _DEFAULTS)

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
        left_out = self._run_damage.steps_of(histogram_tag)
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
        lost_steps, lost_messages = self._local_tag.lost_report()
        messages = (self._run_damage.messages_for(
            tag, (histogram_tag, f"its histograms ({histogram_tag!r})"),
            (epochs_tag, f"its epoch marks ({epochs_tag!r})"))
            + ((self._mismatch,) if self._mismatch else ()) + lost_messages)
        return len(self._run_damage.steps_of(tag)) + lost_steps, messages


class LocalReader:
    """Lists and reads this plugin's tags of a local logdir from its event files (thread-safe).

    ``kept_bytes``: what the digests of the tags kept between requests may hold (least recently
    used first out; the newest always stays)."""

    def __init__(self, scan: EventFileIntegrity, kept_bytes: int):
        self._scan = scan
        self._kept_bytes = kept_bytes
        self._tags: "collections.OrderedDict[Tuple[str, str], LocalTag]" = (
            collections.OrderedDict())
        self._marks = {}  # (run, epochs tag) -> (located look, marks)
        self._lock = threading.Lock()

    def tags(self) -> Dict[str, Dict[str, TagInfo]]:
        """``{run: {tag: TagInfo}}`` of every tag of this plugin in the logdir, any kind, and
        every run with an event file (a run of only unreadable files has no tags)."""
        result = {}
        for run in self._scan.runs():
            result[run] = {tag: _parsed(content)
                           for tag, content in self._scan.contents(run).items()}
        return result

    def unreadable_files(self, run: str) -> Tuple[str, ...]:
        """Sentences on what the run holds named like an event file that is not one."""
        return self._scan.run(run).file_messages

    def like(self, run: str, tag: str, parsed: metadata.PluginData,
             epochs: Optional[metadata.PluginData]) -> GradientSeries:
        """The tag's series without steps, with its epoch marks."""
        marks = None if epochs is None else self.marks(run, metadata.epochs_tag(parsed.name),
                                                       epochs)
        like = _empty_series(run, tag, parsed)
        if marks is None:
            return like
        return dataclasses.replace(like, epoch_starts=marks[0], epoch_indices=marks[1])

    def located(self, run: str, tag: str) -> Located:
        located = self._scan.located(run, tag)
        if located is None:
            raise UnknownError(f"no gradients for run {run!r}")
        return located

    def marks(self, run: str, epochs_tag: str, parsed: metadata.PluginData):
        """``(first steps, epoch indices)`` of the run's epoch marks (a NaN mark marks nothing),
        read back once per look at the files."""
        where = self._scan.located(run, epochs_tag)
        if where is None or not len(where.steps):
            return None
        with self._lock:
            kept = self._marks.get((run, epochs_tag))
        if kept is not None and kept[0] == where.look:
            return kept[1]
        points = zip(where.steps.tolist(), where.wall_times.tolist(), where.locations)
        decoded = reader.read_back(epochs_tag, parsed, points, lambda *report: None)
        decoded = [p for p in decoded if np.isfinite(p[2])]
        marks = (np.array([p[0] for p in decoded], np.int64),
                 np.array([int(p[2]) for p in decoded], np.int64))
        with self._lock:
            self._marks[(run, epochs_tag)] = (where.look, marks)
        return marks

    def signature(self, run: str, tag: str, parsed: metadata.PluginData) -> tuple:
        """What a `LocalSource` of the tag was built from: it is built again when this changes."""
        located = self.located(run, tag)
        others = [self._scan.located(run, name) for name in (
            metadata.epochs_tag(parsed.name), metadata.histogram_tag(tag),
            metadata.digest_tag(tag), metadata.digest_blocks_tag(tag))]
        damage = self._scan.run(run)
        return (located.look,) + tuple(None if o is None else o.look for o in others) + (
            damage.signature(tag, metadata.epochs_tag(parsed.name),
                             metadata.histogram_tag(tag)),)

    def source(self, run: str, tag: str, parsed: metadata.PluginData,
               epochs: Optional[metadata.PluginData],
               histograms: Optional[metadata.PluginData], mismatch: Optional[str]) -> LocalSource:
        """The tag as it stands now, its `LocalTag` brought up to date."""
        local_tag, like = self._updated(run, tag, parsed, epochs)
        where = None if histograms is None else self._scan.located(
            run, metadata.histogram_tag(tag))
        return LocalSource(local_tag, like, self._scan.run(run),
                           None if where is None else (histograms, where), mismatch)

    def _updated(self, run: str, tag: str, parsed, epochs) -> Tuple[LocalTag, GradientSeries]:
        """(the tag's `LocalTag`, given its points, epoch marks and the writer's digest records
        as the files hold them now; the tag's series without steps)."""
        like = self.like(run, tag, parsed, epochs)
        local_tag = self._kept(run, tag, parsed)
        written = (self._scan.located(run, metadata.digest_tag(tag)),
                   self._scan.located(run, metadata.digest_blocks_tag(tag)))
        marks = None if like.epoch_starts is None else (like.epoch_starts, like.epoch_indices)
        local_tag.update(self.located(run, tag), marks, None if None in written else written)
        return local_tag, like

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
        """``(run, tag, parsed, epochs parsed)`` of every long stats tag (`local_tag.is_long`)."""
        for run, tags in self.tags().items():
            for tag, info in tags.items():
                parsed = info.parsed
                if parsed is None or parsed.kind != metadata.KIND_STATS:
                    continue
                located = self._scan.located(run, tag)
                if located is None or not is_long(len(located.steps), len(parsed.layout.variables),
                                                  len(parsed.layout.stats)):
                    continue
                epochs = tags.get(metadata.epochs_tag(parsed.name))
                epochs = epochs.parsed if epochs is not None and epochs.parsed is not None and (
                    epochs.parsed.kind == metadata.KIND_EPOCHS) else None
                yield run, tag, parsed, epochs

    def digest_long_tags(self):
        """Brings the default digest of every long tag up to date, as TensorBoard reads the
        logdir: the first heatmap and alerts of a long run then answer at once, and each pass
        reads only the steps logged since the last."""
        for run, tag, parsed, epochs in self.long_tags():
            try:
                if self.has_room(run, tag):
                    self._updated(run, tag, parsed, epochs)[0].digest(_DEFAULTS, background=True)
            except Exception:  # noqa: BLE001 - one tag must not stop the others
                if traffic.exiting():
                    return
                logger.exception("run %r tag %r could not be digested", run, tag)

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


# A run list of 2,000 tags parses each distinct metadata once.
_parsed = functools.lru_cache(maxsize=4096)(parsed_info)


@functools.lru_cache(maxsize=4096)
def _empty_series(run: str, tag: str, parsed: metadata.PluginData) -> GradientSeries:
    return series_from_points(run, tag, parsed, ())
