"""Records read where they lie in a bucket's objects (issue 37): `ranges.read_ranges` fetches
byte ranges of many objects together, `event_files.records_located` the records at given offsets,
exactly as `event_files.records_at` reads them from the same file on disk; and
`wire.string_value` takes a digest record's payload as a parse of the event would. Against
the real stores on loopback (`object_stores`)."""

import pytest
from google.protobuf.internal.encoder import _VarintBytes
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2

from object_stores import BUCKET, SCHEMES, stores_with_buckets
from tensorboard_gradients.format import event_files, ranges, reader, storage, wire
from tensorboard_gradients.format.event_files import FIRST_FETCH_BYTES

# Record data lengths around the first fetch (a record's header and footer take 16 bytes): one
# whole in it, one ending exactly at its end, one a byte over, and longer ones.
DATA_LENGTHS = (40, FIRST_FETCH_BYTES - 200, FIRST_FETCH_BYTES - 16, FIRST_FETCH_BYTES - 15,
                3 * FIRST_FETCH_BYTES, 1 << 20, 100)
DAMAGED = 4  # the record whose data is changed after its checksum was written


def string_event(step, payload, tag="digest"):
    return event_pb2.Event(step=step, summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag=tag, tensor=tensor_pb2.TensorProto(
            dtype=7, string_val=[payload]))]))


