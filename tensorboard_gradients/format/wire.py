"""An event's protobuf wire format by hand, where protobuf's messages would cost.

Writing (`event`, `tensor_value`, `float32_value`): the event of each logged step, built by the
writer's background thread, byte for byte what ``Event.SerializeToString()`` gives (a test checks
it), a quarter of protobuf's time in a loop; in the benchmark's training loop the writer's thread
took 0.18 ms of CPU per clipped norms-only step instead of 0.24 (benchmarks/NOTES.md, "The
targets with each writer settled in its round; events encoded by hand").

Reading: locating a long run's steps from each record's first bytes (`tensor_values`), the spans
of a record's fields (`message_fields`: a segment index keeps a record less its payloads), and a
digest record's payload without copying it (`string_value`). Each accepts only the layouts proto
serializers write and leaves anything else to `event_files.parse_event`."""

import functools
import math
import struct
from typing import Iterable, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np
from tensorboard.compat.proto import summary_pb2

from tensorboard_gradients.format.event_files import SKIM_HEAD_BYTES, parse_event
from tensorboard_gradients.format.tensors import FLOAT_TENSORS, float_array, tensor_proto


class EncodedEvent(NamedTuple):
    """An `Event` already serialized (`event`), taken by the event writers in place of the
    message (`event_files.EventFileWriter.write`, `segments.SegmentWriter.write`)."""

    step: int
    data: bytes

    def SerializeToString(self) -> bytes:  # noqa: N802 - the message's method
        return self.data


def event(wall_time: float, step: int, values: Iterable[bytes]) -> bytes:
    """``Event(wall_time=wall_time, step=step, summary=Summary(value=values))`` serialized, of
    serialized ``Summary.Value``s (`tensor_value`, `float32_value`, or protobuf's for a value
    with metadata). ``wall_time`` is a `time.time()`: never 0, the default proto3 leaves out."""
    summary = b"".join([_length_delimited(_VALUE, value) for value in values])
    return b"".join((_WALL_TIME, _DOUBLE.pack(wall_time),
                     _STEP + _encoded_varint(step) if step else b"",
                     _length_delimited(_SUMMARY, summary)))


def tensor_value(tag: str, value) -> bytes:
    """``Summary.Value(tag=tag, tensor=tensors.tensor_proto(value))`` serialized (no metadata:
    a tag's values after its first in a file); float32 and float64 arrays encoded here, other
    values (a digest's bytes) by protobuf."""
    array = float_array(value)
    if array is None:
        return summary_pb2.Summary.Value(tag=tag, tensor=tensor_proto(value)).SerializeToString()
    head, tensor_head = _tensor_heads(tag, array.dtype, array.shape)
    if array.size > 1:
        values = array.tobytes()
        tensor = b"".join((tensor_head, _CONTENT, _encoded_varint(len(values)), values))
    elif array.size == 1:  # float_val / double_val, packed
        tensor = tensor_head + (_FLOAT_VAL + _FLOAT.pack(array.item())
                                if array.dtype.itemsize == 4
                                else _DOUBLE_VAL + _DOUBLE.pack(array.item()))
    else:
        tensor = tensor_head
    return b"".join((head, _length_delimited(_TENSOR, tensor)))


def float32_value(tag: str, value: float) -> bytes:
    """`tensor_value` of ``np.float32(value)`` (a TensorBoard scalar), without numpy: a value
    past float32's range is infinite, as numpy makes it."""
    try:
        packed = _FLOAT.pack(value)
    except OverflowError:
        packed = _FLOAT.pack(math.copysign(math.inf, value))
    head, tensor_head = _tensor_heads(tag, _FLOAT32, ())
    return head + _length_delimited(_TENSOR, b"".join((tensor_head, _FLOAT_VAL, packed)))


@functools.lru_cache(maxsize=4096)  # a writer's few tags and shapes
def _tensor_heads(tag: str, dtype: np.dtype, shape: Tuple[int, ...]) -> Tuple[bytes, bytes]:
    """(the value's tag field, its tensor's dtype and shape fields)."""
    dims = b"".join([_length_delimited(_DIM, _SIZE + _encoded_varint(size) if size else b"")
                     for size in shape])
    return (_length_delimited(_TAG, tag.encode()),
            _DTYPE + _encoded_varint(FLOAT_TENSORS[dtype][0])
            + _length_delimited(_SHAPE, dims))


