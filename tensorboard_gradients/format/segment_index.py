"""The index of a bucket run's segments: what a reader needs to locate their records without
downloading them.

Locating a run's steps means reading the first bytes of every record (`event_files.skim_records`).
From a local disk that is a fraction of the run; from a bucket a record's first bytes come in their
block, so locating a 1,000-variable x 100,000-step run downloads all of it (4.7 GB, ~20 s from a
local emulator) before the first answer. So the `segments.SegmentWriter` also uploads, every
`INDEX_SEGMENTS` segments and at ``close``, an index object of the segments it uploaded since the
last one. Per segment it holds each record's offset and length, and:

* for a record of tensor values only (every step's statistics: what `wire.tensor_values`
  reads from a record's first bytes), what a scan reads there: its step, wall time and tags, in
  columns;
* for any other record (the first value of each tag, with its metadata; a scalar), its bytes
  less the payloads of its tensors (`tensor_content_spans`: what a scan never reads): `Entry`.

An index changes nothing a reader concludes (`server.store.file_scan`): it notes what a scan of
the segment's bytes would note (an `Entry` read with its payloads empty, their lengths told:
`Entry.compacted`), then verifies in the background, as for records located from their first
bytes, that each record is what the index says (`SegmentIndex.matches`: the same step, wall time
and tags, or the same kept bytes); a segment whose index does not match is read from its own
bytes. A run without an index (written
before, or by another writer; an index upload that failed) is read from its segments.

Format (version 1): `MAGIC`, then a zlib stream of: the number of segments; per segment its name
(a name in the index's directory), its size, its tag sets, its columns of tensor-value records
(offset, length, step, wall time, tag set) and its other records (offset, length, kept fragments:
start and bytes); integers little-endian, strings length-prefixed UTF-8.
"""

import dataclasses
import struct
import zlib
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from tensorboard_gradients.format import event_files, ranges, storage, wire

# Segments per index object: 16 segments are 8 MiB-128 MiB of records (`segments.SEGMENT_BYTES`,
# 30 s each at most), so the segments no index covers yet, read from their own bytes, stay a few
# seconds' download, and a run of 100,000 steps has tens of index objects, not thousands.
INDEX_SEGMENTS = 16
# Payloads shorter than this are kept: a loss, a scalar (a fragment costs 12 bytes, so eliding a
# few bytes saves nothing).
ELIDED_MIN_BYTES = 64
MAGIC = b"tensorboard-gradients segment index 1\n"
# An index object's name: ``gradients-index.`` and its first segment's name less its leading
# ``events.out.tfevents.``, so TensorBoard's loaders, which read names holding ``tfevents``,
# never take it for an event file.
_PREFIX = "gradients-index."
_SEGMENT_PREFIX = "events.out.tfevents."
# The most an index object may hold, compressed and decoded: a crafted object cannot make a
# reader allocate more (a real one holds ~2% of its 16 segments' 128 MiB at most).
MAX_INDEX_BYTES = 256 << 20

_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
# The columns of tensor-value records, in their order in the format.
_COLUMNS = (("offsets", "<u8"), ("lengths", "<u8"), ("steps", "<i8"), ("wall_times", "<f8"),
            ("tag_sets", "<u2"))


class Entry(NamedTuple):
    """A record that is not tensor values only, as its index keeps it: ``offset`` of its frame
    in the segment, ``length`` of its data, and ``kept``: ``(start, bytes)`` fragments of the
    data, in order, the rest being tensor payloads."""

    offset: int
    length: int
    kept: Tuple[Tuple[int, bytes], ...]

    def compacted(self) -> Tuple[bytes, Tuple[Optional[int], ...]]:
        """The record's event with every payload it left out empty (it parses with the same
        tags, metadata, steps, dtypes and shapes), and per summary value the length of the
        tensor content left out (None where none was)."""
        if len(self.kept) == 1 and self.kept[0][0] == 0 and len(self.kept[0][1]) == self.length:
            return self.kept[0][1], ()  # nothing left out
        lengths = []
        return bytes(_compacted(_Sparse(self.kept), 0, self.length, 0, lengths)), tuple(lengths)

    def matches(self, data: bytes) -> bool:
        """Whether a record's ``data`` holds the bytes this entry kept, where it kept them."""
        return len(data) == self.length and all(
            data[start:start + len(fragment)] == fragment for start, fragment in self.kept)


