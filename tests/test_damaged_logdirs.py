"""One bad file never breaks `read_logdir` or the CLI for the rest of a logdir.

Every damaged run sits next to a GOOD run written by `GradientWriter`: crafted metadata, a
tensor declaring 4.4 TB, flipped bytes, a later file with another layout under the same tag,
histograms that do not match their statistics, a FIFO and /dev/zero named like event files,
control characters in names. The good run must come back whole; each bad one must be reported.
The CLI runs as a subprocess with a hard timeout (a hang fails fast) and a memory limit.
"""

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
import pytest
from tensorboard.compat.proto import types_pb2
from tensorboard.util import tensor_util

import tensorboard_gradients as tg
from support import (
    bomb_tensor,
    flip_byte,
    metadata_content,
    summary_value,
    tensor_proto,
    write_event_file,
)
from tensorboard_gradients.format import columns, event_files, metadata, reader
from tensorboard_gradients.format.layout import Layout

GOOD_VARIABLES = ["dense_0/kernel", "dense_1/kernel", "dense_2/kernel"]
GOOD_STEPS = 20
NAN_STEP = 12  # the good run's one alert: a NaN gradient of dense_1/kernel from this step
CRAFTED_VARIABLES = ["a/kernel", "b/kernel"]
CONTROL_RUN = "ctl\x1b[31m"
CONTROL_VARIABLE = "evil\x1b]0;pwned\x07/kernel"
BROKEN_CONTROL_RUN = "ctl_bad\x1b[2J\nrun"
TIMEOUT_S = 60
MEMORY_LIMIT_BYTES = 1 << 30


def _write_good_run(run_dir, variables=GOOD_VARIABLES):
    """Writes the good run with `GradientWriter`; returns the path of its one event file."""
    rng = np.random.default_rng(0)
    with tg.GradientWriter(str(run_dir)) as writer:
        for step in range(GOOD_STEPS):
            grads = {name: rng.normal(size=(4, 4)) for name in variables}
            if step >= NAN_STEP:
                grads[variables[1]][0, 0] = np.nan
            writer.write(step, grads, histograms=step % 5 == 0)
    (path,) = run_dir.glob("*tfevents*")
    return path


def _content(make_content, layout_variables=CRAFTED_VARIABLES, **changes) -> bytes:
    """Valid metadata content of ``layout_variables``, then with ``changes`` to its fields."""
    layout = Layout.create(
        layout_variables, [(2, 2)] * len(layout_variables), with_weights=False
    )
    return metadata_content(make_content, layout, **changes)


def _stats_content(*args, **changes) -> bytes:
    return _content(metadata.stats_metadata_content, *args, **changes)


def _histogram_content(*args, **changes) -> bytes:
    return _content(metadata.histogram_metadata_content, *args, **changes)


def _matrix(rows=len(CRAFTED_VARIABLES), width=len(columns.GRADIENT_STATS), value=1.0):
    """A float32 ``[rows, width]`` of ``value``: for a stats tag, finite healthy gradients."""
    matrix = np.full((rows, width), value, np.float32)
    if width == len(columns.GRADIENT_STATS):
        for count in ("nan_count", "inf_count"):
            matrix[:, columns.GRADIENT_STATS.index(count)] = 0
    return tensor_util.make_tensor_proto(matrix)


def _logged(step, tag, tensor, content=None):
    """One step of `write_event_file` logging one value."""
    return step, [summary_value(tag, tensor, content)]


