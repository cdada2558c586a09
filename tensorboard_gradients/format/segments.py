"""`SegmentWriter`: a writer's event file in a bucket, written as whole objects (segments).

An object store cannot append to an object, and an object appears only once uploaded whole. So a
`GradientWriter` whose run directory is an fsspec URL (``s3://``, ``gs://``: `storage.is_url`)
keeps its records in memory and uploads them as a new object, a segment, every
`SEGMENT_SECONDS`, once `SEGMENT_BYTES` are held, and at ``flush`` and ``close``; the uploads run
on the writer's background thread (at ``flush`` and ``close``, on the thread that asks), never
in a training step. A crash (a killed job, a lost machine) loses the segment being filled, at
most `SEGMENT_SECONDS` of steps; every segment uploaded is whole.

A segment is named as a local writer names its file, with ``s`` and the segment's number before
the suffix::

    events.out.tfevents.<writer's start, 10 digits>.<host>.<pid>.<writer>.s<8-digit number><suffix>

TensorBoard's loaders and this package's reader read a run's event files in name order, so they
read a writer's segments one after another, as one file (`precedes` tells which came first).
Each segment is a whole event file: it starts with the version record and describes its tags
again (`starts_new_file` tells the owner when), so a loader reads any one of them right.
Every `segment_index.INDEX_SEGMENTS` segments, and at ``close``, their index goes up too, an
object of its own that a reader locates their records from without downloading them
(`segment_index`).

Credentials and the endpoint come from each store's standard places (see `storage`); messages
show a URL without its credentials.

An upload that fails (an unreachable endpoint, a missing bucket, permission denied: within the
store's time limits, `storage.TIMEOUT_SECONDS`) is logged, naming the URL, at the first failure
of an outage, and its segment is kept and tried again, before the later ones and in order (a
loader reading names in order never misses one), when the next segment is ended and at ``flush``
and ``close``: a short outage loses nothing. Kept segments are bounded by `KEPT_BYTES`: past it
the oldest are given up, and ``close`` gives up what still fails; their steps go to ``on_lost``,
which the `GradientWriter` counts as dropped steps like those a full disk refused (its digest and
alerts had judged them already). With ``strict=True`` the upload's error is raised instead (the
segment is kept and retried).
"""

import atexit
import collections
import concurrent.futures.thread  # noqa: F401 - see _upload_at_exit
import logging
import os
import posixpath
import re
import socket
import threading
import time
import weakref
from typing import Callable, Optional

from tensorboard_gradients.format import event_files, segment_index, storage, write_queue

logger = logging.getLogger(__name__)

# The longest a segment is filled before it is uploaded (seconds). 30 s: a live TensorBoard (it
# reloads every 5 s) shows a step at most about 30 s late, a crash loses at most 30 s of steps,
# and a day of logging makes 2,880 objects per writer: a few cents of requests, and listings
# (1,000 objects a request) that stay cheap for runs of weeks.
SEGMENT_SECONDS = 30.0
# The most a segment holds before it is uploaded (bytes; a segment holds at least one write):
# about 80 steps' statistics and histograms of a 1,000-variable model, so a fast loop's memory
# and a segment's upload (well under a second) stay small.
SEGMENT_BYTES = 8 << 20
# The most that segments whose upload failed keep in memory (bytes) while the store is away;
# past it the oldest are given up.
KEPT_BYTES = 64 << 20

_LIVE = weakref.WeakSet()  # writers that may hold segments, uploaded at exit

# A segment's name: its writer's part (the name of a local writer's file, less its suffix), then
# its number, in digits enough to sort 100 million segments in order (30 s each: 95 years; one
# at every `flush` of each step: weeks).
_NUMBER_DIGITS = 8
_SEGMENT_NAME = re.compile(
    r"^(events\.out\.tfevents\.\d{10,}\..+\.\d+\.\d+)\.s(\d{8,})(\.[^.]*)?$")


def precedes(path: str, other: str) -> bool:
    """Whether the event file ``path`` is a segment that the writer of segment ``other`` uploaded
    before it: what a reader may take for an earlier part of the same file (a digest record
    covers the steps of the segments before its own)."""
    mine = _SEGMENT_NAME.match(posixpath.basename(path))
    theirs = _SEGMENT_NAME.match(posixpath.basename(other))
    return (mine is not None and theirs is not None
            and posixpath.dirname(path) == posixpath.dirname(other)
            and (mine.group(1), mine.group(3)) == (theirs.group(1), theirs.group(3))
            and int(mine.group(2)) < int(theirs.group(2)))


