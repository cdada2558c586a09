"""TF-free reading and writing of TensorBoard event files (TFRecord framing of `Event` protos).

Only TensorBoard's own protobufs are used, never TensorFlow: this module works in a process where
`import tensorflow` fails (PyTorch/JAX users), and reading a logdir does not pay TF's start-up.

Reading trusts nothing in a file: only regular files are opened (never a FIFO or a device named
like an event file), records are streamed one at a time with their lengths checked against the
file and `MAX_RECORD_BYTES`, and what had to be skipped is counted (`ReadDamage`) so the reader
can report it. TensorBoard's loaders differ: the Python loader stops reading a file at the first
record failing its checksum, the Rust loader serves that record as it is.
"""

import dataclasses
import os
import socket
import stat
import struct
import threading
import time
from typing import BinaryIO, Iterator, List, NamedTuple, Optional, Tuple, Union

from tensorboard.compat.proto import event_pb2

from tensorboard_gradients.format import ranges, storage

try:  # A C implementation when installed; TensorBoard's pure-Python table otherwise.
    from google_crc32c import value as _crc32c
except ImportError:  # pragma: no cover - depends on the environment
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c as _crc32c

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_FILE_COUNTER = iter(range(1 << 62))
_FILE_COUNTER_LOCK = threading.Lock()


def _masked_crc32c(data: bytes) -> int:
    crc = _crc32c(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def is_event_file(filename: str) -> bool:
    return "tfevents" in os.path.basename(filename)


def record(data: bytes) -> bytes:
    """One TFRecord frame: length, its checksum, the data, its checksum."""
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", _masked_crc32c(header)) + data
            + struct.pack("<I", _masked_crc32c(data)))


def records(*events: "event_pb2.Event") -> bytes:
    """The events' records, one after another, as an event file holds them."""
    return b"".join(record(e.SerializeToString()) for e in events)


def version_event() -> "event_pb2.Event":
    """The event every event file starts with (its format version, as TensorBoard writes it)."""
    return event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")


def version_record() -> bytes:
    """`version_event`'s record."""
    return record(version_event().SerializeToString())


def file_number() -> int:
    """A number no other event file of this process has: with the pid, it keeps apart the files
    of writers that start in the same second (same host, same name otherwise)."""
    with _FILE_COUNTER_LOCK:
        return next(_FILE_COUNTER)


class EventFileWriter:
    """Appends `Event` records to one new event file in `logdir`, created on the first write.

    Each `write` is all or nothing: its records go to the file unbuffered, and when an `OSError`
    (a full disk, a quota, a vanished mount) interrupts them the file is truncated back to where
    it was before raising, so no torn record is ever left between whole ones and a later write
    can simply try again. Should even the truncation fail, the file is abandoned (its torn tail
    reads as an unfinished last record) and the next write starts a new file.
    """

    # While writes fail: nothing here, they raise their error (a bucket's writer keeps what it
    # could not upload, and says so here: `segments.SegmentWriter`).
    failing = None

    def __init__(self, logdir: str, filename_suffix: str = ".gradients"):
        self.logdir = logdir
        self._suffix = filename_suffix
        self._fd = None
        self._path = None
        self._size = 0  # bytes of whole records in the file
        self._lock = threading.Lock()

    @property
    def path(self):
        """The file written to (None before the first write)."""
        return self._path

    @property
    def starts_new_file(self) -> bool:
        """Whether the next write starts a file (its tags must be described again)."""
        return self._fd is None or self._size == 0

    def upload(self, force: bool = False):
        """Nothing to upload: every `write` reaches the operating system before it returns."""

    def _open(self):
        os.makedirs(self.logdir, exist_ok=True)
        # TensorBoard's naming; the pid and number keep files of concurrent writers apart.
        name = "events.out.tfevents.%010d.%s.%d.%d%s" % (
            time.time(),
            socket.gethostname(),
            os.getpid(),
            file_number(),
            self._suffix,
        )
        path = os.path.join(self.logdir, name)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        self._path, self._size = path, 0

    def write(self, *events: "event_pb2.Event"):
        """Appends the events' records, all or none (see the class); raises the `OSError`."""
        data = records(*events)
        with self._lock:
            if self._fd is None:
                self._open()
            if self._size == 0:  # a new file starts with its version record, in the same write
                data = version_record() + data
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self._fd, view):]
            except OSError:
                self._roll_back()
                raise
            self._size += len(data)

    def _roll_back(self):
        try:
            os.ftruncate(self._fd, self._size)
        except OSError:
            self._close()

    def flush(self):
        """Nothing to do: every `write` reaches the operating system before it returns."""

    def _close(self):
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass  # the data already reached the kernel; nothing left to save
            self._fd = self._path = None

    def close(self):
        with self._lock:
            self._close()