# Bad metadata contents: (content, what the error message names). Each one must be refused with
# `UnsupportedFormatError` only, saying what is wrong.
_VALID = _stats_content().decode()
BAD_METADATA = {
    "not_utf8": (b"\xff\xfe not json", "not valid"),
    "not_json": (b"{\"format_version\": [1, ", "not valid"),
    "not_an_object": (b"[1, 1]", "not a JSON object"),
    "deeply_nested": (b'{"format_version": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid"),
    "version_empty": (_stats_content(format_version=[]), "format_version"),
    "version_overflow": (_VALID.replace(f'"format_version": {json.dumps(list(metadata.FORMAT_VERSION))}',
                                         '"format_version": [1e999, 1]')
                         .encode(), "format_version"),
    "version_bool": (_stats_content(format_version=[True, 1]), "format_version"),
    "version_absurd": (_stats_content(format_version=[1, 10**30]), "format_version"),
    "version_string": (_stats_content(format_version="1.1"), "format_version"),
    "kind_unknown": (_stats_content(kind="scalars"), "'kind'"),
    "kind_not_string": (_stats_content(kind=["stats"]), "'kind'"),
    "name_not_string": (_stats_content(name=7), "'name'"),
    "no_l2_norm": (_stats_content(stats=[s for s in columns.GRADIENT_STATS if s != "l2_norm"]),
                   "lacks l2_norm"),
    "stats_repeated": (_stats_content(stats=list(columns.GRADIENT_STATS) + ["mean"]),
                       "'stats' names 'mean' twice"),
    "stats_not_strings": (_stats_content(stats=list(columns.GRADIENT_STATS) + [None]),
                          "stats[11]"),
    "variables_not_strings": (_stats_content(variables=[1, 2]), "variables[0]"),
    "variables_repeated": (_stats_content(variables=["a/kernel", "a/kernel"]),
                           "'variables' names 'a/kernel' twice"),
    "variables_lone_surrogate": (_VALID.replace("a/kernel", "\\ud800").encode(),
                                 "variables[0] is '\\ud800', not valid Unicode"),
    "variables_missing": (_stats_content(variables=None), "'variables'"),
    "layers_not_strings": (_stats_content(layers=[["a"], "b"]), "layers[0]"),
    "layers_too_few": (_stats_content(layers=["a"]), "1 'layers' for 2 'variables'"),
    "shape_negative": (_stats_content(shapes=[[-1], None]), "shapes[0]"),
    "shape_float": (_stats_content(shapes=[[2.5], None]), "shapes[0]"),
    "shape_bool": (_stats_content(shapes=[None, [True]]), "shapes[1]"),
    "shape_huge": (_stats_content(shapes=[[10**30], None]), "shapes[0]"),
    "shapes_too_few": (_stats_content(shapes=[None]), "'shapes'"),
    "histogram_bins_short": (_histogram_content(bins=["zero"]), "'bins'"),
    "histogram_bins_not_strings": (_histogram_content(bins=list(range(columns.HISTOGRAM_BINS))),
                                   "bins[0]"),
    "histogram_edges_nan": (_histogram_content().decode().replace("-20.0", "NaN").encode(),
                            "log10_edges[0] is nan"),
    "histogram_edges_decreasing": (_histogram_content(
        log10_edges=list(reversed(columns.HISTOGRAM_LOG10_EDGES))), "log10_edges[1]"),
    "newer_major_version": (_stats_content(format_version=[2, 0]), "pip install -U"),
}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """A good run next to every kind of damaged run (the FIFO and /dev/zero live elsewhere)."""
    root = tmp_path_factory.mktemp("damaged")
    _write_good_run(root / "good")
    for variant, (content, _) in BAD_METADATA.items():
        write_event_file(root / "bad_metadata" / variant,
                         [_logged(0, "gradients", _matrix(), content)])

    first = [_logged(0, "gradients", _matrix(), _stats_content())]
    write_event_file(root / "bomb", first + [
        _logged(1, "gradients", bomb_tensor()),  # 4.4 TB once expanded, in a few hundred bytes
        _logged(2, "gradients", tensor_proto(types_pb2.DT_STRING, [2, 11], string_val=[b"x"])),
        _logged(3, "gradients", tensor_proto(types_pb2.DT_INT32, [2, 11], int_val=[1])),
        _logged(4, "gradients", _matrix(rows=3)),
        _logged(5, "gradients", _matrix(value=5.0)),
    ])
    write_event_file(root / "bomb_only", [_logged(0, "gradients", bomb_tensor(), _stats_content())])

    flip_byte(_write_good_run(root / "flipped_data"), 5, "data")
    flip_byte(_write_good_run(root / "flipped_length"), 5, "length")
    (root / "garbage").mkdir()
    (root / "garbage" / "events.out.tfevents.garbage").write_bytes(
        np.random.default_rng(1).bytes(4096))

    # A restarted writer with another model under the same tag, in a later file.
    write_event_file(root / "later_layout", [
        _logged(step, "gradients", _matrix(), _stats_content() if step == 0 else None)
        for step in range(3)
    ], name="events.out.tfevents.1.first")
    # Same matrix shape, other variables: only the metadata tells its rows apart.
    write_event_file(root / "later_layout", [
        _logged(step, "gradients", _matrix(value=7.0),
                _stats_content(["x/kernel", "y/kernel"]) if step == 3 else None)
        for step in range(3, 6)
    ], name="events.out.tfevents.2.second")

    write_event_file(root / "histogram_mismatch", [
        _logged(0, "gradients", _matrix(), _stats_content()),
        _logged(0, "gradients_histograms", _matrix(rows=1, width=columns.HISTOGRAM_BINS),
                _histogram_content(CRAFTED_VARIABLES[:1])),
    ])

    _write_good_run(root / CONTROL_RUN, variables=["first/kernel", CONTROL_VARIABLE, "z/kernel"])
    write_event_file(root / BROKEN_CONTROL_RUN,
                     [_logged(0, "gradients\x1b[1m", _matrix(), _stats_content(format_version=[]))])
    return root


def _problems(report, run):
    return [p for p in report.problems if p.run == run]


@pytest.fixture(scope="module")
def report(logdir):
    return reader.read_logdir_report(str(logdir))


def test_the_good_run_comes_back_whole(logdir, report):
    alone = reader.read_logdir_report(str(logdir / "good"))
    assert alone.problems == ()
    expected, got = alone.runs["."]["gradients"], report.runs["good"]["gradients"]
    assert list(got.steps) == list(range(GOOD_STEPS)) and got.variables == tuple(GOOD_VARIABLES)
    np.testing.assert_array_equal(got.values, expected.values)
    np.testing.assert_array_equal(got.histograms.counts, expected.histograms.counts)
    assert got.damaged_points == 0 and _problems(report, "good") == []


@pytest.mark.parametrize("variant", sorted(BAD_METADATA))
def test_bad_metadata_is_refused_with_what_is_wrong(variant):
    content, message = BAD_METADATA[variant]
    with pytest.raises(tg.UnsupportedFormatError) as caught:
        metadata.parse_plugin_data(content)
    assert type(caught.value) is tg.UnsupportedFormatError and message in str(caught.value)


@pytest.mark.parametrize("variant", sorted(BAD_METADATA))
def test_a_run_with_bad_metadata_is_reported_and_skipped(logdir, report, variant):
    run = f"bad_metadata/{variant}"
    assert run not in report.runs
    (problem,) = _problems(report, run)
    assert (problem.kind, problem.tag) == (reader.UNREADABLE, "gradients")
    assert BAD_METADATA[variant][1] in problem.message
    assert os.path.dirname(problem.path) == str(logdir / "bad_metadata" / variant)


def test_tensors_unlike_their_metadata_are_refused_before_decoding(report):
    series = report.runs["bomb"]["gradients"]
    assert list(series.steps) == [0, 5] and series.damaged_points == 4
    assert series.values[1, 0, 0] == 5.0
    (problem,) = _problems(report, "bomb")
    assert problem.kind == reader.DAMAGED and problem.tag == "gradients"
    assert problem.message == (
        "4 point(s) refused: a tensor of shape [1048576, 1048576] where the metadata says [2, 11]; "
        f"a tensor of dtype {types_pb2.DT_STRING} where floats are expected; "
        f"a tensor of dtype {types_pb2.DT_INT32} where floats are expected")


def test_a_tag_with_no_readable_point_is_unreadable(report):
    assert "bomb_only" not in report.runs
    kinds = [(p.kind, p.tag) for p in _problems(report, "bomb_only")]
    assert kinds == [(reader.DAMAGED, "gradients"), (reader.UNREADABLE, "gradients")]


def test_a_record_with_a_flipped_byte_is_skipped_and_the_rest_kept(report):
    series = report.runs["flipped_data"]["gradients"]
    assert list(series.steps) == [s for s in range(GOOD_STEPS) if s != 5]
    (problem,) = _problems(report, "flipped_data")
    assert (problem.kind, problem.tag) == (reader.DAMAGED, None)
    assert problem.message == "1 damaged record(s) skipped" and "tfevents" in problem.path


def test_broken_framing_ends_the_file_and_says_how_much_was_lost(report):
    assert list(report.runs["flipped_length"]["gradients"].steps) == [0, 1, 2, 3, 4]
    (problem,) = _problems(report, "flipped_length")
    assert problem.kind == reader.DAMAGED
    assert "framing is broken at byte" in problem.message
    assert "bytes were not read" in problem.message


def test_a_file_without_one_intact_record_is_unreadable(report):
    (problem,) = _problems(report, "garbage")
    assert (problem.kind, problem.tag) == (reader.UNREADABLE, None)
    assert problem.message.startswith("no record read: the record framing is broken at byte 0")


def test_a_later_file_with_another_layout_is_not_shown_under_the_first_names(report):
    series = report.runs["later_layout"]["gradients"]
    assert series.variables == tuple(CRAFTED_VARIABLES) and list(series.steps) == [0, 1, 2]
    assert series.damaged_points == 3 and not (series.values == 7.0).any()
    (problem,) = _problems(report, "later_layout")
    assert problem.kind == reader.DAMAGED and problem.path.endswith("events.out.tfevents.2.second")
    assert "3 point(s) refused" in problem.message and "'x/kernel'" in problem.message


def test_histograms_of_another_layout_are_left_out_and_the_statistics_kept(report):
    series = report.runs["histogram_mismatch"]["gradients"]
    assert list(series.steps) == [0] and series.histograms is None
    (problem,) = _problems(report, "histogram_mismatch")
    assert (problem.kind, problem.tag) == (reader.DAMAGED, "gradients_histograms")
    # The plugin says the same (`reader.histograms_mismatch`, see test_server_robustness).
    assert problem.message == (
        "histograms left out: 'gradients_histograms' is a histograms tag of 1 variable(s) "
        "('a/kernel') where 'gradients' is a stats tag of 2 variable(s) ('a/kernel', "
        f"'b/kernel') x {len(columns.GRADIENT_STATS)} stats, so their rows would be misnamed")


def test_read_logdir_returns_the_good_runs_and_warns_per_problem(logdir, report, caplog):
    with caplog.at_level("WARNING", logger="tensorboard_gradients.format.reader"):
        runs = tg.read_logdir(str(logdir))
    assert sorted(runs) == sorted(report.runs)
    assert len(caplog.records) == len(report.problems)
    assert "Unreadable gradients data: run 'bad_metadata/no_l2_norm'" in caplog.text


def test_read_events_reports_its_damage(logdir):
    def steps(run, damage):
        (path,) = (logdir / run).glob("*tfevents*")
        return [e.step for e in event_files.read_events(str(path), damage)
                if e.HasField("summary")]

    intact, damage = event_files.ReadDamage(), event_files.ReadDamage()
    expected = steps("good", intact)
    expected.remove(5)  # the flipped record: step 5's statistics
    assert steps("flipped_data", damage) == expected and not intact
    assert (damage.skipped_records, damage.framing_broken_at) == (1, None) and damage


def test_a_symlink_to_an_event_file_is_read(tmp_path):
    _write_good_run(tmp_path / "good")
    (path,) = (tmp_path / "good").glob("*tfevents*")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "events.out.tfevents.link").symlink_to(path)
    report = reader.read_logdir_report(str(tmp_path))
    assert report.problems == ()
    np.testing.assert_array_equal(report.runs["linked"]["gradients"].values,
                                  report.runs["good"]["gradients"].values)


