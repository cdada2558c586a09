"""`LocalTag`: one stats tag of a local logdir, read by the plugin from its event files a few
thousand steps at a time, and kept up to date as the run grows.

The routes answer from its `analysis.digest.Digest` (classes, alerts, per-block heatmap groups)
and from the rows a view asks for, read back from their records
(`event_scan.EventFileIntegrity.located`). A short tag is digested by the request that asks; a
long one (`is_long`: more than `LONG_RUN_STEPS` logged steps or `LONG_RUN_BYTES` of statistics)
in the background too, as TensorBoard reads the logdir, and its answers say how many steps are
still to read under the default thresholds.

A run whose writer kept its digest (`format.digest_feed`) opens from those records
(`Digest.restored`): answers under the default thresholds come from them at once, and while
they cover every located step nothing is judged again. Steps after them (a live writer's
latest steps, a restarted job's in another file) are judged from where the records leave off
(`Digest.continued`: they hold the analysis' state), by the request that finds them when they
are few (`CONTINUE_IN_REQUEST_STEPS`), else in the background, answering from the writer's
digest meanwhile and saying how many steps are still to read. A run written without a digest,
or whose records cannot be taken up, is digested by the plugin from its first step, in the
background; a digest fed step by step takes the steps that follow at the cost of those steps
alone.
"""

import concurrent.futures
import contextlib
import logging
import threading

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.format import metadata, reader, segments, wire
from tensorboard_gradients.format.series import GradientSeries, series_from_points, with_loss
from tensorboard_gradients.analysis.digest import MAX_BLOCKS, Digest, chained
from tensorboard_gradients.server.store import traffic

logger = logging.getLogger(__name__)

# A tag with more logged steps than this is digested in the background and answers before it is
# read whole (reading 1,000 steps of 1,000 variables takes about a second). A digest of up to
# 2,000 steps has a block per step, so the overview of a run just past it is still every step.
LONG_RUN_STEPS = 1000
# ... or with more statistics than this: reading and decoding that much per request is already
# seconds.
LONG_RUN_BYTES = 128 * 1024 * 1024
# At most this many steps after the writer's last digest record (a live writer's latest steps, a
# restarted job's first) are read by the request that finds them, going on from the writer's
# digest (~1 s per 4,000 steps of 1,000 variables); more are read in the background.
CONTINUE_IN_REQUEST_STEPS = 5000
# Steps read back and judged at a time while digesting (1,000 variables: ~45 MB; two such
# pieces are in flight, one read while the other is judged).
STEPS_PER_READ = 1000




def is_long(steps: int, variables: int, stats: int) -> bool:
    """Whether a tag of this size is read from its event files (float32 statistics)."""
    return steps > LONG_RUN_STEPS or steps * variables * stats * 4 > LONG_RUN_BYTES


