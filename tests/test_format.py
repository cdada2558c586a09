"""The on-disk contract: version policy, unique names, and the plugin's route over real loaders."""

import json
import os
import re
import time
import zlib

import numpy as np
import pytest
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.util import tensor_util

import tensorboard_gradients as tg
from tensorboard_gradients.format import columns, event_files, metadata, reader, statistics, wire
from tensorboard_gradients.format.layout import Layout, unique_names

from conftest import reference_stats, stat_tolerances


def _write_future_format(run_dir):
    content = json.loads(metadata.stats_metadata_content(
        "gradients", Layout.create(["a/kernel"], [(2,)], with_weights=False)
    ))
    content["format_version"] = [2, 0]
    value = summary_pb2.Summary.Value(
        tag="gradients",
        tensor=tensor_util.make_tensor_proto(np.zeros((1, 11), np.float32)),
        metadata=metadata.create_summary_metadata(json.dumps(content).encode()),
    )
    writer = event_files.EventFileWriter(run_dir)
    writer.write(event_pb2.Event(wall_time=time.time(), step=0, summary=summary_pb2.Summary(value=[value])))
    writer.close()


def test_each_gradient_stat_asked_for_alone_is_computed_from_its_own_passes():
    """The passes in a stat's `columns` row are all its formula reads: one left out would read
    as 0 when the stat is logged without the others that need that pass."""
    rng = np.random.default_rng(0)
    kernel = rng.standard_normal((30, 20)).astype(np.float32)
    kernel[:3] = 0.0  # exact zeros for the zero fraction
    bias = (2.0 + rng.standard_normal(20) * 1e-3).astype(np.float32)  # |mean| >> std
    for name in columns.GRADIENT_STATS:
        stats = columns.gradient_stats((name,))
        logged = statistics.statistics_matrix(statistics.NumpyOps, [(kernel, kernel.size),
                                                                    (bias, bias.size)],
                                              None, np.float32, stats)
        for row, gradient in zip(logged, (kernel, bias)):
            expected = reference_stats(gradient)
            assert abs(row[stats.index(name)] - expected[name]) <= stat_tolerances(
                expected, np.float32)[name], name


def test_reader_refuses_a_newer_major_version_clearly(tmp_path):
    _write_future_format(str(tmp_path / "future"))
    with tg.GradientWriter(str(tmp_path / "current")) as writer:
        writer.write(0, {"a/kernel": np.ones(2)})
    report = reader.read_logdir_report(str(tmp_path))
    assert list(report.runs) == ["current"]
    (problem,) = report.problems
    assert (problem.kind, problem.run, problem.tag) == (reader.UNREADABLE, "future", "gradients")
    assert re.search(r"format 2\.0.*pip install -U", problem.message)


def test_newer_minor_version_is_read():
    layout = Layout.create(["a/kernel"], [(2,)], with_weights=False)
    content = json.loads(metadata.stats_metadata_content("gradients", layout))
    content["format_version"] = [1, 8]
    content["added_in_1_8"] = "ignored"
    parsed = metadata.parse_plugin_data(json.dumps(content).encode())
    assert parsed.layout == layout


def test_the_cadence_of_norms_only_steps_is_in_the_metadata_only_when_there_are_some():
    every_step = Layout.create(["a/kernel"], [(2,)], with_weights=False)
    assert b"stats_every_n_steps" not in metadata.stats_metadata_content("g", every_step)
    sparse = Layout.create(["a/kernel"], [(2,)], with_weights=False, stats_every=10)
    parsed = metadata.parse_plugin_data(metadata.stats_metadata_content("g", sparse))
    assert parsed.layout == sparse and parsed.layout.stats_every == 10
    assert sparse.rows_and_columns == every_step.rows_and_columns  # a resumed run keeps its tag
    content = json.loads(metadata.stats_metadata_content("g", sparse))
    for bad in (0, -3, 2.5, "10", True, metadata.MAX_STATS_EVERY + 1):
        content["stats_every_n_steps"] = bad
        with pytest.raises(tg.UnsupportedFormatError, match="stats_every_n_steps"):
            metadata.parse_plugin_data(json.dumps(content).encode())