# --- the CLI, as a subprocess: a hang or a runaway allocation fails the test ----------------

def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def diagnose(logdir, *args):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "tensorboard_gradients", "diagnose", str(logdir), *args],
        capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory,
        env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
    )
    result.seconds = time.monotonic() - started
    return result


def _stderr_lines(result, kind):
    return [line for line in result.stderr.splitlines()
            if line.startswith(f"tensorboard-gradients: {kind}: ")]


def test_cli_reports_every_bad_run_and_still_finds_the_good_runs_alert(logdir, report):
    result = diagnose(logdir, "--fail-on", "nonfinite")
    assert result.returncode == 1, result.stderr
    rows = [line for line in result.stdout.splitlines()[1:] if " good " in line]
    assert len(rows) == 1 and "nonfinite" in rows[0] and f"{NAN_STEP}-{GOOD_STEPS - 1}" in rows[0]
    unreadable = _stderr_lines(result, reader.UNREADABLE)
    damaged = _stderr_lines(result, reader.DAMAGED)
    assert len(unreadable) + len(damaged) == len(report.problems) == len(
        result.stderr.splitlines())
    for variant in BAD_METADATA:
        assert sum(f"run 'bad_metadata/{variant}', tag 'gradients'" in line
                   for line in unreadable) == 1