def event_writer(directory: str, strict: bool, on_due, on_lost):
    """The writer of a run directory's events: a `SegmentWriter` for a URL (`storage.is_url`),
    else an `event_files.EventFileWriter` (a ``file://`` URL names a local directory)."""
    if storage.is_url(directory):
        return SegmentWriter(directory, strict=strict, on_due=on_due, on_lost=on_lost)
    return event_files.EventFileWriter(storage.local_path(directory))


class _Segment:
    def __init__(self, url: str):
        self.url = url
        self.data = bytearray()
        self.index = segment_index.Builder()
        self.steps = set()  # the steps of its events, for counting them when given up
        self.opened = time.monotonic()
        self.due = False  # SEGMENT_SECONDS old (its timer fired)
        self._append(event_files.version_event().SerializeToString())

    def add(self, event):
        self._append(event.SerializeToString())
        self.steps.add(int(event.step))

    def _append(self, data: bytes):
        self.index.add(len(self.data), data)
        self.data += event_files.record(data)


class SegmentWriter:
    """Writes `Event` records to a run directory named by an fsspec URL, as segments (see the
    module); `event_files.EventFileWriter`'s interface, for a bucket.

    Args:
      url: the run directory (a `storage.is_url` URL).
      filename_suffix: ends each segment's name.
      strict: raise an upload's error (from `upload`, `close`) instead of logging it.
      on_due: called, on a timer thread, when the segment being filled is `SEGMENT_SECONDS`
        old with no write since to end it: the owner then calls ``seal(due_only=True)`` and
        `upload` on its own thread. None: segments end only at writes, `seal` and `close`.
      on_lost: called with ``(steps, error)`` when a segment is given up (see the module).
    """

    def __init__(self, url: str, filename_suffix: str = ".gradients", strict: bool = False,
                 on_due: Optional[Callable[[], None]] = None,
                 on_lost: Optional[Callable[[set, OSError], None]] = None):
        self.logdir = url.rstrip("/")
        self._name_format = "events.out.tfevents.%010d.%s.%d.%d.s%%0%dd%s" % (
            time.time(), socket.gethostname(), os.getpid(), event_files.file_number(),
            _NUMBER_DIGITS, filename_suffix)
        self._strict = bool(strict)
        self._on_due = on_due
        self._on_lost = on_lost
        self._number = 0  # of the next segment
        self._filling = None  # the segment being filled
        self._sealed = collections.deque()  # ended, not yet uploaded, oldest first
        self._sealed_bytes = 0
        # (name, size, `segment_index.Builder`) of the segments uploaded since the last index
        self._unindexed = []
        self._fresh = False  # a segment ended since the last upload failed: try again
        self._timer = None
        self._lock = threading.Lock()  # the segments
        self._upload_lock = threading.Lock()  # one upload at a time, in order
        self.failing = None  # while uploads fail: the last error
        _LIVE.add(self)

    @property
    def path(self) -> Optional[str]:
        """The URL of the segment being filled (None between segments)."""
        filling = self._filling
        return None if filling is None else filling.url

    @property
    def starts_new_file(self) -> bool:
        """Whether the next write starts a segment (its tags must be described again)."""
        return self._filling is None

    def write(self, *events):
        """Adds the events' records to the segment being filled, and ends it when it is due
        (`SEGMENT_BYTES`, `SEGMENT_SECONDS`); `upload` uploads it. Never touches the store."""
        with self._lock:
            if self._filling is None:
                self._filling = self._new_segment()
            segment = self._filling
            for event in events:
                segment.add(event)
            if (len(segment.data) >= SEGMENT_BYTES or segment.due
                    or time.monotonic() - segment.opened >= SEGMENT_SECONDS):
                self._seal()

    def _new_segment(self) -> _Segment:
        segment = _Segment(storage.join(self.logdir, self._name_format % self._number))
        self._number += 1
        if self._on_due is not None:
            self._timer = threading.Timer(SEGMENT_SECONDS, self._due, (segment,))
            self._timer.daemon = True
            self._timer.start()
        return segment

    def _due(self, segment: _Segment):
        segment.due = True
        if self._filling is segment:
            self._on_due()

    def seal(self, due_only: bool = False):
        """Ends the segment being filled (``due_only``: if `SEGMENT_SECONDS` old), for `upload`."""
        with self._lock:
            if self._filling is not None and (self._filling.due or not due_only):
                self._seal()

    def flush(self):
        """Ends the segment being filled; `upload` uploads it."""
        self.seal()

    def _seal(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        segment, self._filling = self._filling, None
        self._sealed.append(segment)
        self._sealed_bytes += len(segment.data)
        self._fresh = True

    def upload(self, force: bool = False, index: bool = False):
        """Uploads the ended segments, oldest first, stopping at the first that fails (see the
        module), then every `segment_index.INDEX_SEGMENTS` segments their index (``index``:
        also that of fewer). After a failure, only a newly ended segment (or ``force``) tries
        again, so an outage costs one try per segment, not one per write.

        Raises:
          OSError: an upload failed and the writer is ``strict``.
        """
        with self._upload_lock:
            self._upload(force)
            if index:
                self._upload_index()

    def _upload(self, force: bool, closing: bool = False):
        while True:
            with self._lock:
                if not self._sealed or not (self._fresh or force):
                    return
                segment = self._sealed[0]
            try:
                self._put(segment)
            except OSError as error:
                self._failed(error, closing)
                return
            with self._lock:
                self._sealed.popleft()
                self._sealed_bytes -= len(segment.data)
            self._unindexed.append((posixpath.basename(segment.url), len(segment.data),
                                    segment.index))
            if len(self._unindexed) >= segment_index.INDEX_SEGMENTS:
                self._upload_index()
            if self.failing is not None:
                self.failing = None
                logger.warning("tensorboard-gradients uploads to %s again",
                               storage.shown(self.logdir))

    def _upload_index(self):
        """Uploads the index of the segments uploaded since the last one (`segment_index`;
        hold the upload lock). One that fails is not tried again: readers read those segments
        from their own bytes."""
        if not self._unindexed:
            return
        url = storage.join(self.logdir, segment_index.index_name(self._unindexed[0][0]))
        blob = segment_index.encode(self._unindexed)
        self._unindexed = []
        fs, path = storage.filesystem(url)
        try:
            with storage.errors_named(url, writing=True):
                fs.pipe_file(path, blob)
        except OSError as error:
            logger.info("tensorboard-gradients could not upload %s (%s): readers read its "
                        "segments whole", storage.shown(url), error)

    def _put(self, segment: _Segment):
        fs, path = storage.filesystem(segment.url)
        with storage.errors_named(segment.url, writing=True):
            fs.pipe_file(path, bytes(segment.data))

    def _failed(self, error: OSError, closing: bool):
        with self._lock:
            self._fresh = False
            first = self.failing is None
            self.failing = error
            lost = []
            while self._sealed_bytes > KEPT_BYTES:
                lost.append(self._sealed.popleft())
                self._sealed_bytes -= len(lost[-1].data)
        self._give_up(lost, error)
        if self._strict:
            raise error
        if first and not closing:  # at close, what fails is given up (and reported) at once
            logger.error(
                "tensorboard-gradients cannot upload to %s (%s): its gradient statistics are "
                "kept in memory (up to %d MiB) and uploaded when the store answers again; "
                "training continues", storage.shown(self.logdir), error, KEPT_BYTES >> 20)

    def _give_up(self, segments, error):
        if self._on_lost is not None:
            for segment in segments:
                self._on_lost(segment.steps, error)

    def close(self):
        """Ends the segment being filled and uploads every segment; gives up those that still
        fail (``on_lost``). A later write starts a new segment."""
        self.seal()
        with self._upload_lock:
            self._upload(force=True, closing=True)
            self._upload_index()
            with self._lock:
                lost = list(self._sealed)
                self._sealed.clear()
                self._sealed_bytes = 0
        self._give_up(lost, self.failing)


def _upload_at_exit():
    """Uploads what writers still hold when Python exits, their queued writes first: a run that
    never closed its writer keeps its last steps, as it does in a local file."""
    write_queue.drain_at_exit()
    for writer in list(_LIVE):
        try:
            writer.seal()
            writer.upload(force=True, index=True)
        except OSError:
            pass  # strict: nobody is left to raise it to; the error was the store's


# Run at exit before `concurrent.futures` stops taking work (its own exit hook, registered at
# its import, which runs after ours): the stores' clients resolve names and sign requests on its
# executors, and an upload from a plain `atexit` handler fails ("cannot schedule new futures
# after interpreter shutdown").
if hasattr(threading, "_register_atexit"):
    threading._register_atexit(_upload_at_exit)
else:  # pragma: no cover - Python < 3.9
    atexit.register(_upload_at_exit)