def entry(offset: int, data: bytes) -> Entry:
    """``data`` (a record's) at ``offset`` less the payloads of its tensors."""
    kept, at = [], 0
    for start, end in tensor_content_spans(data):
        if end - start >= ELIDED_MIN_BYTES:
            kept.append((at, data[at:start]))
            at = end
    kept.append((at, data[at:]))
    return Entry(offset, len(data), tuple((s, f) for s, f in kept if f))


@dataclasses.dataclass(frozen=True)
class SegmentIndex:
    """One segment as its index describes it: ``size`` in bytes; per tensor-value record (in
    offset order) its ``offsets``, ``lengths``, ``steps``, ``wall_times`` and ``tag_sets``
    (positions in ``tags``, each the tags of a record's values in order); and its other records
    (`Entry`, in offset order)."""

    size: int
    tags: Tuple[Tuple[str, ...], ...]
    offsets: np.ndarray
    lengths: np.ndarray
    steps: np.ndarray
    wall_times: np.ndarray
    tag_sets: np.ndarray
    entries: Tuple[Entry, ...]

    def matches(self, offset: int, data: bytes) -> bool:
        """Whether the record at ``offset``, whose data is ``data``, is what this index says."""
        at = int(np.searchsorted(self.offsets, offset))
        if at < len(self.offsets) and self.offsets[at] == offset:
            return wire.tensor_values(data, len(data), None) == (
                float(self.wall_times[at]), int(self.steps[at]), self.tags[self.tag_sets[at]])
        return any(e.offset == offset and e.matches(data) for e in self.entries)


class Builder:
    """A segment's index as its writer adds records (`add`), for `encode`."""

    def __init__(self):
        self._tags: Dict[Tuple[str, ...], int] = {}
        self._rows: List[tuple] = []  # the columns of tensor-value records
        self._entries: List[Entry] = []

    def add(self, offset: int, data: bytes):
        """The record of ``data`` (a serialized event) at ``offset`` of the segment."""
        values = wire.tensor_values(data, len(data), None)
        if values is None:
            self._entries.append(entry(offset, data))
            return
        wall_time, step, tags = values
        tag_set = self._tags.setdefault(tags, len(self._tags))
        self._rows.append((offset, len(data), step, wall_time, tag_set))

    def encoded(self, name: str, size: int) -> bytes:
        parts = [_string(name), _U64.pack(size), _U32.pack(len(self._tags))]
        for tags in self._tags:  # in the order of their numbers
            parts += [_U16.pack(len(tags))] + [_string(tag) for tag in tags]
        columns = list(zip(*self._rows)) or [()] * len(_COLUMNS)
        parts.append(_U32.pack(len(self._rows)))
        parts += [np.asarray(column, dtype).tobytes()
                  for column, (_, dtype) in zip(columns, _COLUMNS)]
        parts.append(_U32.pack(len(self._entries)))
        for record in self._entries:
            parts += [_U64.pack(record.offset), _U64.pack(record.length),
                      _U32.pack(len(record.kept))]
            for start, fragment in record.kept:
                parts += [_U64.pack(start), _U32.pack(len(fragment)), fragment]
        return b"".join(parts)


def _string(text: str) -> bytes:
    encoded = text.encode("utf-8")
    return _U16.pack(len(encoded)) + encoded


def index_name(first_segment: str) -> str:
    """The name of the index object whose first segment is named ``first_segment``."""
    return _PREFIX + first_segment[len(_SEGMENT_PREFIX):]