def test_cli_exits_3_when_nothing_failed_but_something_could_not_be_read(logdir):
    result = diagnose(logdir, "--fail-on", "exploding")
    assert result.returncode == 3, result.stderr
    assert "nonfinite" in result.stdout  # the alerts are still printed


def test_cli_on_one_good_run_ignores_the_broken_ones(logdir):
    result = diagnose(logdir, "--run", "good", "--fail-on", "none")
    assert (result.returncode, result.stderr) == (0, "")
    assert diagnose(logdir, "--run", "good").returncode == 1  # its NaN: critical


def test_cli_exit_status_per_selected_run(logdir):
    result = diagnose(logdir, "--run", "bad_metadata/newer_major_version")
    assert result.returncode == 2 and "could not be read (see above)" in result.stderr
    assert "pip install -U" in result.stderr
    result = diagnose(logdir, "--run", "flipped_data", "--fail-on", "any")
    assert result.returncode == 1 and _stderr_lines(result, reader.DAMAGED)
    result = diagnose(logdir, "--run", "flipped_data", "--fail-on", "exploding")
    assert result.returncode == 0 and "1 damaged record(s) skipped" in result.stderr
    result = diagnose(logdir, "--run", "histogram_mismatch", "--tag", "gradients")
    assert result.returncode == 0 and "histograms left out" in result.stderr
    result = diagnose(logdir, "--run", "good", "--tag", "nope")
    assert result.returncode == 2 and "no gradients for tag 'nope'" in result.stderr