# A record longer than this is never read: the framing allows 2**64 bytes, and a crafted length
# must not decide what a reader allocates. Real records are far smaller (2,000 variables x 13
# float64 statistics: 208 KB; their histograms: 1 MB).
MAX_RECORD_BYTES = 1 << 30
_OPEN_NONBLOCKING = getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE_TYPES = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotARegularFileError(OSError):
    """An event-file name on something else than a regular file (a FIFO, a device, a socket):
    reading one could block forever or never end, so it is not read."""


@dataclasses.dataclass
class ReadDamage:
    """What a read of one file had to skip (`read_events`, `iter_records`); false if nothing."""

    # Records whose data checksum failed or that are not an `Event`; their neighbours were read.
    skipped_records: int = 0
    # Where the framing broke (a length whose checksum fails, or one over `MAX_RECORD_BYTES`):
    # no later record can be located, so the rest of the file was not read.
    framing_broken_at: Optional[int] = None
    unread_bytes: int = 0

    def __bool__(self):
        return bool(self.skipped_records) or self.framing_broken_at is not None

    def __str__(self):
        parts = []
        if self.skipped_records:
            parts.append(f"{self.skipped_records} damaged record(s) skipped")
        if self.framing_broken_at is not None:
            parts.append(f"the record framing is broken at byte {self.framing_broken_at}, so "
                         f"the last {self.unread_bytes} bytes were not read")
        return "; ".join(parts)


def read_events(path: str, damage: Optional[ReadDamage] = None) -> Iterator["event_pb2.Event"]:
    """Yields the events of one event file, one record read at a time.

    Only a regular file is read (see `open_regular_file`), up to the size it had when opened;
    memory is bounded by the largest record, never by the file.

    - A record whose data checksum fails, or that does not parse, is skipped and its neighbours
      kept, so one bad write cannot hide the rest of a run (``damage.skipped_records``).
    - A broken framing ends the file (see `iter_records`; ``damage.unread_bytes``).
    - A record running past the end of the file is one still being written: the file ends there
      quietly (a later read gets it whole).

    Args:
      path: the event file.
      damage: filled in with what was skipped (pass a `ReadDamage` to learn it).

    Raises:
      OSError: when iteration starts, if the file cannot be opened (`NotARegularFileError`: it
        is not a regular file); later, if reading it fails.
    """
    for _, event in located_events(path, damage):
        yield event


def located_events(path: str, damage: Optional[ReadDamage] = None,
                   start: int = 0) -> Iterator[Tuple[int, "event_pb2.Event"]]:
    """`read_events` from offset ``start`` on, each event with the offset of its record (what
    `records_at` reads back)."""
    damage = ReadDamage() if damage is None else damage
    with open_regular_file(path) as file:
        offset = start
        for record in iter_records(file, start, storage.file_size(file), damage):
            event = parse_event(record.data) if record.intact else None
            if event is None:
                damage.skipped_records += 1
            else:
                yield offset, event
            offset = record.end


def event_of(record: Optional["Record"]) -> Optional["event_pb2.Event"]:
    """The event of an intact record; None for a damaged one, one that does not parse, or
    None."""
    return parse_event(record.data) if record is not None and record.intact else None


def records_at(file: BinaryIO, offsets) -> Iterator[Optional["Record"]]:
    """The `Record` at each of ``offsets`` of an open event file, or None where none reads back
    whole (the file was truncated or replaced since). A record right after the last one read is
    read without a seek: a long run's steps lie one after another."""
    size = storage.file_size(file)
    position = None
    for offset in offsets:
        if offset != position:
            file.seek(offset)
        record = _record_at(file, offset, size)
        whole = isinstance(record, Record)
        position = record.end if whole else None
        yield record if whole else None


