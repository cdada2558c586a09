"""The index of a bucket run's segments: what a reader needs to locate their records without
downloading them.

Locating a run's steps means reading the first bytes of every record (`event_files.skim_records`).
From a local disk that is a fraction of the run; from a bucket a record's first bytes come in its
block, so locating a 1,000-variable x 100,000-step run downloads all of it (4.7 GB, ~20 s from a
local emulator) before the first answer. So the `segments.SegmentWriter` also uploads, every
`INDEX_SEGMENTS` segments and at ``close``, an index object of the segments it uploaded since the
last one: per record its offset, its length and its bytes less the payloads of its tensors
(`tensor_content_spans`: what locating a record never reads). A 1,000-variable run's index is
about 1% of its statistics once compressed.

An index changes nothing a reader concludes: a reader (`server.store.event_scan`) runs on the kept
bytes, the payloads filled with zeros, the same code it runs on the records read from the file,
and verifies afterwards, as for records located from their first bytes, that the segment's bytes
are those the index kept (`Entry.crc`); a segment whose index does not match is read from its own
bytes. A run without an index (written before, or by another writer; an index upload that
failed) is read from its segments, as before.

Format (version 1): `MAGIC`, then a zlib stream of: the number of segments; per segment its
name (length-prefixed UTF-8, a name in the index's directory), its size in bytes and its
records; per record its offset, its data length and its kept fragments (start, bytes), all
integers little-endian (`_U32`, `_U64`).
"""

import struct
import zlib
from typing import Dict, Iterator, List, NamedTuple, Sequence, Tuple

# Segments per index object: 16 segments are 8 MiB-128 MiB of records (`segments.SEGMENT_BYTES`,
# 30 s each at most), so the segments no index covers yet, read from their own bytes, stay a few
# seconds' download, and a run of 100,000 steps has tens of index objects, not thousands.
INDEX_SEGMENTS = 16
# Tensor payloads shorter than this are kept: a loss, a scalar (an index entry costs ~12 bytes per
# fragment, so eliding a few bytes saves nothing).
ELIDED_MIN_BYTES = 64
MAGIC = b"tensorboard-gradients segment index 1\n"
# An index object's name: ``gradients-index.`` and its first segment's name less its leading
# ``events.out.tfevents.``, so TensorBoard's loaders, which read names holding ``tfevents``,
# never take it for an event file.
_PREFIX = "gradients-index."
_SEGMENT_PREFIX = "events.out.tfevents."
# The most an index object may hold, compressed and decoded: a crafted object cannot make a
# reader allocate more (a real one holds ~1% of its 16 segments' 128 MiB at most).
MAX_INDEX_BYTES = 256 << 20

_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")


class Entry(NamedTuple):
    """One record of a segment as its index holds it: ``offset`` of its frame in the segment,
    ``length`` of its data, and ``kept``: ``(start, bytes)`` fragments of the data, in order,
    the rest being tensor payloads."""

    offset: int
    length: int
    kept: Tuple[Tuple[int, bytes], ...]

    def read(self, at: int, count: int) -> bytes:
        """Up to ``count`` kept bytes of the data from ``at`` (fewer where a payload starts,
        none inside one): `event_files.tensor_values`' ``read_at``."""
        for start, fragment in self.kept:
            if start <= at < start + len(fragment):
                return fragment[at - start:at - start + count]
        return b""

    @property
    def head(self) -> bytes:
        """The kept bytes from the data's start."""
        return self.kept[0][1] if self.kept and self.kept[0][0] == 0 else b""

    @property
    def whole(self) -> bool:
        return len(self.head) == self.length

    def filled(self) -> bytes:
        """The data with every payload's bytes zero: it parses as the record does, with the
        same tags, metadata, steps, dtypes and shapes."""
        data = bytearray(self.length)
        for start, fragment in self.kept:
            data[start:start + len(fragment)] = fragment
        return bytes(data)

    def expected(self) -> "Expected":
        """What the record's bytes must be for this entry to be right, without its bytes."""
        return Expected(self.length, tuple((start, len(fragment)) for start, fragment in self.kept),
                        _kept_crc(self.length, self.kept))


class Expected(NamedTuple):
    """A record's data length, where an `Entry` kept bytes of it (start, count) and their
    checksum: what a reader checks a segment's record against (`matches`)."""

    length: int
    spans: Tuple[Tuple[int, int], ...]
    crc: int

    def matches(self, data: bytes) -> bool:
        """Whether a record's ``data`` holds the bytes its index entry kept, where it kept them."""
        return len(data) == self.length and _kept_crc(
            self.length, ((start, data[start:start + count]) for start, count in self.spans)
        ) == self.crc


def _kept_crc(length: int, fragments) -> int:
    crc = zlib.crc32(_U64.pack(length))
    for start, fragment in fragments:
        crc = zlib.crc32(fragment, zlib.crc32(_U64.pack(start), crc))
    return crc