def event_file_bytes():
    """An event file of records of `DATA_LENGTHS`, one damaged; and each record's offset."""
    events = []
    for step, length in enumerate(DATA_LENGTHS):
        bare = len(string_event(step, b"").SerializeToString())
        # The payload's own length prefix grows with it: trim until the event is `length` bytes.
        payload = bytes(range(256)) * (length // 256 + 1)
        payload = payload[:length - bare - len(_VarintBytes(length)) + 1]
        while len(string_event(step, payload).SerializeToString()) > length:
            payload = payload[:-1]
        events.append(string_event(step, payload))
    data = bytearray(event_files.records(*events))
    offsets, at = [], 0
    for event in events:
        offsets.append(at)
        at += 16 + event.ByteSize()
    data[offsets[DAMAGED] + 12 + 20] ^= 0xFF
    return bytes(data), offsets


@pytest.fixture(scope="module")
def stores():
    with stores_with_buckets() as started:
        yield started


@pytest.mark.parametrize("scheme", SCHEMES)
def test_records_in_objects_read_as_the_same_records_on_disk(stores, tmp_path, scheme):
    data, offsets = event_file_bytes()
    local = tmp_path / "events.out.tfevents.1.host"
    local.write_bytes(data)
    fs = stores.filesystem(scheme)
    fs.pipe_file(f"{BUCKET}/ranges/whole", data)
    fs.pipe_file(f"{BUCKET}/ranges/cut", data[:offsets[5] + 1000])  # the 1 MB record cut
    url = f"{scheme}://{BUCKET}/ranges"
    with open(local, "rb") as file:
        expected = list(event_files.records_at(file, offsets))
    assert [record.intact for record in expected] == [i != DAMAGED for i in range(len(offsets))]
    found = event_files.records_located(
        [(f"{url}/whole", offset) for offset in offsets]
        + [(f"{url}/cut", offsets[4]), (f"{url}/cut", offsets[5]), (f"{url}/missing", 0)])
    assert [(r.end, bytes(r.data), r.intact) for r in found[:len(offsets)]] == \
        [(r.end, r.data, r.intact) for r in expected]
    assert found[-3] == expected[4]  # before the cut: whole
    assert found[-2] is None  # cut short: no longer reads back, as from a truncated file
    assert isinstance(found[-1], FileNotFoundError) and f"{url}/missing" in str(found[-1])


@pytest.mark.parametrize("scheme", SCHEMES)
def test_nearby_ranges_are_fetched_in_one_request(stores, tmp_path, scheme, monkeypatch):
    data = bytes(range(256)) * 64
    local = tmp_path / "object"
    local.write_bytes(data)
    stores.filesystem(scheme).pipe_file(f"{BUCKET}/near/a", data)
    stores.filesystem(scheme).pipe_file(f"{BUCKET}/near/b", data)
    url = f"{scheme}://{BUCKET}/near"
    fs, _ = storage.filesystem(url)
    requests = []
    real = fs.cat_ranges

    def counted(paths, starts, ends, **options):
        requests.extend(zip(paths, starts, ends))
        return real(paths, starts, ends, **options)

    monkeypatch.setattr(fs, "cat_ranges", counted)
    wanted = [(f"{url}/a", 0, 10), (f"{url}/a", 30, 40), (f"{url}/a", 5000, 5010),
              (f"{url}/b", 100, 110), (f"{url}/a", len(data) - 5, len(data) + 10),
              (str(local), 7, 17)]
    expected = [data[start:stop] for _, start, stop in wanted]
    assert ranges.read_ranges(wanted, max_gap=100) == expected
    assert len(requests) == 4  # a's first two merged; the local file is read from disk
    requests.clear()
    assert ranges.read_ranges(wanted, max_gap=None) == expected
    assert len(requests) == 5


def summary_event_bytes(values):
    """A serialized Event of step 3 whose summary holds ``values`` (each serialized
    Summary.Value), framed by hand, as a crafted file may hold them."""
    summary = b"".join(b"\x0a" + _VarintBytes(len(value)) + value for value in values)
    return event_pb2.Event(step=3).SerializeToString() + b"\x2a" + \
        _VarintBytes(len(summary)) + summary


def value_bytes(tag, **tensor):
    return summary_pb2.Summary.Value(
        tag=tag, tensor=tensor_pb2.TensorProto(dtype=7, **tensor)).SerializeToString()


def tensor_field(**tensor):
    """A Summary.Value's tensor field (number 8, length-delimited), serialized alone."""
    data = tensor_pb2.TensorProto(**tensor).SerializeToString()
    return b"\x42" + _VarintBytes(len(data)) + data


def parsed_string(data, index, tag):
    event = event_pb2.Event.FromString(data)
    value = event.summary.value[index] if index < len(event.summary.value) else None
    return value.tensor.string_val[0] if value is not None and value.tag == tag and \
        value.tensor.string_val else None


@pytest.mark.parametrize("data, index, tag", [
    (summary_event_bytes([value_bytes("a", string_val=[b"first"]),
                          value_bytes("b", string_val=[b"x" * 70000, b"y"])]), 1, "b"),
    (summary_event_bytes([value_bytes("a", string_val=[b"first"])]), 0, "a"),
    (summary_event_bytes([value_bytes("a", string_val=[b"first"])]), 0, "b"),  # another tag
    (summary_event_bytes([value_bytes("a", string_val=[b"first"])]), 1, "a"),  # no such value
    (summary_event_bytes([value_bytes("a", tensor_content=b"1234")]), 0, "a"),  # no string
    # A tensor field twice: the parser merges them (string_val of the first, then the second).
    (summary_event_bytes([value_bytes("a") + tensor_field(string_val=[b"second"])]), 0, "a"),
    (summary_event_bytes([value_bytes("a", string_val=[b"one"])
                          + b"\x0a\x01b"]), 0, "b"),  # the tag given twice: the last holds
], ids=["second value", "first value", "other tag", "past the values", "no string_val",
        "tensor twice", "tag twice"])
def test_a_string_value_is_what_a_parse_of_the_event_says(data, index, tag):
    found = wire.string_value(data, index, tag)
    assert (None if found is None else bytes(found)) == parsed_string(data, index, tag)


def test_bytes_that_are_no_event_have_no_string_value():
    assert wire.string_value(b"\xff\xff\xff", 0, "a") is None
    assert wire.string_value(b"", 0, "a") is None


@pytest.mark.parametrize("scheme", SCHEMES)
def test_records_read_a_few_at_a_time_are_those_of_each_file(stores, tmp_path, scheme,
                                                            monkeypatch):
    """`reader.located_records` fetches a bucket's records a few at a time, the next few while
    these are read; a reader that leaves a file's records half read gets the next file's."""
    monkeypatch.setattr(reader, "RECORDS_PER_FETCH", 3)
    data, offsets = event_file_bytes()
    fs = stores.filesystem(scheme)
    for name in ("a", "b"):
        fs.pipe_file(f"{BUCKET}/few/{name}", data)
    local = tmp_path / "events"
    local.write_bytes(data)
    with open(local, "rb") as file:
        expected = list(event_files.records_at(file, offsets))
    url = f"{scheme}://{BUCKET}/few"
    points = [(f"{url}/{name}", offset) for name in ("a", "b") for offset in offsets]
    files = reader.located_records(points, lambda point: (*point, 0))
    path, in_file, records = next(files)
    assert path == f"{url}/a" and in_file == points[:len(offsets)]
    assert [next(records), next(records)] == expected[:2]  # left half read
    path, in_file, records = next(files)
    assert path == f"{url}/b" and list(records) == expected


@pytest.mark.parametrize("scheme", SCHEMES)
def test_an_object_read_in_order_is_fetched_ahead(stores, scheme, monkeypatch):
    monkeypatch.setattr(storage, "BLOCK_BYTES", 1000)
    monkeypatch.setattr(storage, "BLOCKS", storage.BlockCache(1 << 20))
    data = bytes(range(256)) * 40  # 11 blocks
    stores.filesystem(scheme).pipe_file(f"{BUCKET}/ahead/object", data)
    asked = []
    real = storage.BlockCache.fetch
    monkeypatch.setattr(storage.BlockCache, "fetch",
                        staticmethod(lambda file, index: asked.append(index) or real(file, index)))
    with storage.open_remote(f"{scheme}://{BUCKET}/ahead/object") as file:
        read = [file.read(700) for _ in range(15)]
    assert b"".join(read) == data
    # The reader asked the first two blocks; from the second on, the next ones came ahead (one
    # still on its way when needed is waited for, not asked again).
    assert asked == [0, 1]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_records_a_scan_just_read_are_not_downloaded_again(stores, scheme, monkeypatch):
    monkeypatch.setattr(storage, "BLOCKS", storage.BlockCache(256 << 20))
    data, offsets = event_file_bytes()
    stores.filesystem(scheme).pipe_file(f"{BUCKET}/scanned/events", data)
    url = f"{scheme}://{BUCKET}/scanned/events"
    with event_files.open_regular_file(url) as file:
        scanned = list(event_files.iter_records(file, 0, len(data), event_files.ReadDamage()))
    downloaded = storage.DOWNLOADED.value
    found = event_files.records_located([(url, offset) for offset in offsets])
    assert storage.DOWNLOADED.value == downloaded
    assert [(r.end, bytes(r.data), r.intact) for r in found] == \
        [(r.end, r.data, r.intact) for r in scanned]