# A record located in a bucket's object (`records_located`) is fetched with this many bytes
# first: its header, and the whole of most records (a step of 1,000 variables' statistics is
# ~50 KB); the rest of a longer one (a digest record: megabytes) in a second round of requests.
FIRST_FETCH_BYTES = 64 * 1024


def records_located(locations) -> List[Union[Optional["Record"], OSError]]:
    """The `Record` at each ``(path, offset)`` of ``locations`` (a bucket's objects), None
    where none reads back whole (as `records_at`), or the `OSError` naming the object where it
    could not be read. All are fetched together (`ranges.read_ranges`: concurrent requests,
    nearby records in one), in two rounds: the first `FIRST_FETCH_BYTES` of each, then the
    data and checksum of the longer ones; never a request per record and object in turn, nor
    a download of the blocks around a record."""
    records = ranges.read_ranges([(path, offset, offset + FIRST_FETCH_BYTES)
                                   for path, offset in locations], max_gap=FIRST_FETCH_BYTES)
    rests = []  # (order, offset, length) of the records longer than their first bytes
    for order, ((_, offset), first) in enumerate(zip(locations, records)):
        if isinstance(first, OSError):
            continue
        length = _checked_length(first[:_HEADER.size]) if len(first) >= _HEADER.size else None
        whole = None if length is None else _HEADER.size + length + _FOOTER.size
        if whole is not None and len(first) == FIRST_FETCH_BYTES < whole:
            rests.append((order, offset, length))
            continue
        records[order] = None if whole is None or len(first) < whole else _checked_record(
            offset, first[_HEADER.size:whole - _FOOTER.size], first[whole - _FOOTER.size:whole])
    wanted = [(locations[order][0], offset + at, offset + at + count)
              for order, offset, length in rests
              for at, count in ((_HEADER.size, length), (_HEADER.size + length, _FOOTER.size))]
    fetched = iter(ranges.read_ranges(wanted, max_gap=None))  # each record's data uncopied
    for order, offset, length in rests:
        data, footer = next(fetched), next(fetched)
        error = next((part for part in (data, footer) if isinstance(part, OSError)), None)
        records[order] = error or (
            _checked_record(offset, data, footer)
            if len(data) == length and len(footer) == _FOOTER.size else None)
    return records


def _checked_record(offset: int, data: bytes, footer: bytes) -> "Record":
    """The `Record` at ``offset`` of ``data`` (whole) and its ``footer``."""
    return Record(offset + _HEADER.size + len(data) + _FOOTER.size, data,
                  _masked_crc32c(data) == _FOOTER.unpack(footer)[0])


def parse_event(data: bytes) -> Optional["event_pb2.Event"]:
    """The `Event` a record's data holds, or None when it does not parse."""
    event = event_pb2.Event()
    try:
        event.ParseFromString(data)
    except Exception:  # noqa: BLE001 - whatever protobuf raises, it is one bad record
        return None
    return event


def open_regular_file(path: str) -> BinaryIO:
    """``path`` opened for binary reading, refused unless it is a regular file (a symlink to one
    is fine): opened non-blocking and checked with ``fstat`` on the descriptor, with no window
    between check and open, so a FIFO cannot hang a reader nor ``/dev/zero`` fill its memory.

    A URL (``s3://...``, `storage.is_url`) is opened through fsspec (`storage.open_remote`).

    Raises:
      NotARegularFileError: a FIFO, a device, a socket, a directory.
      OSError: the file cannot be opened (`storage.StorageError`: the store could not be read).
    """
    if storage.is_url(path):
        return storage.open_remote(path)
    descriptor = os.open(path, os.O_RDONLY | _OPEN_NONBLOCKING)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFileError(f"{path!r} is {file_type(mode)}, not a regular file")
        return os.fdopen(descriptor, "rb")
    except BaseException:
        os.close(descriptor)
        raise