def test_the_stats_held_at_every_step_are_in_the_metadata():
    """Format 1.7: a stats tag names the stats its norms-only steps hold (the weight norm only
    beside the update norm); a 1.6 tag, which does not, held every one of them it has."""
    weights = Layout.create(["a/kernel"], [(2,)], with_weights=True, stats_every=10)
    both = Layout.create(["a/kernel"], [(2,)], with_weights=True, with_updates=True,
                         stats_every=10)
    assert "weight_l2_norm" not in weights.every_step
    assert {"weight_l2_norm", "update_l2_norm"} <= set(both.every_step)
    for layout in (weights, both):
        parsed = metadata.parse_plugin_data(metadata.stats_metadata_content("g", layout))
        assert parsed.layout.every_step == layout.every_step == columns.every_step_stats(
            layout.stats)
    content = json.loads(metadata.stats_metadata_content("g", weights))
    del content["every_step_stats"]
    content["format_version"] = [1, 6]
    parsed = metadata.parse_plugin_data(json.dumps(content).encode())
    assert parsed.layout.every_step == tuple(
        s for s in weights.stats if s in columns.EVERY_STEP_STATS)
    assert "weight_l2_norm" in parsed.layout.every_step
    for bad, message in ((["l2_norm", "nan_count", "inf_count", "size", "update_l2_norm"],
                          "names update_l2_norm, not in 'stats'"),
                         (["l2_norm", "size"], "lacks nan_count, inf_count"),
                         (["l2_norm", "l2_norm"], "twice"), ("l2_norm", "not a list")):
        content["every_step_stats"] = bad
        with pytest.raises(tg.UnsupportedFormatError, match=message):
            metadata.parse_plugin_data(json.dumps(content).encode())


def test_malformed_metadata_is_a_clear_error():
    with pytest.raises(tg.UnsupportedFormatError, match="not valid"):
        metadata.parse_plugin_data(b"\xff not json")


def test_duplicate_variable_names_stay_distinct():
    assert unique_names(["kernel", "kernel", "kernel_1", "bias"]) == [
        "kernel", "kernel_2", "kernel_1", "bias"
    ]