class LocalTag:
    """One long stats tag of a local run (thread-safe).

    Args:
      run, tag: the tag.
      parsed: its `metadata.PluginData`.
    """

    def __init__(self, run: str, tag: str, parsed):
        self.run, self.tag, self.parsed = run, tag, parsed
        self.like: GradientSeries = series_from_points(run, tag, parsed, ())
        self.located = None  # event_scan.Located of the stats tag
        # event_scan.Located of the writer's digest records and of their blocks, or None
        self.written = None
        self._restored = None  # (what it was restored from, the writer's Digest or None)
        # Whether the plugin's own digest (defaults) went on from the writer's, then dropped;
        # and whether that failed (crafted records), until the run's steps change.
        self._taken_up = self._no_taking_up = False
        self.epoch_starts = self.epoch_indices = None
        self.loss = None  # (curve, source) of the run's loss (`LocalReader._loss`), or None
        self.lost = {}  # (path, message) of points left out when read back: None
        self._lost_steps = set()  # their steps
        self._kept_rows = None  # (located, start, stop, rows) of the last `rows`
        # thresholds -> (Digest, located steps fed to it); the defaults' and at most one other
        self._digests = {}
        self._lock = threading.RLock()  # the state above and every digest's
        self._feeding = threading.Lock()  # held by the one thread feeding digests
        self._restoring = threading.Lock()  # held by the one thread reading the writer's digest
        self._reader = None  # the thread reading every step (`_read_in_background`)

    @property
    def steps(self):
        return self.located.steps

    def update(self, located, epochs=None, written=None, loss=None):
        """Takes the tag's current points (`event_scan.Located`), epoch marks (``epochs``:
        ``(first steps, epoch indices)`` or None), the points of the writer's digest records
        (``written``, or None) and the run's loss (``(curve, source)``, or None). Digests grow
        by the new steps only; when the old steps changed (or an epoch mark appeared among
        them, or their loss changed) they are dropped, and rebuilt when next asked for.
        ``written``: (records, their blocks) located."""
        epoch_starts, epoch_indices = (None, None) if epochs is None else epochs
        with self._lock:
            old = self.located
            if old is not None and located.look < old.look:
                return  # an older look at the files than the one already taken
            self.written = written
            last_step = old.steps[-1] if old is not None and len(old.steps) else None
            grew = (old is not None and _extends(old, located)
                    and _same_marks(self.epoch_starts, epoch_starts, last_step)
                    and _same_loss(self.loss, loss, last_step))
            self.located = located
            self.epoch_starts, self.epoch_indices = epoch_starts, epoch_indices
            self.loss = loss
            if not grew:
                self._digests.clear()
                self._taken_up = self._no_taking_up = False
                self.lost.clear()
                self._lost_steps.clear()
            for digest, _ in self._digests.values():
                digest.set_epochs(epoch_starts, epoch_indices)

    def rows(self, start: int, stop: int) -> GradientSeries:
        """Logged steps ``start:stop`` read back from their records (a few thousand at most:
        ~44 KB each for 1,000 variables). The last rows read are kept while the tag is
        unchanged: the views of a short run ask for the same rows, one stat at a time."""
        with self._lock:
            located, kept = self.located, self._kept_rows
        if kept is not None and kept[0] is located and kept[1:3] == (start, stop):
            return kept[3]
        rows = self._rows_of(located, start, stop)
        with self._lock:
            self._kept_rows = (located, start, stop, rows)
        return rows

    def _rows_of(self, located, start: int, stop: int) -> GradientSeries:
        rows = reader.located_rows(self.run, self.tag, self.parsed, located, start, stop,
                                   self.lost_point)
        loss = self.loss
        if loss is not None:
            rows = with_loss(rows, *loss)
        asked = located.steps[start:stop]
        if len(rows.steps) < len(asked):
            with self._lock:
                self._lost_steps.update(np.setdiff1d(asked, rows.steps).tolist())
        return rows

    def lost_point(self, kind, tag, path, message):
        """Notes points of the run left out when read back (`reader.read_back`'s report)."""
        with self._lock:
            self.lost[(path, message)] = None

    def lost_report(self):
        """(logged steps left out when read back so far, the sentences that say why)."""
        with self._lock:
            return len(self._lost_steps), tuple(f"{message} ({path})"
                                                for path, message in self.lost)

    def nbytes(self) -> int:
        """About what it holds: per digest a byte per cell and blocks of 8 bytes per stat, and
        the last rows read."""
        with self._lock:
            if self.located is None:
                return 0
            steps, digests = len(self.located.steps), len(self._digests)
            rows = 0 if self._kept_rows is None else self._kept_rows[3].values.nbytes
        cells = len(self.like.variables) * steps
        blocks = len(self.like.variables) * min(steps, MAX_BLOCKS) * len(self.like.stat_names)
        return (cells + 8 * blocks) * digests + rows

    @contextlib.contextmanager
    def reading(self, thresholds: analysis.Thresholds, wait: bool = True,
                background: bool = False):
        """Yields ``(digest, steps not read into it yet)`` for answering, holding the lock so
        nothing changes it meanwhile. The digest is first fed up to the last step; unless
        ``wait`` is false and another thread (the background digest) is feeding it: then as it
        stands, and the answer says how much is still to read. The writer's digest answers
        when it covers every step (nothing is judged again); else, unless ``wait``, while it
        holds more steps than the plugin's own (which is then read in the background).
        ``background``: fed by a background thread, which lets requests go first
        (`traffic.REQUESTS`)."""
        written = self._written_digest(thresholds)
        if written is not None:
            with self._lock:
                own = self._digests.get(thresholds)
                read, total = (own[1] if own else 0), len(self.located.steps)
            if written.rows == total:
                yield written, 0  # the writer's digest covers every step: nothing to judge
                return
            # A few steps after the writer's: read now, going on from the writer's digest.
            if not wait and (total - written.rows > CONTINUE_IN_REQUEST_STEPS
                             or not self._continues(thresholds, written)):
                self._read_in_background(thresholds)
                if written.rows >= read:
                    yield written, total - written.rows
                    return
        with traffic.REQUESTS.waiting():
            fed = self._feeding.acquire(blocking=wait)
        try:
            if fed:  # holding it until answered: no other feed replaces this digest meanwhile
                self._feed(thresholds, background)
            with self._lock:
                digest, read = self._entry(thresholds)
                yield digest, len(self.located.steps) - read
        finally:
            if fed:
                self._feeding.release()

    def _read_in_background(self, thresholds):
        """Starts the plugin's own digest of every step, unless it is being read already: it
        answers once it has read every step, and takes a grown run's new steps only (the
        writer's digest cannot take steps that another writer wrote)."""
        with self._lock:
            if self._reader is None or not self._reader.is_alive():
                self._reader = threading.Thread(
                    target=self._read_logged, args=(thresholds,), daemon=True,
                    name="tensorboard-gradients long run")
                self._reader.start()

    def _read_logged(self, thresholds):
        try:
            self.digest(thresholds, background=True)
        except Exception:  # noqa: BLE001 - a background thread must not die silently
            if not traffic.exiting():
                logger.exception("run %r tag %r could not be digested", self.run, self.tag)

    def _written_digest(self, thresholds):
        """The writer's digest (`Digest.restored`) of the first located steps, under the
        default thresholds only, while the plugin's own has not read every step; None when
        there is none or its records do not match the steps located (another writer's steps,
        a step written again, a record lost)."""
        with self._lock:
            written, located, marks = self.written, self.located, self._marks()
            own = self._digests.get(thresholds)
            # The writer judged the loss it wrote beside the gradients, not a scalar of the run.
            if (thresholds != _DEFAULTS or written is None or not len(written[0].steps)
                    or (self.loss is not None
                        and self.loss[1] != metadata.loss_tag(self.parsed.name))
                    or (own is not None and (own[1] == len(located.steps) or self._taken_up))):
                self._restored = None  # the plugin's own digest (or none) answers from now on
                return None
        source = _source(written, marks)
        with self._restoring:  # one thread reads the records, the others wait for it
            restored = self._restored
            if restored is None or restored[0] != source:
                # Every answer waits for it: background work pauses meanwhile, as for them.
                with traffic.REQUESTS.answering():
                    restored = (source, self._restore(written, located, marks))
                self._restored = restored
        digest = restored[1]
        if digest is None or not _covers(digest, located):
            return None
        return digest

    def _restore(self, written, located, marks):
        """The writer's digest from its records, or None (why is logged)."""
        try:
            records = self._records(written)
            restored = Digest.restored(self.like, _DEFAULTS, records, located.wall_times,
                                       *marks)
        except Exception as error:  # noqa: BLE001 - whatever a crafted record does: read steps
            logger.info("run %r tag %r: the writer's digest is not used (%s); the plugin reads "
                        "the steps", self.run, self.tag, error)
            return None
        # The file and offset of each record, from the row after the one before it on.
        places = [(path, offset) for path, offset, _ in written[0].locations[:len(records)]]
        ends = np.cumsum([len(record["steps"]) for record in records])
        restored.sources = [(start, end, path, offset) for start, end, (path, offset)
                            in zip(np.append(0, ends[:-1]).tolist(), ends.tolist(), places)]
        return restored

    def _records(self, written):
        """The writer's records (decoded) at ``written`` (the records and their blocks
        located), those of the writer of the first step (a restarted job's follow), with the
        blocks read from the last record that wrote them all on
        (`analysis.digest.BLOCK_ARRAYS`). A record and its blocks are values of one event
        (`GradientWriter.write_digest`): each event is read once, for both."""
        records_at, blocks_at = written
        events = self._events(records_at.locations + blocks_at.locations)
        tag = metadata.digest_tag(self.tag)
        records = [metadata.decode_digest(self._payload(events, location, tag))
                   for location in records_at.locations]
        records = records[:chained(records, _DEFAULTS)]
        by_step = dict(zip(records_at.steps.tolist(), records))
        tag = metadata.digest_blocks_tag(self.tag)
        for step, location in zip(reversed(blocks_at.steps.tolist()),
                                  reversed(blocks_at.locations)):
            if step in by_step:
                blocks = metadata.decode_digest(self._payload(events, location, tag))
                by_step[step].update(blocks)
                if int(blocks["first_block"]) == 0:
                    break
        return records

    @staticmethod
    def _events(locations):
        """``{(path, offset): event bytes}`` of the intact records at ``locations`` (``(path,
        offset, value index)``), each record read once (from a bucket: together,
        `reader.located_records`)."""
        places = sorted({(path, offset) for path, offset, _ in locations})
        events = {}
        for _, in_file, records in reader.located_records(places, lambda place: (*place, 0)):
            for place, record in zip(in_file, records):
                if record is not None and record.intact:
                    events[place] = record.data
        return events

    @staticmethod
    def _payload(events, location, tag):
        """The content of the digest value of ``tag`` at ``location`` (``(path, offset, value
        index)``) of ``events`` (`_events`)."""
        path, offset, index = location
        data = events.get((path, offset))
        payload = None if data is None else wire.string_value(data, index, tag)
        if payload is None:
            raise ValueError("a digest record no longer reads back")
        return payload

    def digest(self, thresholds: analysis.Thresholds, background: bool = False) -> Digest:
        """The digest under ``thresholds``, fed up to the last step (thresholds other than the
        defaults read every step the first time; only the latest such digest is kept);
        ``background`` as in `reading`."""
        with self.reading(thresholds, background=background) as (digest, _):
            return digest

    def progress(self, thresholds: analysis.Thresholds, wait: bool = True) -> int:
        """How many steps the digest under ``thresholds`` has read, once fed as `reading`
        would feed it."""
        with self.reading(thresholds, wait) as (digest, unread):
            return len(self.located.steps) - unread

    def _entry(self, thresholds):
        """(digest, steps read into it) under ``thresholds``, made if new (hold the lock): the
        writer's digest taken up (`_continued`), or an empty one."""
        if thresholds not in self._digests:
            if thresholds != _DEFAULTS:
                self._digests = {t: d for t, d in self._digests.items() if t == _DEFAULTS}
            digest = self._continued(thresholds)
            if digest is not None:  # it answers from now on, with every step it has read
                self._taken_up, self._restored = True, None
            self._digests[thresholds] = (digest, digest.rows) if digest else (
                Digest(self.like, thresholds, self.epoch_starts, self.epoch_indices), 0)
        return self._digests[thresholds]

    def _continued(self, thresholds):
        """The writer's digest as read, able to take the steps after it (`Digest.continued`),
        or None (hold the lock): under the default thresholds, when its records still describe
        the first located steps and hold the state to go on from."""
        restored = self._restored
        written = None if restored is None else restored[1]
        if (thresholds != _DEFAULTS or written is None or written.continues is False
                or self._no_taking_up or self.written is None
                or restored[0] != _source(self.written, self._marks())
                or not _covers(written, self.located)):
            return None
        located = self.located
        try:
            return Digest.continued(
                self.like, thresholds, written.records, located.wall_times,
                lambda start, stop: self._rows_of(located, start, stop),
                self.epoch_starts, self.epoch_indices)
        except Exception as error:  # noqa: BLE001 - whatever a record holds: read every step
            written.continues = False
            logger.info("run %r tag %r: the writer's digest cannot be taken up (%s); the "
                        "plugin reads every step", self.run, self.tag, error)
            return None

    def _marks(self):
        return self.epoch_starts, self.epoch_indices

    def _continues(self, thresholds, written) -> bool:
        """Whether the plugin's own digest has read as far as ``written`` (the writer's
        digest), taking it up now if it can (hold nothing)."""
        with self._lock:
            return self._entry(thresholds)[1] >= written.rows

    def _feed(self, thresholds, background: bool):
        """Feeds the digest up to the last step, `STEPS_PER_READ` at a time, reading the next
        steps and summarising the steps judged before while the last are judged (numpy lets
        the three threads share the CPU). Steps are read without the lock, so answers can be
        given between two feeds (hold `_feeding`); in the ``background``, after any request
        being answered."""
        with concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="tensorboard-gradients read") as reader_pool, \
                concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="tensorboard-gradients summary") as summary:
            ahead = None  # (located, start, future rows)
            while True:
                if background:
                    traffic.REQUESTS.wait_until_idle()
                with self._lock:
                    digest, read = self._entry(thresholds)
                    located = self.located
                    if read >= len(located.steps):
                        digest.summarise()
                        return
                if ahead is None or ahead[0] is not located or ahead[1] != read:
                    ahead = (located, read, reader_pool.submit(
                        self._rows_of, located, read, read + STEPS_PER_READ))
                rows = ahead[2].result()
                after = read + min(STEPS_PER_READ, len(located.steps) - read)
                ahead = None
                if after < len(located.steps):
                    ahead = (located, after, reader_pool.submit(
                        self._rows_of, located, after, after + STEPS_PER_READ))
                with self._lock:
                    if self._digests.get(thresholds, (None,))[0] is not digest:
                        continue  # the old steps changed meanwhile (`update`): start again
                    try:
                        digest.feed(rows, alongside=summary)
                    except BaseException as error:
                        # Half fed, it could take no later step: the next request starts over,
                        # from the first step if it went on from a writer's records.
                        self._digests.pop(thresholds, None)
                        if not (isinstance(error, Exception) and thresholds == _DEFAULTS
                                and self._taken_up):
                            raise
                        self._taken_up, self._no_taking_up = False, True
                        logger.info("run %r tag %r: the writer's digest could not go on (%s); "
                                    "the plugin reads every step", self.run, self.tag, error)
                        return
                    self._digests[thresholds] = (digest, after)


