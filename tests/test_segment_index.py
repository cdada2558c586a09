"""The segment index (`format.segment_index`, issue 37): what a bucket writer uploads so readers
locate a run's records without downloading it. Its entries must let a reader conclude exactly
what the records' own bytes tell it, and a cut or crafted index must be refused, never trusted
past its bytes."""

import glob
import os
import struct
import zlib

import numpy as np
import pytest

from tensorboard_gradients.format import event_files, segment_index, wire
from tensorboard_gradients.format.writer import GradientWriter

SEGMENT = "events.out.tfevents.1796490604.host.1.0.s00000000.gradients"


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The records of a real run: statistics with their loss and scalars, histograms, the
    writer's digest records (1,000 steps) and an epoch mark; NaN and Inf in the statistics."""
    directory = str(tmp_path_factory.mktemp("run"))
    rng = np.random.default_rng(0)
    names = [f"layer{i}/kernel" for i in range(40)]
    shapes = [(16, 16)] * len(names)
    with GradientWriter(directory) as writer:
        writer.write_epoch(0, 0)
        for step in range(1100):
            gradients = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
            if step == 500:
                gradients[3][0, 0] = np.nan
                gradients[4][1, 1] = np.inf
            writer.write(step, dict(zip(names, gradients)), histograms=step % 100 == 0,
                         loss=float(step))
    [path] = glob.glob(os.path.join(directory, "*"))
    with open(path, "rb") as file:
        return [record.data for record in event_files.iter_records(
            file, 0, os.path.getsize(path), event_files.ReadDamage())]


def indexed(records):
    """``(index of records as one segment, [(offset, data)])``, through the writer's side."""
    built, placed, offset = segment_index.Builder(), [], 0
    for data in records:
        built.add(offset, data)
        placed.append((offset, data))
        offset += len(event_files.record(data))
    [(name, index)] = segment_index.decode(segment_index.encode([(SEGMENT, offset, built)])).items()
    assert name == SEGMENT and index.size == offset
    return index, placed


def test_an_index_tells_a_reader_what_each_record_does(records):
    index, placed = indexed(records)
    entries = {entry.offset: entry for entry in index.entries}
    steps = dict(zip(index.offsets.tolist(), zip(index.wall_times.tolist(),
                                                  index.steps.tolist(), index.tag_sets.tolist())))
    assert len(steps) + len(entries) == len(records) and len(steps) > 0.9 * len(records)
    for offset, data in placed:
        values = wire.tensor_values(data, len(data), None)
        if offset in steps:  # what a scan reads from the first bytes of a record
            wall_time, step, tag_set = steps[offset]
            assert values == (wall_time, step, index.tags[tag_set])
        else:  # the rest parses as the record, but for its payloads: empty, their lengths told
            original = event_files.parse_event(data)
            compacted, lengths = entries[offset].compacted()
            told = [len(value.tensor.tensor_content) for value in original.summary.value]
            if lengths:
                assert [n or 0 for n in lengths] == told
            for value in original.summary.value:
                value.tensor.tensor_content = b""
                value.tensor.string_val[:] = [b""] * len(value.tensor.string_val)
            if lengths:
                assert event_files.parse_event(compacted) == original
        assert index.matches(offset, data)


def test_a_record_that_differs_from_its_index_is_found_out(records):
    index, placed = indexed(records)
    plain = dict(placed)[int(index.offsets[5])]
    changed = bytearray(plain)
    changed[10] ^= 1  # the step's first byte (after the wall time's key and 8 bytes)
    assert not index.matches(int(index.offsets[5]), bytes(changed))
    assert not index.matches(int(index.offsets[5]), plain + b"\0")
    changed = bytearray(plain)
    changed[-8] ^= 1  # in a tensor's payload: not what the index vouches for
    assert index.matches(int(index.offsets[5]), bytes(changed))
    entry = next(e for e in index.entries if len(e.kept) > 1)
    data = dict(placed)[entry.offset]
    start, head = entry.kept[0]
    changed = bytearray(data)
    changed[start + len(head) - 1] ^= 1  # in the bytes the index kept
    assert not index.matches(entry.offset, bytes(changed))
    changed = bytearray(data)
    changed[len(head) + 8] ^= 1  # in the first elided payload
    assert index.matches(entry.offset, bytes(changed))
    assert not index.matches(entry.offset + 1, data)  # no record there


def test_an_index_is_small_beside_its_segment(records):
    built = segment_index.Builder()
    for data in records:
        built.add(0, data)
    size = sum(len(event_files.record(data)) for data in records)
    assert len(segment_index.encode([(SEGMENT, size, built)])) < 0.05 * size


def _blob(*segments) -> bytes:
    return segment_index.MAGIC + zlib.compress(struct.pack("<I", len(segments)) + b"".join(segments))


def _string(text):
    return struct.pack("<H", len(text.encode())) + text.encode()


def _segment(name=SEGMENT, size=1000, tags=(("t",),), rows=(), entries=()):
    """A segment of an index, byte by byte: ``rows`` of (offset, length, step, wall time, tag
    set), ``entries`` of (offset, length, [(start, bytes)])."""
    parts = [_string(name), struct.pack("<Q", size), struct.pack("<I", len(tags))]
    for tag_set in tags:
        parts += [struct.pack("<H", len(tag_set))] + [_string(tag) for tag in tag_set]
    parts.append(struct.pack("<I", len(rows)))
    for column, fmt in zip(zip(*rows) if rows else [()] * 5, "QQqdH"):
        parts.append(b"".join(struct.pack("<" + fmt, value) for value in column))
    parts.append(struct.pack("<I", len(entries)))
    for offset, length, kept in entries:
        parts += [struct.pack("<QQI", offset, length, len(kept))]
        for start, fragment in kept:
            parts += [struct.pack("<QI", start, len(fragment)), fragment]
    return b"".join(parts)