def test_reader_reports_a_missing_logdir(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such log directory"):
        tg.read_logdir(str(tmp_path / "absent"))


def test_reader_survives_a_half_written_record(tmp_path):
    with tg.GradientWriter(str(tmp_path)) as writer:
        for step in range(3):
            writer.write(step, {"a/kernel": np.ones(2)})
    (path,) = tmp_path.glob("events.out.tfevents.*")
    with open(path, "ab") as f:
        f.write(b"\x10\x00\x00")  # a writer caught mid-record
    assert list(tg.read_logdir(str(tmp_path))["."]["gradients"].steps) == [0, 1, 2]


def test_runs_route_lists_stats_tags(tmp_path, plugin_client):
    with tg.GradientWriter(str(tmp_path / "run_a")) as writer:
        for step in range(12):
            writer.write(step, {"a/kernel": np.ones(2), "b/kernel": np.ones(3)}, histograms=step == 0)
    response = plugin_client(str(tmp_path)).get("/data/plugin/gradients/runs")
    assert response.status_code == 200
    assert json.loads(response.get_data()) == {
        "run_a": {
            "gradients": {
                "variables": 2, "steps": 12, "stats": list(columns.GRADIENT_STATS),
                "histograms": True, "epochs": 0, "sampled": None,
            }
        }
    }


def test_a_newer_format_is_listed_with_its_error_and_refused_by_data_routes(
    tmp_path, plugin_client
):
    _write_future_format(str(tmp_path / "future"))
    with tg.GradientWriter(str(tmp_path / "current")) as writer:
        writer.write(0, {"a/kernel": np.ones(2)})
    client = plugin_client(str(tmp_path))
    response = client.get("/data/plugin/gradients/runs")
    assert response.status_code == 200
    runs = json.loads(response.get_data())
    assert "upgrade" in runs["future"]["gradients"]["error"]
    assert runs["current"]["gradients"]["steps"] == 1
    response = client.get("/data/plugin/gradients/heatmap?run=future&tag=gradients&stat=l2_norm")
    assert response.status_code == 400
    assert "upgrade" in json.loads(response.get_data())["error"]


def test_parsing_is_memoised_on_the_content_bytes():
    layout = Layout.create(["a/kernel", "b/bias"], [(2, 2), None], with_weights=True)
    content = metadata.stats_metadata_content("gradients", layout)
    parsed = metadata.parse_plugin_data(content)
    assert parsed.layout == layout
    assert metadata.parse_plugin_data(bytes(bytearray(content))) is parsed
    bad = content.replace(b'"l2_norm",', b"")
    messages = set()
    for _ in range(2):
        with pytest.raises(tg.UnsupportedFormatError) as caught:
            metadata.parse_plugin_data(bad)
        messages.add(str(caught.value))
    assert messages == {"gradients metadata is malformed: 'stats' lacks l2_norm"}


def test_oversized_metadata_is_refused_unread():
    with pytest.raises(tg.UnsupportedFormatError, match="more than the 16777216 accepted"):
        metadata.parse_plugin_data(b" " * (metadata.MAX_CONTENT_BYTES + 1))


def test_digest_records_read_back_and_refuse_anything_else():
    """`encode_digest` / `decode_digest`: numeric arrays of any shape read back equal (floats
    without a copy); a damaged or crafted content is refused with `UnsupportedFormatError`
    only, never read past its bytes or inflated past what it declares."""
    arrays = {"classes": np.arange(24, dtype=np.int8).reshape(2, 3, 4) % 5,
              "total": np.linspace(0, 1, 6, dtype=np.float32).reshape(3, 2)[:, ::-1],
              "first_row": np.int64(7), "empty": np.zeros((0, 3), np.float64)}
    payload = metadata.encode_digest(arrays)
    decoded = metadata.decode_digest(payload)
    assert set(decoded) == set(arrays)
    for name, array in arrays.items():
        assert decoded[name].dtype == array.dtype and np.array_equal(decoded[name], array)
    assert not decoded["total"].flags.writeable  # a view of the record's bytes
    header = json.loads(payload[4:4 + int.from_bytes(payload[:4], "little")])
    crafted = [b"", b"\x00", payload[:-5], b"\xff\xff\xff\xff" + payload[4:]]
    bomb = zlib.compress(bytes(400_000), 9)  # inflates 1,000x; declared empty
    bomb_header = json.dumps({"arrays": [["x", "|i1", [0], 0, len(bomb), True]]}).encode()
    with pytest.raises(metadata.UnsupportedFormatError, match="inflates"):
        metadata.decode_digest(len(bomb_header).to_bytes(4, "little") + bomb_header + bomb)
    for change in ({"dtype": "|O"}, {"shape": [10**12, 10**12]}, {"offset": -1},
                   {"bytes": 10**9}, {"shape": [-1]}):
        entries = [list(entry) for entry in header["arrays"]]
        field = ["name", "dtype", "shape", "offset", "bytes", "deflated"].index(next(iter(change)))
        entries[0][field] = next(iter(change.values()))
        text = json.dumps({"arrays": entries}).encode()
        crafted.append(len(text).to_bytes(4, "little") + text
                       + payload[4 + int.from_bytes(payload[:4], "little"):])
    rng = np.random.default_rng(3)
    for _ in range(2000):  # flipped bytes anywhere
        flipped = bytearray(payload)
        flipped[rng.integers(len(flipped))] ^= 1 << int(rng.integers(8))
        crafted.append(bytes(flipped))
    for content in crafted:
        try:
            metadata.decode_digest(content)
        except metadata.UnsupportedFormatError:
            pass


def _random_event(rng):
    """An `Event` of any of the layouts an event file holds: one tensor value with or without
    plugin metadata, several values, other value kinds, steps and wall times that proto3 leaves
    out when zero, negative steps, odd tags."""
    event = event_pb2.Event(wall_time=float(rng.choice([0.0, 1.5e9 + rng.random()])),
                            step=int(rng.choice([0, 1, 127, 128, 2**31, 2**62, -1, -2**40])))
    if rng.random() < 0.1:
        event.file_version = "brain.Event:2"
        return event
    for _ in range(int(rng.choice([0, 1, 1, 1, 2, 3]))):
        value = event.summary.value.add(tag=str(rng.choice(["gradients", "g/é", "", "t" * 300])))
        kind = rng.random()
        if kind < 0.8:
            value.tensor.CopyFrom(tensor_util.make_tensor_proto(
                rng.normal(size=int(rng.choice([0, 3, 5000]))).astype(np.float32)))
            if rng.random() < 0.3:
                value.metadata.plugin_data.plugin_name = "gradients"
            if rng.random() < 0.1:
                value.node_name = "n"
        elif kind < 0.9:
            value.simple_value = 1.0
    return event


def test_events_encoded_by_hand_are_protobufs_bytes():
    """The writer's thread encodes each step's event itself (`wire.event`, `tensor_value`,
    `float32_value`): byte for byte what protobuf serializes for the same messages, for every
    shape, float dtype, tag, step (zero, multi-byte, negative) and float32 edge a run writes."""
    from tensorboard_gradients.format.tensors import tensor_proto

    rng = np.random.default_rng(3)
    arrays = [rng.normal(size=shape).astype(dtype) for dtype in (np.float32, np.float64)
              for shape in [(), (0,), (1,), (1, 1), (3,), (2, 0), (28, 7), (200,), (5000,)]]
    arrays.append(np.arange(6, dtype=np.int64).reshape(2, 3))  # other dtypes: protobuf's
    tags = ["gradients", "g/é", "t" * 300]
    with np.errstate(over="ignore"):
        scalars = [0.0, -0.0, 1.5, 1e-45, 3.4028235e38, 3.4028236e38, 3.5e38, -1e39, 1e308,
                   float("inf"), -float("inf"), float("nan"), 7, 2**70]
        expected_scalars = [np.float32(value) for value in scalars]
    for step in [1, 0, 127, 128, 2**31, 2**62, -1, -2**40]:
        wall_time = 1.5e9 + rng.random()
        for tag in tags:
            values = [(tag, array) for array in arrays] + [
                (f"{tag}/s", value) for value in expected_scalars]
            protobuf = event_pb2.Event(wall_time=wall_time, step=step, summary=summary_pb2.Summary(
                value=[summary_pb2.Summary.Value(tag=t, tensor=tensor_proto(a)) for t, a in values]))
            encoded = wire.event(wall_time, step, [wire.tensor_value(tag, a) for a in arrays] + [
                wire.float32_value(f"{tag}/s", value) for value in scalars])
            assert encoded == protobuf.SerializeToString()


def test_a_skimmed_record_says_only_what_parsing_it_whole_says(tmp_path):
    """`wire.tensor_values` reads an event's first bytes by hand: for 3,000 random
    events and every cut of their first bytes it either declines (None) or names the step,
    wall time and tags that protobuf's parser gives, and it names them for every event of
    tensor values without metadata. `skim_records` frames the file as `iter_records` does,
    small records whole and checked."""
    rng = np.random.default_rng(7)
    events = [_random_event(rng) for _ in range(3000)]
    simple = 0
    for event in events:
        data = event.SerializeToString()
        values = event.summary.value
        is_simple = (event.wall_time and event.step > 0 and len(values) and all(
            value.HasField("tensor") and not value.HasField("metadata") and not value.node_name
            and value.tag for value in values))
        simple += bool(is_simple)
        for cut in (len(data), 600, 64, 17, 5, 0):
            found = wire.tensor_values(
                data[:cut], len(data), lambda at, count: data[at:at + count])
            if found is not None:
                assert found == (event.wall_time, event.step, tuple(v.tag for v in values))
                assert is_simple
            elif is_simple and cut >= min(len(data), 600):
                pytest.fail(f"declined tensor values: {event}")
    assert simple > 100  # the layout every long run is written in is well covered
    writer = event_files.EventFileWriter(str(tmp_path))
    writer.write(*events)
    path = writer.path
    writer.close()
    damage = event_files.ReadDamage()
    with event_files.open_regular_file(path) as file:
        size = os.fstat(file.fileno()).st_size
        skimmed = list(event_files.skim_records(file, 0, size, damage))
        whole = list(event_files.iter_records(file, 0, size, event_files.ReadDamage()))
    assert not damage
    assert [s.end for s in skimmed] == [r.end for r in whole]
    for item, record in zip(skimmed, whole):
        assert item.length == len(record.data) and record.data.startswith(item.head)
        assert item.record in (None, record)
        assert (item.record is None) == (item.end - item.offset > event_files.SKIM_BYTES)