_DEFAULTS = analysis.Thresholds()


def _extends(old, new) -> bool:
    """Whether ``new`` points are ``old`` ones followed by later steps."""
    count = len(old.steps)
    return (len(new.steps) >= count and new.locations[:count] == old.locations
            and (count == 0 or new.steps[count - 1] == old.steps[-1]))


def _source(written, marks):
    """What a restored writer's digest was read from: its records' and blocks' locations, and
    the epoch marks."""
    return written[0].locations, written[1].locations, _marks_key(marks)


def _marks_key(marks):
    starts, indices = marks
    return (None if starts is None else tuple(starts.tolist()),
            None if indices is None else tuple(indices.tolist()))


def _covers(digest, located) -> bool:
    """Whether ``digest`` (restored from a writer's records) describes the first located
    steps: the same steps, each read from the file of the record that covers it and written
    before that record, or from an earlier segment of that file (a bucket's writer uploads its
    file in segments: `segments.precedes`). A restarted job that wrote a step again wrote it to
    another file; the same writer writing it again wrote it after, and voids its records soon
    after."""
    rows = digest.rows
    if len(located.steps) < rows or not (located.steps[:rows] == digest.steps()).all():
        return False
    for start, end, file, record_offset in digest.sources:
        last_offsets = {}  # per file of these steps, the last offset (a long run's: a few files)
        for path, offset, _ in located.locations[start:end]:
            if last_offsets.get(path, -1) < offset:
                last_offsets[path] = offset
        if not all((path == file and offset < record_offset) or segments.precedes(path, file)
                   for path, offset in last_offsets.items()):
            return False
    return True


def _same_loss(old, new, last_step) -> bool:
    """Whether the loss at the steps up to ``last_step`` (what a digest has judged) is
    unchanged (a loss logged later for an earlier step changes what those steps say)."""
    def upto(loss):
        if loss is None or last_step is None:
            return None, np.zeros(0, np.int64), np.zeros(0)
        (steps, values), source = loss
        kept = steps <= last_step
        return (source if kept.any() else None), steps[kept], values[kept]

    (old_source, old_steps, old_values), (new_source, new_steps, new_values) = upto(old), upto(new)
    return (old_source == new_source and np.array_equal(old_steps, new_steps)
            and np.array_equal(old_values, new_values, equal_nan=True))


def _same_marks(old_starts, new_starts, last_step) -> bool:
    """Whether the epoch marks up to ``last_step`` (what a digest has summarised) are unchanged."""
    def upto(starts):
        return () if starts is None or last_step is None else tuple(
            int(s) for s in starts if s <= last_step)

    return upto(old_starts) == upto(new_starts)