def _length_delimited(key: bytes, payload: bytes) -> bytes:
    return b"".join((key, _encoded_varint(len(payload)), payload))


def _encoded_varint(value: int) -> bytes:
    """``value`` as a base-128 varint; a negative one as its 64-bit two's complement (ten
    bytes), as protobuf writes an int64."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    value &= (1 << 64) - 1
    encoded = bytearray()
    while value >= 0x80:
        encoded.append(value & 0x7F | 0x80)
        value >>= 7
    encoded.append(value)
    return bytes(encoded)


def tensor_values(head: bytes, length: int,
                  read_at) -> Optional[Tuple[float, int, Tuple[str, ...]]]:
    """``(wall_time, step, tags)`` of an `Event` of ``length`` bytes from its first bytes
    ``head``, when the event is summary values that each hold a tag and a tensor and nothing
    else (no plugin metadata: a tag's later values): how every long run's steps are written.
    ``read_at(offset, count)`` reads ``count`` bytes of the event's data from ``offset``, for the
    values after the first. None for any other event, or when the bytes read are too few to
    tell: then parse it whole (`parse_event`).

    Reads the protobuf wire format by hand, accepting only the one layout that proto
    serializers write for such an event (fields in number order) and checking that the lengths
    account for every byte, so it never says what `parse_event` would not."""
    try:
        if head[0] != _WALL_TIME_KEY or head[9] != _STEP_KEY:
            return None
        wall_time = _DOUBLE.unpack_from(head, 1)[0]
        step, at = varint(head, 10)
        if head[at] != _SUMMARY_KEY:
            return None
        size, at = varint(head, at + 1)
        if at + size != length:
            return None
        tags = []
        while at < length:
            tag, end = _tensor_value(head, at)
            if tag is None and len(head) < length:  # the value may lie past the bytes read
                tag, end = _tensor_value(read_at(at, SKIM_HEAD_BYTES), 0)
                end += at
            if tag is None:
                return None
            tags.append(tag)
            at = end
        return (wall_time, step, tuple(tags)) if at == length and tags else None
    except (IndexError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def _tensor_value(data: bytes, at: int) -> Tuple[Optional[str], int]:
    """(tag, offset after it) of the `Summary.value` field at ``at`` of ``data`` when it holds a
    tag and a tensor only; (None, 0) otherwise, or when ``data`` ends before telling."""
    try:
        if data[at] != _VALUE_KEY:
            return None, 0
        size, at = varint(data, at + 1)
        end = at + size
        if data[at] != _TAG_KEY:
            return None, 0
        size, at = varint(data, at + 1)
        tag = data[at:at + size]
        at += size
        if len(tag) != size or data[at] != _TENSOR_KEY:
            return None, 0
        size, at = varint(data, at + 1)
        if at + size != end:  # the tensor ends the value: no metadata after it
            return None, 0
        return tag.decode(), end
    except IndexError:
        return None, 0


def message_fields(data, at: int, end: int) -> Iterator[Tuple[int, int, int, Optional[int], int]]:
    """``(field number, key, start, payload start, end)`` of each field of the protobuf message
    in ``data[at:end]``; the payload start of a length-delimited field only (None for the other
    wire types).

    Raises:
      ValueError: bytes that are not a message.
    """
    while at < end:
        start = at
        key, at = _varint_within(data, at, end)
        wire_type, payload = key & 7, None
        if wire_type == 0:
            _, at = _varint_within(data, at, end)
        elif wire_type == 1 or wire_type == 5:
            at += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            size, payload = _varint_within(data, at, end)
            at = payload + size
        else:
            raise ValueError("not a protobuf message")
        if at > end:
            raise ValueError("a field past its message's end")
        yield key >> 3, key, start, payload, at


def _varint_within(data, at: int, end: int) -> Tuple[int, int]:
    """`varint` within ``data[:end]``, ValueError past it."""
    try:
        value, after = varint(data, at)
    except IndexError:
        after = end + 1
    if after > end:
        raise ValueError("a varint past its message's end")
    return value, after


def string_value(data: bytes, index: int, tag: str):
    """The first ``string_val`` of the tensor of summary value ``index`` of the `Event` in
    ``data`` (a digest record's payload) as a view of ``data``, without parsing the event (a
    copy of megabytes, twice); None when that value does not exist or holds another tag, or
    its tensor no ``string_val``. Walks the fields where each message on the way holds each of
    them once, as serializers write it; parses the event otherwise (`parse_event`)."""
    view = memoryview(data)
    try:
        (summary,) = _spans(view, 0, len(view), EVENT_SUMMARY, single=True)
        values = _spans(view, *summary, SUMMARY_VALUE)
        if index >= len(values):
            return None
        (tag_at,) = _spans(view, *values[index], VALUE_TAG, single=True)
        if view[slice(*tag_at)] != tag.encode():
            return None
        (tensor,) = _spans(view, *values[index], VALUE_TENSOR, single=True)
        strings = _spans(view, *tensor, TENSOR_STRING_VAL)
        return view[slice(*strings[0])] if strings else None
    except ValueError:  # a field twice, or bytes that do not walk: as the parser reads it
        event = parse_event(data)
        value = (event.summary.value[index] if event is not None
                 and index < len(event.summary.value) else None)
        if value is None or value.tag != tag or not value.tensor.string_val:
            return None
        return memoryview(value.tensor.string_val[0])


def _spans(data, at: int, end: int, number: int, single: bool = False) -> List[Tuple[int, int]]:
    """``(payload start, end)`` of each length-delimited field ``number`` of the message in
    ``data[at:end]``; ``single``: exactly one, or ValueError."""
    spans = []
    for field, _, _, payload, field_end in message_fields(data, at, end):
        if field == number:
            if payload is None:
                raise ValueError(f"field {number} is not length-delimited")
            spans.append((payload, field_end))
    if single and len(spans) != 1:
        raise ValueError(f"field {number} {len(spans)} times")
    return spans


def varint(data: bytes, at: int) -> Tuple[int, int]:
    """The base-128 varint at ``at`` and the offset after it; ValueError for one of 9 bytes or
    more (a negative step: parsed whole), IndexError past ``data``. Steps and lengths under
    2 ** 21 (three bytes) take no loop: a scan decodes five per record."""
    first = data[at]
    if first < 0x80:
        return first, at + 1
    second = data[at + 1]
    if second < 0x80:
        return (first & 0x7F) | second << 7, at + 2
    third = data[at + 2]
    if third < 0x80:
        return (first & 0x7F) | (second & 0x7F) << 7 | third << 14, at + 3
    value, shift, at = (first & 0x7F) | (second & 0x7F) << 7 | (third & 0x7F) << 14, 21, at + 3
    while shift < 63:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise ValueError("a varint too long to be a length or a non-negative step")


# Field numbers on the way from an `Event` to its tensors' payloads: Event.summary,
# Summary.value, Summary.Value's tag and tensor, TensorProto's tensor_content and string_val.
EVENT_SUMMARY, SUMMARY_VALUE, VALUE_TAG, VALUE_TENSOR = 5, 1, 1, 8
TENSOR_CONTENT, TENSOR_STRING_VAL = 4, 8
# Protobuf keys ((field number << 3) | wire type) of `Event` (wall_time = 1, a double; step =
# 2, a varint) and of the length-delimited fields above.
_WALL_TIME_KEY, _STEP_KEY = 0x09, 0x10
_SUMMARY_KEY, _VALUE_KEY, _TAG_KEY, _TENSOR_KEY = (
    number << 3 | 2 for number in (EVENT_SUMMARY, SUMMARY_VALUE, VALUE_TAG, VALUE_TENSOR))
_DOUBLE = struct.Struct("<d")

# The keys as bytes, for writing, with those of a tensor's own fields: dtype (1, a varint),
# tensor_shape (2: a `TensorShapeProto` of `dim`s, 2, each of a `size`, 1), tensor_content, and
# float_val (5) / double_val (6), packed, each with the length of one value.
_WALL_TIME, _STEP = bytes((_WALL_TIME_KEY,)), bytes((_STEP_KEY,))
_ONE_BYTE = [bytes((value,)) for value in range(0x80)]
_SUMMARY, _VALUE, _TAG, _TENSOR = (
    _ONE_BYTE[key] for key in (_SUMMARY_KEY, _VALUE_KEY, _TAG_KEY, _TENSOR_KEY))
_DTYPE, _SHAPE, _DIM, _SIZE = b"\x08", b"\x12", b"\x12", b"\x08"
_CONTENT = _ONE_BYTE[TENSOR_CONTENT << 3 | 2]
_FLOAT_VAL, _DOUBLE_VAL = b"\x2a\x04", b"\x32\x08"
_FLOAT = struct.Struct("<f")
_FLOAT32 = np.dtype(np.float32)