def is_index_name(name: str) -> bool:
    return name.startswith(_PREFIX) and "tfevents" not in name


def encode(segments: Sequence[Tuple[str, int, Builder]]) -> bytes:
    """An index object of ``segments``: ``(name, size, its Builder)`` each."""
    parts = [_U32.pack(len(segments))] + [built.encoded(name, size)
                                          for name, size, built in segments]
    return MAGIC + zlib.compress(b"".join(parts), 1)


def decode(blob: bytes) -> Dict[str, SegmentIndex]:
    """``{segment name: SegmentIndex}`` of an index object.

    Raises:
      ValueError: not an index of this version, or not whole (cut, crafted): whoever reads it
        then reads the segments themselves.
    """
    if not blob.startswith(MAGIC):
        raise ValueError("not a segment index of version 1")
    try:
        inflater = zlib.decompressobj()
        data = inflater.decompress(blob[len(MAGIC):], MAX_INDEX_BYTES)
    except zlib.error as error:
        raise ValueError(f"not a segment index: {error}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise ValueError("the segment index is cut or larger than a reader takes")
    reader = _Reader(data)
    segments = {}
    for _ in range(reader.take(_U32)):
        name = reader.string()
        if "/" in name or name in segments or not name.startswith(_SEGMENT_PREFIX):
            raise ValueError(f"a segment index names {name!r}")
        segments[name] = _segment(reader)
    if reader.at != len(data):
        raise ValueError("a segment index with bytes after its last segment")
    return segments


def in_listing(listed, unusable=lambda path, error: None) -> Dict[str, SegmentIndex]:
    """``{segment path: SegmentIndex}`` of the index objects among ``listed`` (``(name, path,
    FileState)``, `storage.event_listing` with `listed_in_bucket`), read together
    (`ranges.read_ranges`: a bucket's in concurrent requests). One that cannot be read, is
    not an index (`decode`) or is larger than `MAX_INDEX_BYTES` is passed over (its segments are
    read from their bytes), told to ``unusable(path, error)``."""
    wanted, indexed = [], {}
    for name, path, state in listed:
        if not is_index_name(name):
            continue
        if state.size > MAX_INDEX_BYTES:
            unusable(path, ValueError(f"larger than {MAX_INDEX_BYTES} bytes"))
        else:
            wanted.append((path, 0, state.size))
    for (path, _, _), data in zip(wanted, ranges.read_ranges(wanted)):
        try:
            if isinstance(data, OSError):
                raise data
            segments = decode(data)
        except (OSError, ValueError) as error:
            unusable(path, error)
            continue
        directory = path.rsplit("/", 1)[0]
        indexed.update((storage.join(directory, name), index) for name, index in segments.items())
    return indexed


def listed_in_bucket(name: str) -> bool:
    """Event files and their segment indexes: what a reader of a bucket lists."""
    return event_files.is_event_file(name) or is_index_name(name)


def _segment(reader: "_Reader") -> SegmentIndex:
    size = reader.take(_U64)
    tags = tuple(tuple(reader.string() for _ in range(reader.take(_U16)))
                 for _ in range(reader.take(_U32)))
    count = reader.take(_U32)
    columns = {name: np.frombuffer(reader.bytes(count * np.dtype(dtype).itemsize), dtype)
               for name, dtype in _COLUMNS}
    entries = []
    for _ in range(reader.take(_U32)):
        offset, length = reader.take(_U64), reader.take(_U64)
        kept, end = [], 0
        for _ in range(reader.take(_U32)):
            start = reader.take(_U64)
            fragment = reader.bytes(reader.take(_U32))
            if start < end or start + len(fragment) > length:
                raise ValueError("a segment index holds fragments out of their record")
            kept.append((start, fragment))
            end = start + len(fragment)
        entries.append(Entry(offset, length, tuple(kept)))
    offsets, lengths = columns["offsets"], columns["lengths"]
    entry_offsets = np.array([e.offset for e in entries], np.uint64)
    entry_ends = np.array([e.offset + e.length for e in entries], object)
    if ((lengths > size).any() or (offsets > size - lengths).any() or (entry_ends > size).any()
            or (np.diff(offsets.astype(np.int64)) <= 0).any()
            or (np.diff(entry_offsets.astype(np.int64)) <= 0).any()
            or (columns["tag_sets"] >= max(len(tags), 1)).any() or (columns["steps"] < 0).any()
            or len(np.intersect1d(offsets, entry_offsets))):
        raise ValueError("a segment index places records out of their segment or order")
    return SegmentIndex(size, tags, entries=tuple(entries), **columns)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, layout: struct.Struct) -> int:
        (value,) = layout.unpack_from(self.bytes(layout.size))
        return value

    def string(self) -> str:
        return self.bytes(self.take(_U16)).decode("utf-8", "strict")

    def bytes(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise ValueError("a segment index ends inside a record")
        value = self.data[self.at:self.at + count]
        self.at += count
        return value


def tensor_content_spans(data: bytes) -> List[Tuple[int, int]]:
    """``(start, end)`` of the payloads of every summary value's tensor in the serialized
    `Event` ``data`` (its ``tensor_content``, each of its ``string_val``: a digest record's), in
    order (none when it does not parse as one)."""
    spans = []

    def walk(at, end, depth):
        for number, _, _, payload, field_end in wire.message_fields(data, at, end):
            if payload is None:
                continue
            if depth < len(_PATH) and number == _PATH[depth]:
                walk(payload, field_end, depth + 1)
            elif depth == len(_PATH) and number in _PAYLOADS:
                spans.append((payload, field_end))
    try:
        walk(0, len(data), 0)
    except ValueError:
        return []
    return spans


# The messages on the way from an Event to its tensors' payloads, by depth (field numbers):
# Event.summary, Summary.value, Summary.Value.tensor; and the payloads, TensorProto's
# tensor_content and string_val.
_PATH = (wire.EVENT_SUMMARY, wire.SUMMARY_VALUE, wire.VALUE_TENSOR)
_PAYLOADS = (wire.TENSOR_CONTENT, wire.TENSOR_STRING_VAL)


class _Sparse:
    """The kept bytes of a record, indexed as the record: a byte left out raises ValueError."""

    def __init__(self, kept):
        self._kept = kept

    def __getitem__(self, key):
        at = key.start if isinstance(key, slice) else key
        for start, fragment in self._kept:
            if start <= at < start + len(fragment):
                if isinstance(key, slice):
                    if key.stop > start + len(fragment):
                        break
                    return fragment[key.start - start:key.stop - start]
                return fragment[at - start]
        raise ValueError("a byte the index left out")


def _compacted(data, at: int, end: int, depth: int, lengths: list) -> bytearray:
    """The message ``data[at:end]`` (at ``depth`` on `_PATH`) with its tensors' payloads empty;
    each Summary.Value's left-out tensor content length appended to ``lengths``."""
    out = bytearray()
    for number, key, field_start, payload, field_end in wire.message_fields(data, at,
                                                                                   end):
        if payload is not None and depth == 1 and number == wire.SUMMARY_VALUE:
            lengths.append(None)
        if payload is not None and depth < len(_PATH) and number == _PATH[depth]:
            inner = _compacted(data, payload, field_end, depth + 1, lengths)
        elif payload is not None and depth == len(_PATH) and number in _PAYLOADS:
            if number == wire.TENSOR_CONTENT and lengths:
                lengths[-1] = field_end - payload
            inner = b""
        else:
            out += data[field_start:field_end]
            continue
        out += _key_and_length(key, len(inner)) + inner
    return out


def _key_and_length(key: int, length: int) -> bytes:
    out = bytearray()
    for value in (key, length):
        while value >= 0x80:
            out.append(value & 0x7F | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)