def test_cli_json_lists_the_problems(logdir, report):
    result = diagnose(logdir, "--json", "--fail-on", "none")
    assert result.returncode == 3, result.stderr
    assert diagnose(logdir).returncode == 1  # an alert found outranks what was not read
    document = json.loads(result.stdout)
    assert [tuple(p.values()) for p in document["problems"]] == [
        (p.kind, p.run, p.tag, p.path, p.message) for p in report.problems
    ]
    assert {a["run"] for a in document["alerts"]} >= {"good", CONTROL_RUN}


def test_cli_escapes_control_characters_from_the_logdir(logdir):
    result = diagnose(logdir, "--run", CONTROL_RUN, "--fail-on", "none")
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "evil\\x1b]0;pwned\\x07/kernel" in result.stdout
    assert "ctl\\x1b[31m" in result.stdout
    result = diagnose(logdir, "--run", BROKEN_CONTROL_RUN)
    assert result.returncode == 2
    assert "\x1b" not in result.stderr and len(result.stderr.splitlines()) == 2
    assert "ctl_bad\\x1b[2J\\nrun" in result.stderr and "gradients\\x1b[1m" in result.stderr


@pytest.fixture(scope="module")
def special_files(tmp_path_factory):
    """A good run, a FIFO and a symlink to /dev/zero, both named like event files."""
    root = tmp_path_factory.mktemp("special")
    _write_good_run(root / "good")
    (root / "fifo").mkdir()
    os.mkfifo(root / "fifo" / "events.out.tfevents.x")
    (root / "zero").mkdir()
    (root / "zero" / "events.out.tfevents.y").symlink_to("/dev/zero")
    return root


def test_cli_never_opens_a_fifo_or_reads_dev_zero(special_files):
    result = diagnose(special_files, "--fail-on", "exploding")
    assert result.returncode == 3, result.stderr
    assert result.seconds < TIMEOUT_S / 2
    assert " good " in result.stdout
    lines = _stderr_lines(result, reader.UNREADABLE)
    assert len(lines) == 2
    assert "run 'fifo'" in lines[0] and "is a FIFO, not a regular file" in lines[0]
    assert "run 'zero'" in lines[1] and "is a character device" in lines[1]


def test_read_logdir_skips_a_fifo_and_dev_zero_in_bounded_time_and_memory(special_files):
    script = ("import sys, tensorboard_gradients.format.reader as r; "
              "report = r.read_logdir_report(sys.argv[1]); "
              "print(sorted(report.runs), [(p.run, p.kind) for p in report.problems])")
    result = subprocess.run([sys.executable, "-c", script, str(special_files)], capture_output=True,
                            text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory,
                            env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['good'] [('fifo', 'unreadable'), ('zero', 'unreadable')]"