def test_a_crafted_index_of_the_format_decodes():  # the crafting below is the format
    [(name, index)] = segment_index.decode(_blob(_segment(
        rows=[(0, 10, 3, 1.5, 0), (30, 10, 4, 2.5, 0)], entries=[(14, 8, [(0, b"ab")])]))).items()
    assert name == SEGMENT and index.steps.tolist() == [3, 4] and index.tags == (("t",),)
    assert index.entries == (segment_index.Entry(14, 8, ((0, b"ab"),)),)


@pytest.mark.parametrize("why, blob", [
    ("another format", b"PK\x03\x04" + bytes(100)),
    ("not zlib", segment_index.MAGIC + b"not compressed"),
    ("cut", _blob(_segment())[:-3]),
    ("a path for a name", _blob(_segment(name="../" + SEGMENT))),
    ("not a segment's name", _blob(_segment(name="notes.txt"))),
    ("a record past its segment", _blob(_segment(rows=[(995, 10, 0, 0.0, 0)]))),
    ("a length past everything", _blob(_segment(rows=[(8, 2 ** 64 - 4, 0, 0.0, 0)]))),
    ("an entry past its segment", _blob(_segment(entries=[(995, 10, [])]))),
    ("a fragment past its record", _blob(_segment(entries=[(0, 5, [(3, b"abcd")])]))),
    ("fragments out of order", _blob(_segment(entries=[(0, 9, [(4, b"ab"), (0, b"cd")])]))),
    ("records out of order", _blob(_segment(rows=[(30, 10, 0, 0.0, 0), (0, 10, 1, 0.0, 0)]))),
    ("a record twice", _blob(_segment(rows=[(0, 10, 0, 0.0, 0)], entries=[(0, 10, [])]))),
    ("no such tag set", _blob(_segment(rows=[(0, 10, 0, 0.0, 1)]))),
    ("a negative step", _blob(_segment(rows=[(0, 10, -1, 0.0, 0)]))),
    ("a segment twice", _blob(_segment(), _segment())),
    ("bytes after the last segment",
     segment_index.MAGIC + zlib.compress(struct.pack("<I", 1) + _segment() + b"more")),
])
def test_a_cut_or_crafted_index_is_refused(why, blob):
    with pytest.raises(ValueError):
        segment_index.decode(blob)


def test_an_index_that_inflates_past_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(segment_index, "MAX_INDEX_BYTES", 1 << 20)
    with pytest.raises(ValueError, match="larger"):
        segment_index.decode(segment_index.MAGIC + zlib.compress(bytes(2 << 20)))


def test_every_cut_of_a_real_index_is_refused(records):
    built = segment_index.Builder()
    for offset, data in enumerate(records[:50]):
        built.add(offset, data)
    blob = segment_index.encode([(SEGMENT, 1 << 30, built)])
    for cut in range(len(segment_index.MAGIC), len(blob), max(1, len(blob) // 200)):
        with pytest.raises(ValueError):
            segment_index.decode(blob[:cut])


def test_bytes_that_are_not_an_event_have_no_payloads():
    assert segment_index.tensor_content_spans(b"\xff\xff\xff") == []
    assert segment_index.entry(7, b"\x0f garbage").kept == ((0, b"\x0f garbage"),)


@pytest.mark.parametrize("values", [1200, 1199, 0])
def test_a_tensor_left_out_is_checked_as_the_record_would_be(values):
    """A reader refuses a tensor its metadata does not describe (`series.check_tensor`) from an
    index entry as from the record: the content left out, its length told."""
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2

    from tensorboard_gradients.format.series import DamagedPointError, check_tensor

    tensor = tensor_pb2.TensorProto(
        dtype=1, tensor_content=np.ones(values, np.float32).tobytes() if values else b"",
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=30),
                 tensor_shape_pb2.TensorShapeProto.Dim(size=40)]))
    data = event_pb2.Event(step=7, summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag="t", tensor=tensor)])).SerializeToString()
    compacted, lengths = segment_index.entry(0, data).compacted()
    [value] = event_files.parse_event(compacted).summary.value

    def refusal(*args):
        try:
            check_tensor(*args)
        except DamagedPointError as error:
            return str(error)
    original = refusal(tensor, (30, 40))
    assert refusal(value.tensor, (30, 40), lengths[0] if lengths else None) == original
    assert (original is None) == (values == 1200) and (lengths != ()) == (values > 0)


def test_an_entry_whose_kept_bytes_are_no_event_cannot_be_compacted(records):
    """A crafted index's entry leaving out bytes that are not a payload: a reader reads that
    segment from its bytes instead (`file_scan.scan_index`)."""
    data = next(d for d in records if len(segment_index.entry(0, d).kept) > 1)
    entry = segment_index.entry(0, data)
    (start, head), *rest = entry.kept
    with pytest.raises(ValueError):
        entry._replace(kept=((start, head[:5]), *rest)).compacted()