def entry(offset: int, data: bytes) -> Entry:
    """The index entry of the record of ``data`` at ``offset`` (the writer's side)."""
    kept, at = [], 0
    for start, end in tensor_content_spans(data):
        if end - start >= ELIDED_MIN_BYTES:
            kept.append((at, data[at:start]))
            at = end
    kept.append((at, data[at:]))
    return Entry(offset, len(data), tuple((s, f) for s, f in kept if f))


def index_name(first_segment: str) -> str:
    """The name of the index object whose first segment is named ``first_segment``."""
    return _PREFIX + first_segment[len(_SEGMENT_PREFIX):]


def is_index_name(name: str) -> bool:
    return name.startswith(_PREFIX) and "tfevents" not in name


def encode(segments: Sequence[Tuple[str, int, Sequence[Entry]]]) -> bytes:
    """An index object of ``segments``: ``(name, size, entries)`` each."""
    parts = [_U32.pack(len(segments))]
    for name, size, entries in segments:
        encoded = name.encode("utf-8")
        parts += [_U16.pack(len(encoded)), encoded, _U64.pack(size), _U32.pack(len(entries))]
        for record in entries:
            parts += [_U64.pack(record.offset), _U64.pack(record.length),
                      _U32.pack(len(record.kept))]
            for start, fragment in record.kept:
                parts += [_U64.pack(start), _U32.pack(len(fragment)), fragment]
    return MAGIC + zlib.compress(b"".join(parts), 1)


def decode(blob: bytes) -> Dict[str, Tuple[int, List[Entry]]]:
    """``{segment name: (size, entries)}`` of an index object.

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
        name = reader.bytes(reader.take(_U16)).decode("utf-8", "strict")
        size, count = reader.take(_U64), reader.take(_U32)
        entries = [_read_entry(reader, size) for _ in range(count)]
        if "/" in name or name in segments or not name.startswith(_SEGMENT_PREFIX):
            raise ValueError(f"a segment index names {name!r}")
        segments[name] = (size, entries)
    if reader.at != len(data):
        raise ValueError("a segment index with bytes after its last segment")
    return segments


def _read_entry(reader: "_Reader", size: int) -> Entry:
    offset, length = reader.take(_U64), reader.take(_U64)
    if offset + length > size:
        raise ValueError("a segment index places a record past its segment's end")
    kept, end = [], 0
    for _ in range(reader.take(_U32)):
        start = reader.take(_U64)
        fragment = reader.bytes(reader.take(_U32))
        if start < end or start + len(fragment) > length:
            raise ValueError("a segment index holds fragments out of their record")
        kept.append((start, fragment))
        end = start + len(fragment)
    return Entry(offset, length, tuple(kept))


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def take(self, layout: struct.Struct) -> int:
        (value,) = layout.unpack_from(self.bytes(layout.size))
        return value

    def bytes(self, count: int) -> bytes:
        if self.at + count > len(self.data):
            raise ValueError("a segment index ends inside a record")
        value = self.data[self.at:self.at + count]
        self.at += count
        return value


def tensor_content_spans(data: bytes) -> List[Tuple[int, int]]:
    """``(start, end)`` of the ``tensor_content`` payload of every summary value's tensor in
    the serialized `Event` ``data``, in order (none when it does not parse as one)."""
    spans = []
    try:
        for number, start, end in _fields(data, 0, len(data)):
            if number != _EVENT_SUMMARY or end is None:
                continue
            for value_number, value_start, value_end in _fields(data, start, end):
                if value_number != _SUMMARY_VALUE or value_end is None:
                    continue
                for field, field_start, field_end in _fields(data, value_start, value_end):
                    if field == _VALUE_TENSOR and field_end is not None:
                        spans += [(s, e) for n, s, e in _fields(data, field_start, field_end)
                                  if n == _TENSOR_CONTENT and e is not None]
    except ValueError:
        return []
    return spans


# Field numbers: Event.summary, Summary.value, Summary.Value.tensor, TensorProto.tensor_content.
_EVENT_SUMMARY, _SUMMARY_VALUE, _VALUE_TENSOR, _TENSOR_CONTENT = 5, 1, 8, 4


def _fields(data: bytes, at: int, end: int) -> Iterator[Tuple[int, int, object]]:
    """``(field number, start, end)`` of each field of the message in ``data[at:end]``; start
    and end bound a length-delimited field's payload (``end`` None for the other wire types).

    Raises:
      ValueError: bytes that are not a message.
    """
    while at < end:
        key, at = _varint(data, at, end)
        wire_type, number = key & 7, key >> 3
        if wire_type == 0:
            _, at = _varint(data, at, end)
            yield number, at, None
        elif wire_type == 1 or wire_type == 5:
            at += 8 if wire_type == 1 else 4
            yield number, at, None
        elif wire_type == 2:
            size, at = _varint(data, at, end)
            yield number, at, at + size
            at += size
        else:
            raise ValueError("not a protobuf message")
        if at > end:
            raise ValueError("a field past its message's end")


def _varint(data: bytes, at: int, end: int) -> Tuple[int, int]:
    value = shift = 0
    while at < end and shift < 64:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise ValueError("a varint past its message's end")
