"""The segment index (`format.segment_index`, issue 37): what a bucket writer uploads so readers
locate a run's records without downloading it. Its entries must let a reader conclude exactly
what the records' own bytes tell it, and a cut or crafted index must be refused, never trusted
past its bytes."""

import glob
import os
import zlib

import numpy as np
import pytest

from tensorboard_gradients.format import event_files, segment_index
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


def test_an_entry_tells_a_reader_what_its_record_does(records):
    elided = 0
    for data in records:
        entry = segment_index.entry(0, data)
        kept = sum(len(fragment) for _, fragment in entry.kept)
        elided += len(data) - kept
        original, filled = event_files.parse_event(data), event_files.parse_event(entry.filled())
        # The same event but for the payloads of its tensors, zeros of the same length.
        for value in original.summary.value:
            value.tensor.tensor_content = bytes(len(value.tensor.tensor_content))
        assert filled == original
        # What a scan reads from a record's first bytes, read from the entry alone.
        whole = event_files.tensor_values(data, len(data), None)
        if not entry.whole:
            assert event_files.tensor_values(entry.head, entry.length, entry.read) == whole
        assert entry.expected().matches(data)
    assert elided > 0.8 * sum(map(len, records))  # what the index leaves out: the payloads


def test_an_entry_is_refused_by_a_record_that_differs_where_it_kept_bytes(records):
    data = next(d for d in records if len(segment_index.entry(0, d).kept) > 1)
    expected = segment_index.entry(0, data).expected()
    start, count = expected.spans[0]
    changed = bytearray(data)
    changed[start + count - 1] ^= 1  # in the kept head: another step, tag or length
    assert not expected.matches(bytes(changed))
    assert not expected.matches(data + b"\0")
    payload = expected.spans[0][1] + 8  # inside the first elided payload: not the index's
    changed = bytearray(data)
    changed[payload] ^= 1
    assert expected.matches(bytes(changed))


def test_an_index_reads_back_as_written(records):
    entries, offset = [], 0
    for data in records:
        entries.append(segment_index.entry(offset, data))
        offset += len(event_files.record(data))
    blob = segment_index.encode([(SEGMENT, offset, entries), (SEGMENT.replace("s0", "s1"), 0, [])])
    decoded = segment_index.decode(blob)
    assert decoded == {SEGMENT: (offset, entries), SEGMENT.replace("s0", "s1"): (0, [])}
    # Small beside the segment: its payloads are what it leaves out.
    assert len(blob) < 0.1 * offset


def _blob(raw: bytes) -> bytes:
    return segment_index.MAGIC + zlib.compress(raw)


@pytest.mark.parametrize("why, blob", [
    ("another format", b"PK\x03\x04" + bytes(100)),
    ("not zlib", segment_index.MAGIC + b"not compressed"),
    ("cut", _blob((1).to_bytes(4, "little") + (5).to_bytes(2, "little") + b"even")),
    ("a path for a name",
     _blob((1).to_bytes(4, "little") + (len("../" + SEGMENT)).to_bytes(2, "little")
           + ("../" + SEGMENT).encode() + (10).to_bytes(8, "little") + bytes(4))),
    ("not a segment's name",
     _blob((1).to_bytes(4, "little") + (9).to_bytes(2, "little") + b"notes.txt"
           + (10).to_bytes(8, "little") + bytes(4))),
    ("a record past its segment",
     _blob((1).to_bytes(4, "little") + len(SEGMENT).to_bytes(2, "little") + SEGMENT.encode()
           + (10).to_bytes(8, "little") + (1).to_bytes(4, "little")
           + (8).to_bytes(8, "little") + (5).to_bytes(8, "little") + bytes(4))),
    ("a fragment past its record",
     _blob((1).to_bytes(4, "little") + len(SEGMENT).to_bytes(2, "little") + SEGMENT.encode()
           + (100).to_bytes(8, "little") + (1).to_bytes(4, "little")
           + (0).to_bytes(8, "little") + (5).to_bytes(8, "little") + (1).to_bytes(4, "little")
           + (3).to_bytes(8, "little") + (4).to_bytes(4, "little") + b"abcd")),
    ("bytes after the last segment", _blob(bytes(4) + b"more")),
])
def test_a_cut_or_crafted_index_is_refused(why, blob):
    with pytest.raises(ValueError):
        segment_index.decode(blob)


def test_an_index_that_inflates_past_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(segment_index, "MAX_INDEX_BYTES", 1 << 20)
    with pytest.raises(ValueError, match="larger"):
        segment_index.decode(_blob(bytes(4) + bytes(2 << 20)))


def test_every_cut_of_a_real_index_is_refused(records):
    blob = segment_index.encode([(SEGMENT, 1 << 30, [segment_index.entry(0, d)
                                                      for d in records[:50]])])
    for cut in range(len(segment_index.MAGIC), len(blob), max(1, len(blob) // 200)):
        with pytest.raises(ValueError):
            segment_index.decode(blob[:cut])


def test_bytes_that_are_not_an_event_have_no_payloads():
    assert segment_index.tensor_content_spans(b"\xff\xff\xff") == []
    assert segment_index.entry(7, b"\x0f garbage").kept == ((0, b"\x0f garbage"),)