def file_type(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a FIFO", "a directory")."""
    return next((name for is_type, name in _FILE_TYPES if is_type(mode)), "a special file")


class Record(NamedTuple):
    """One TFRecord of an event file."""

    end: int  # the offset just after it, where the next record starts
    data: bytes
    intact: bool  # whether its data checksum holds


def iter_records(file: BinaryIO, start: int, size: int, damage: ReadDamage) -> Iterator[Record]:
    """The records of ``file`` from offset ``start`` up to offset ``size``, read one at a time.

    Iteration ends quietly before a record running past ``size`` (one still being written: a
    later read resumes at the last record's ``end``). A length whose own checksum fails, or a
    length over `MAX_RECORD_BYTES`, breaks the framing: no later record can be located, so
    iteration ends and ``damage.framing_broken_at`` / ``damage.unread_bytes`` say where.
    """
    file.seek(start)
    offset = start
    while size - offset >= _HEADER.size:
        record = _record_at(file, offset, size)
        if record is _BROKEN_FRAMING:
            damage.framing_broken_at, damage.unread_bytes = offset, size - offset
            return
        if record is None:
            return
        offset = record.end
        yield record


class Skimmed(NamedTuple):
    """A record as `skim_records` saw it: ``head``, the first bytes of its data; ``record``, the
    whole `Record` when it was that short (else None)."""

    offset: int
    end: int
    length: int
    head: bytes
    record: Optional[Record]

    @property
    def data_offset(self) -> int:
        return self.offset + _HEADER.size


def skim_records(file: BinaryIO, start: int, size: int, damage: ReadDamage) -> Iterator[Skimmed]:
    """The records of ``file`` from ``start`` up to ``size`` as `iter_records` frames them, but
    reading only their first `SKIM_BYTES`: a record that does not fit is not read further, nor
    its data checksum verified. Small records come whole, many per read.

    Locating the 100,000 records of a long run (4.9 GB) this way reads 0.4 GB instead of all,
    in ~0.3 s instead of ~2 s (`server.store.event_scan` verifies their checksums afterwards, in the
    background)."""
    position = start
    while size - position >= _HEADER.size:
        window = storage.read_at(file, position, min(SKIM_BYTES, size - position))
        at, available = 0, len(window)
        while available - at >= _HEADER.size:
            length = _checked_length(window[at:at + _HEADER.size])
            offset = position + at
            if length is None:
                damage.framing_broken_at, damage.unread_bytes = offset, size - offset
                return
            end = offset + _HEADER.size + length + _FOOTER.size
            if end > size:
                return  # the writer has not finished this record yet
            data_at = at + _HEADER.size
            at = end - position
            if at <= available:
                data = window[data_at:data_at + length]
                intact = _masked_crc32c(data) == _FOOTER.unpack_from(window, data_at + length)[0]
                yield Skimmed(offset, end, length, data, Record(end, data, intact))
            else:
                yield Skimmed(offset, end, length,
                              window[data_at:data_at + min(length, SKIM_HEAD_BYTES)], None)
                break
        else:
            if not at:
                return  # truncated while being read
        position += at


# How much `skim_records` reads at a time: a page, many small records or the first bytes of a
# big one, of which it keeps `SKIM_HEAD_BYTES` (a tensor value's tag lies in them).
SKIM_BYTES = 4096
SKIM_HEAD_BYTES = 512


def _checked_length(header: bytes) -> Optional[int]:
    """The data length a record's header gives, or None when its checksum fails or it exceeds
    `MAX_RECORD_BYTES` (the framing is broken)."""
    length, length_crc = _HEADER.unpack(header)
    if _masked_crc32c(header[:8]) != length_crc or length > MAX_RECORD_BYTES:
        return None
    return length


_BROKEN_FRAMING = object()


def _record_at(file: BinaryIO, offset: int, size: int):
    """The `Record` at ``offset`` of a file positioned there and ``size`` bytes long; None when
    it runs past ``size`` (still being written) or the file was truncated while being read;
    `_BROKEN_FRAMING` when its length fails its checksum or exceeds `MAX_RECORD_BYTES`."""
    header = file.read(_HEADER.size)
    if len(header) != _HEADER.size:
        return None
    length = _checked_length(header)
    if length is None:
        return _BROKEN_FRAMING
    end = offset + _HEADER.size + length + _FOOTER.size
    if end > size:
        return None  # the writer has not finished this record yet
    data = file.read(length)
    footer = file.read(_FOOTER.size)
    if len(data) != length or len(footer) != _FOOTER.size:
        return None
    return _checked_record(offset, data, footer)
