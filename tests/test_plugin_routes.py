"""Every HTTP route over TensorBoard's Python-loader data provider, including hostile queries."""

import csv
import io
import json
import pathlib
import urllib.parse

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients import analysis
from tensorboard_gradients.format import columns
from tensorboard_gradients.server import answers, plugin, store, vocabulary
from tensorboard_gradients.server.store import provider as provider_source

BASE = "/data/plugin/gradients/"
STEPS = 60
NAN_STEP, INF_STEP = 40, 45
VARIABLES = ["dense/kernel", "dense/bias", "out/kernel"]


def gradients_at(step):
    grads = {
        "dense/kernel": np.full((3, 3), 1.0, np.float32),
        "dense/bias": np.full(3, 0.1, np.float32),
        "out/kernel": np.full((3, 2), 1.0, np.float32),
    }
    if step == NAN_STEP:
        grads["dense/kernel"][0, 0] = np.nan
    if step == INF_STEP:
        grads["out/kernel"][:] = 3e38  # finite entries whose float32 norm overflows to +Inf
    return grads


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("routes")
    with tg.GradientWriter(str(root / "train")) as writer:
        for step in range(STEPS):
            if step % 20 == 0:
                writer.write_epoch(step, step // 20)
            writer.write(step, gradients_at(step), histograms=step % 10 == 0)
    with tg.GradientWriter(str(root / "plain")) as writer:
        for step in range(5):
            writer.write(step, {"<b>x</b>/kernel": np.ones(2), "ü/bias": np.zeros(2)})
    return str(root)


@pytest.fixture(scope="module")
def client(served, plugin_client):
    return plugin_client(served)


def get(client, route, **params):
    response = client.get(BASE + route + ("?" + urllib.parse.urlencode(params) if params else ""))
    body = response.get_data()
    return response.status_code, (json.loads(body) if response.mimetype == "application/json" else body)


def test_runs(client):
    status, runs = get(client, "runs")
    assert status == 200
    assert runs["train"]["gradients"] == {  # "damaged"/"damage" only when there is some
        "variables": 3, "steps": STEPS, "stats": list(columns.GRADIENT_STATS),
        "histograms": True, "epochs": 3, "sampled": None,
    }
    assert runs["plain"]["gradients"]["histograms"] is False
    assert runs["plain"]["gradients"]["epochs"] == 0
    assert set(runs["train"]) == {"gradients"}  # histogram and epoch tags are not listed


def test_heatmap_shape_and_non_finite_encoding(client):
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm")
    assert status == 200
    assert set(body) == {
        "run", "tag", "stat", "rows", "variables", "layers", "steps", "last_steps", "wall_times",
        "values", "classes", "epochs", "downsampled", "sampled", "steps_to_read", "damaged",
        "damage",
    }
    assert body["steps_to_read"] == 0
    assert (body["damaged"], body["damage"]) == (0, [])
    assert body["variables"] == VARIABLES and body["layers"] == ["dense", "dense", "out"]
    assert body["steps"] == list(range(STEPS)) and not body["downsampled"]
    assert len(body["wall_times"]) == STEPS and body["epochs"] == [0, 20, 40]
    assert [len(row) for row in body["values"]] == [STEPS] * 3
    assert body["classes"][0][NAN_STEP] == "nonfinite"
    assert body["values"][2][INF_STEP] == "Infinity"
    assert body["classes"][2][INF_STEP] == "exploding"
    assert body["values"][0][0] == pytest.approx(3.0)
    assert body["classes"][1][0] == "ok"
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="nan_count")
    assert body["values"][0][NAN_STEP] == 1 and body["classes"][0][NAN_STEP] == "nonfinite"


def test_heatmap_columns_are_bounded_by_default(client, monkeypatch):
    monkeypatch.setattr(answers, "MAX_COLUMNS", 7)
    _, bounded = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                     exploding_norm="999")  # a new query: not an answer kept from another test
    _, asked = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                   exploding_norm="999", max_steps=7)
    assert bounded == asked and len(bounded["steps"]) <= 7 and bounded["downsampled"]
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       max_steps=8)
    assert status == 400 and "from 1 to 7" in body["error"]


def test_a_json_heatmap_merges_to_a_bounded_number_of_cells(client, monkeypatch):
    monkeypatch.setattr(answers, "MAX_JSON_CELLS", 3 * 4)  # 3 variables: at most 4 columns
    params = dict(run="train", tag="gradients", stat="l2_norm", max_steps=30, exploding_norm="998")
    _, listed = get(client, "heatmap", **params)
    assert len(listed["steps"]) == 4 and listed["downsampled"]
    assert "nonfinite" in listed["classes"][0]  # merged, never hiding the worst
    _, packed = get(client, "heatmap", encoding="base64", **params)
    assert packed["shape"] == [3, 30]


def test_heatmap_merging_never_hides_the_worst(client):
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm", max_steps=7)
    assert status == 200 and body["downsampled"]
    assert len(body["steps"]) <= 7 and all(len(row) == len(body["steps"]) for row in body["values"])
    column = max(i for i, s in enumerate(body["steps"]) if s <= INF_STEP)
    assert body["classes"][2][column] == "exploding" and body["values"][2][column] == "Infinity"
    column = max(i for i, s in enumerate(body["steps"]) if s <= NAN_STEP)
    assert body["classes"][0][column] == "nonfinite"
    assert body["last_steps"][-1] == STEPS - 1


def test_heatmap_by_epoch(client):
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       axis="epoch")
    assert status == 200
    assert body["epoch_index"] == [0, 1, 2] and body["steps"] == [0, 20, 40]
    assert body["classes"][0] == ["ok", "ok", "nonfinite"]
    assert body["classes"][2] == ["ok", "ok", "exploding"]
    status, body = get(client, "heatmap", run="plain", tag="gradients", stat="l2_norm",
                       axis="epoch")
    assert status == 400 and "no epoch marks" in body["error"]


def test_threshold_overrides_change_classes(client):
    _, default = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm")
    _, lowered = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                     exploding_norm="2")
    assert default["classes"][0][0] == "ok" and lowered["classes"][0][0] == "exploding"
    assert lowered["classes"][1][0] == "ok"  # the bias (norm 0.17) stays below 2


def test_alerts(client):
    status, body = get(client, "alerts", run="train", tag="gradients")
    assert status == 200
    alerts = body["alerts"]
    assert alerts[0]["kind"] == "nonfinite" and alerts[0]["variable"] == "dense/kernel"
    assert alerts[0]["first_step"] == NAN_STEP and alerts[0]["severity"] == "critical"
    exploding = [a for a in alerts if a["kind"] == "exploding" and a["rule"] == "absolute"]
    assert exploding[0]["variable"] == "out/kernel" and exploding[0]["value"] == "Infinity"
    severities = [["critical", "warning", "info"].index(a["severity"]) for a in alerts]
    assert severities == sorted(severities)
    status, body = get(client, "alerts", run="plain", tag="gradients")
    assert status == 200  # the all-zero bias: its layer vanishing, it dead; not the kernel
    assert {(a["kind"], a["variable"] or a["layer"]) for a in body["alerts"]} == {
        ("vanishing", "ü"), ("dead", "ü/bias")}


def test_series(client):
    status, body = get(client, "series", run="train", tag="gradients", variable="dense/kernel")
    assert status == 200
    assert body["layer"] == "dense" and body["shape"] == [3, 3]
    assert body["steps"] == list(range(STEPS))
    assert set(body["stats"]) == set(columns.GRADIENT_STATS)
    assert body["stats"]["nan_count"][NAN_STEP] == 1
    assert body["stats"]["l2_norm"][NAN_STEP] == pytest.approx(np.sqrt(8))
    assert body["classes"][NAN_STEP] == "nonfinite" and body["epochs"] == [0, 20, 40]


def test_histogram_at_nearest_logged_step(client):
    status, body = get(client, "histogram", run="train", tag="gradients",
                       variable="dense/kernel", step=38)
    assert status == 200
    assert body["step"] == NAN_STEP and body["requested_step"] == 38
    counts = dict(zip(body["bins"], body["counts"]))
    assert counts["nan"] == 1 and sum(body["counts"]) == 9
    assert body["steps"] == list(range(0, STEPS, 10))
    status, body = get(client, "histogram", run="train", tag="gradients",
                       variable="dense/kernel", step=10**12)
    assert status == 200 and body["step"] == 50
    status, body = get(client, "histogram", run="train", tag="gradients",
                       variable="dense/kernel", step=2**63 - 1)
    assert status == 200 and body["step"] == 50
    status, body = get(client, "histogram", run="plain", tag="gradients",
                       variable="ü/bias", step=0)
    assert status == 404 and "no histograms" in body["error"]


def test_variables_can_be_named_by_their_row_instead_of_their_name(client):
    for route, extra in (("series", {}), ("histogram", {"step": 38})):
        _, by_name = get(client, route, run="train", tag="gradients", variable="out/kernel",
                         **extra)
        status, by_index = get(client, route, run="train", tag="gradients", variable_index=2,
                               **extra)
        assert status == 200 and by_index == by_name
        assert (by_index["variable"], by_index["variable_index"]) == ("out/kernel", 2)
    status, body = get(client, "series", run="train", tag="gradients")
    assert status == 400 and "exactly one of" in body["error"]


def test_export_csv_long_format(client):
    response = client.get(BASE + "export?run=train&tag=gradients&format=csv")
    assert response.status_code == 200 and response.mimetype == "text/csv"
    assert "attachment" in response.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.get_data(as_text=True))))
    assert len(rows) == STEPS * len(VARIABLES)
    assert list(rows[0])[:3] == ["step", "variable", "layer"]
    nan_row = next(r for r in rows if r["step"] == str(NAN_STEP) and r["variable"] == "dense/kernel")
    assert float(nan_row["nan_count"]) == 1 and float(nan_row["l2_norm"]) == pytest.approx(np.sqrt(8))
    inf_row = next(r for r in rows if r["step"] == str(INF_STEP) and r["variable"] == "out/kernel")
    assert float(inf_row["l2_norm"]) == np.inf
    html = client.get(BASE + "export?run=plain&tag=gradients&format=csv").get_data(as_text=True)
    assert '<b>x</b>/kernel' in html and "ü/bias" in html


def test_names_with_html_and_unicode_round_trip(client):
    status, body = get(client, "heatmap", run="plain", tag="gradients", stat="l2_norm")
    assert status == 200 and body["variables"] == ["<b>x</b>/kernel", "ü/bias"]
    status, body = get(client, "series", run="plain", tag="gradients", variable="ü/bias")
    assert status == 200 and body["stats"]["zero_fraction"] == [1.0] * 5


HOSTILE = [
    ("heatmap", {}, 400),
    ("heatmap", {"run": "train", "tag": "gradients"}, 400),
    ("heatmap", {"run": "nope", "tag": "gradients", "stat": "l2_norm"}, 404),
    ("heatmap", {"run": "train", "tag": "nope", "stat": "l2_norm"}, 404),
    ("heatmap", {"run": "train", "tag": "gradients_histograms", "stat": "l2_norm"}, 404),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "nope"}, 404),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "0"}, 400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "-5"}, 400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "1e3"}, 400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "9" * 5000},
     400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "9" * 30},
     400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "10001"},
     400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "max_steps": "10000"},
     200),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm",
                 "first_step": str(2**63)}, 400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm",
                 "last_step": str(2**63 - 1)}, 200),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "axis": "layer"}, 400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "exploding_norm": "nan"},
     400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "exploding_norm": "-1"},
     400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "sustain_steps": "1e99"},
     400),
    ("heatmap", {"run": "train", "tag": "gradients", "stat": "l2_norm", "bogus": "1"}, 400),
    ("heatmap", {"run": "<script>alert(1)</script>", "tag": "gradients", "stat": "l2_norm"}, 404),
    ("heatmap", {"run": "../../etc/passwd", "tag": "gradients", "stat": "l2_norm"}, 404),
    ("heatmap", {"run": "trаin", "tag": "gradients", "stat": "l2_norm"}, 404),  # Cyrillic a
    ("alerts", {"run": "train"}, 400),
    ("alerts", {"run": "train", "tag": "gradients", "spike_window": "0"}, 400),
    ("series", {"run": "train", "tag": "gradients"}, 400),
    ("series", {"run": "train", "tag": "gradients", "variable": "../dense/kernel"}, 404),
    ("series", {"run": "train", "tag": "gradients", "variable": "\u0000"}, 404),
    ("histogram", {"run": "train", "tag": "gradients", "variable": "dense/kernel"}, 400),
    ("histogram", {"run": "train", "tag": "gradients", "variable": "dense/kernel", "step": "-1"},
     400),
    ("histogram", {"run": "train", "tag": "gradients", "variable": "dense/kernel", "step": "x"},
     400),
    ("histogram", {"run": "train", "tag": "gradients", "variable": "nope", "step": "3"}, 404),
    ("histogram", {"run": "train", "tag": "gradients", "variable": "dense/kernel",
                   "step": str(2**63)}, 400),
    ("histogram", {"run": "train", "tag": "gradients", "variable_index": "3", "step": "3"}, 404),
    ("histogram", {"run": "train", "tag": "gradients", "variable_index": "-1", "step": "3"}, 400),
    ("histogram", {"run": "train", "tag": "gradients", "variable": "dense/kernel",
                   "variable_index": "0", "step": "3"}, 400),
    ("series", {"run": "train", "tag": "gradients", "variable_index": str(2**63)}, 400),
    ("series", {"run": "train", "tag": "gradients", "variable_index": "x"}, 400),
    ("export", {"run": "train", "tag": "gradients"}, 400),
    ("export", {"run": "train", "tag": "gradients", "format": "xlsx"}, 400),
    ("export", {"run": "nope", "tag": "gradients", "format": "csv"}, 404),
    ("runs", {"run": "x"}, 400),
]


@pytest.mark.parametrize("route,params,expected", HOSTILE)
def test_bad_queries_get_a_clear_4xx_never_a_500(client, route, params, expected):
    status, body = get(client, route, **params)
    assert status == expected, body
    if expected != 200:
        assert isinstance(body, dict) and body["error"]


def test_a_bug_that_raises_a_value_error_is_a_logged_500_not_a_bad_request(client, monkeypatch,
                                                                           caplog):
    """Only deliberate validation errors answer 400: a ValueError from numpy code (a bug) is a
    JSON 500, its traceback in TensorBoard's log, so it never reads as the user's mistake."""
    def broken(*args, **kwargs):
        np.broadcast_shapes((3,), (5,))  # raises ValueError, as a bug in numpy code would

    monkeypatch.setattr(answers, "alerts_answer", broken)
    status, body = get(client, "alerts", run="train", tag="gradients", exploding_norm="2.5")
    assert status == 500 and "internal error" in body["error"] and "ValueError" in body["error"]
    assert any(record.exc_info and record.exc_info[0] is ValueError for record in caplog.records)
    # The same route's deliberate errors are still 400 and 404.
    assert get(client, "alerts", run="train", tag="gradients", exploding_norm="x")[0] == 400
    assert get(client, "alerts", run="nope", tag="gradients")[0] == 404


def test_repeated_parameters_are_refused(client):
    response = client.get(BASE + "heatmap?run=train&run=plain&tag=gradients&stat=l2_norm")
    assert response.status_code == 400
    assert "more than once" in json.loads(response.get_data())["error"]


@pytest.mark.parametrize("path", [
    "static/../cli.py", "static/%2e%2e/cli.py", "static/..%2fcli.py",
    "static//etc/passwd", "static/%2fetc%2fpasswd", "static/nope.js", "static/",
    "static/..\\cli.py",
])
def test_static_files_cannot_escape_their_folder(client, path):
    response = client.get(BASE + path)
    assert response.status_code == 404
    assert b"import" not in response.get_data()  # cli.py, one folder up, imports


def test_static_files_are_served_with_their_type(client, monkeypatch, tmp_path):
    (tmp_path / "index.js").write_text("export function render() {}\n")
    monkeypatch.setattr(plugin, "STATIC_DIR", str(tmp_path))
    response = client.get(BASE + "static/index.js")
    assert response.status_code == 200 and response.mimetype == "text/javascript"
    assert b"render" in response.get_data()


def test_frontend_metadata_names_the_tab_and_module():
    meta = plugin.GradientsPlugin.__new__(plugin.GradientsPlugin).frontend_metadata()
    assert meta.tab_name == "Gradients" and meta.es_module_path == "/static/index.js"


def test_new_steps_are_served_after_a_reload(tmp_path, plugin_client):
    with tg.GradientWriter(str(tmp_path / "live")) as writer:
        for step in range(3):
            writer.write(step, {"a/kernel": np.ones(2)})
        writer.flush()  # the queued writes on disk, as a live run's are a moment later
        client = plugin_client(str(tmp_path))
        assert get(client, "runs")[1]["live"]["gradients"]["steps"] == 3
        assert get(client, "heatmap", run="live", tag="gradients", stat="l2_norm")[1]["steps"] == [
            0, 1, 2]
        for step in range(3, 5):
            writer.write(step, {"a/kernel": np.ones(2) * step})
    client.reload()
    assert get(client, "runs")[1]["live"]["gradients"]["steps"] == 5
    _, body = get(client, "heatmap", run="live", tag="gradients", stat="l2_norm")
    assert body["steps"] == [0, 1, 2, 3, 4] and body["values"][0][4] == pytest.approx(4 * np.sqrt(2))


class _TooBigForOneRead(Exception):
    class _Code:
        name = "RESOURCE_EXHAUSTED"

    def code(self):
        return self._Code()


@pytest.fixture(scope="module")
def provider(served):
    """The Python loader's data provider over `served`, as TensorBoard makes it."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gradients": 0})
    multiplexer.AddRunsFromDirectory(served)
    multiplexer.Reload()
    return data_provider.MultiplexerDataProvider(multiplexer, served)


def test_a_tag_over_the_data_servers_message_limit_is_read_sampled_and_says_so(provider):
    """The Rust data server's gRPC answer is capped at 256 MiB; that needs ~440 MB on disk to
    reproduce, so this test stands a provider in front of the real one that fails like gRPC."""
    real = provider

    class CappedProvider:
        def list_tensors(self, ctx, **kwargs):
            return real.list_tensors(ctx, **kwargs)

        def read_scalars(self, ctx, **kwargs):
            return real.read_scalars(ctx, **kwargs)

        def read_tensors(self, ctx, *, downsample, run_tag_filter, **kwargs):
            if run_tag_filter.tags == {"gradients"} and downsample > 50:
                raise _TooBigForOneRead()
            return real.read_tensors(
                ctx, downsample=downsample, run_tag_filter=run_tag_filter, **kwargs
            )

    data = store.Store(CappedProvider())
    original = provider_source._SAMPLED_READ_BYTES
    # 100 float32 points: too many, then 50
    provider_source._SAMPLED_READ_BYTES = 100 * 3 * 11 * 4
    try:
        from tensorboard import context

        source = data.source(context.RequestContext(), "", "train", "gradients")
    finally:
        provider_source._SAMPLED_READ_BYTES = original
    assert len(source.steps()) == 50 and STEPS - 1 in source.steps()
    assert "--load_fast=false" in source.sampled
    with pytest.raises(store.UnreadableTagError, match="RuntimeError: boom"):
        store.Store(type("Broken", (), {
            "list_tensors": CappedProvider.list_tensors,
            "read_tensors": lambda self, ctx, **kw: (_ for _ in ()).throw(RuntimeError("boom")),
        })()).source(context.RequestContext(), "", "train", "gradients")


@pytest.mark.parametrize("encoding", ["json", "base64"])  # base64 is packed another way
def test_heatmap_is_gzipped_for_browsers_and_plain_for_others(client, encoding):
    import gzip

    url = BASE + f"heatmap?run=train&tag=gradients&stat=l2_norm&max_steps=9&encoding={encoding}"
    zipped = client.get(url, headers={"Accept-Encoding": "gzip, deflate"})
    assert zipped.headers["Content-Encoding"] == "gzip"
    plain = client.get(url)
    assert "Content-Encoding" not in plain.headers
    assert json.loads(gzip.decompress(zipped.get_data())) == json.loads(plain.get_data())


def test_heatmap_base64_encoding_carries_the_same_matrix(client):
    import base64

    params = dict(run="train", tag="gradients", stat="l2_norm", max_steps=9)
    _, listed = get(client, "heatmap", **params)
    status, packed = get(client, "heatmap", encoding="base64", **params)
    assert status == 200 and packed["encoding"] == "base64"
    rows, columns = packed["shape"]
    assert (rows, columns) == (len(VARIABLES), len(listed["steps"]))
    values = np.frombuffer(base64.b64decode(packed["values"]), "<f4").reshape(rows, columns)
    codes = np.frombuffer(base64.b64decode(packed["classes"]), np.uint8).reshape(rows, columns)
    decoded = [[packed["class_names"][c] for c in row] for row in codes]
    assert decoded == listed["classes"]
    as_numbers = [[float(v) if not isinstance(v, str) else float(v.replace("Infinity", "inf"))
                   for v in row] for row in listed["values"]]
    np.testing.assert_allclose(values, np.array(as_numbers, dtype=np.float32), rtol=1e-6)
    assert np.isposinf(values).any()
    assert packed["steps"] == listed["steps"] and packed["variables"] == listed["variables"]
    assert get(client, "heatmap", encoding="xml", **params)[0] == 400


def test_derived_ratio_stats_when_weights_were_logged(tmp_path, plugin_client):
    with tg.GradientWriter(str(tmp_path / "weighted")) as writer:
        for step in range(4):
            writer.write(step, {"a/kernel": np.full(4, 0.5), "a/bias": np.ones(2)},
                         weights={"a/kernel": np.full(4, 2.0), "a/bias": np.zeros(2)})
    client = plugin_client(str(tmp_path))
    stats = get(client, "runs")[1]["weighted"]["gradients"]["stats"]
    assert stats[-2:] == ["weight_l2_norm", "grad_weight_ratio"]
    status, body = get(client, "heatmap", run="weighted", tag="gradients", stat="grad_weight_ratio")
    assert status == 200
    assert body["values"][0] == [pytest.approx(0.25)] * 4
    assert body["values"][1] == ["NaN"] * 4  # a zero weight norm has no ratio
    assert body["classes"][0] == ["ok"] * 4
    status, body = get(client, "series", run="weighted", tag="gradients", variable="a/kernel")
    assert body["stats"]["grad_weight_ratio"] == [pytest.approx(0.25)] * 4
    assert get(client, "heatmap", run="weighted", tag="gradients",
               stat="update_weight_ratio")[0] == 404


def test_heatmap_zoom_into_a_step_range(client):
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       first_step=38, last_step=47, max_steps=100)
    assert status == 200 and body["steps"] == list(range(38, 48))
    assert body["classes"][0][NAN_STEP - 38] == "nonfinite"
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       first_step=55)
    assert body["steps"] == list(range(55, STEPS))
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       last_step=2, axis="epoch")
    assert body["epoch_index"] == [0] and body["last_steps"] == [2]
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       first_step=9, last_step=3)
    assert status == 400 and "must not exceed" in body["error"]


def test_the_tabs_modules_are_served_from_the_package(client):
    response = client.get(BASE + "static/colormap.js")
    assert response.status_code == 200 and response.mimetype == "text/javascript"
    assert b"export function viridis" in response.get_data()


def test_thresholds_route_lists_every_override_with_its_default(client):
    status, body = get(client, "thresholds")
    assert status == 200
    assert list(body["defaults"]) == list(tg.Thresholds.names())
    assert body["defaults"]["exploding_norm"] == 1e3 and body["defaults"]["sustain_steps"] == 5
    assert body["vocabulary"] == vocabulary.vocabulary()
    assert get(client, "thresholds", x="1")[0] == 400


def test_the_vocabulary_covers_every_stat_class_severity_and_threshold_in_table_order():
    served = vocabulary.vocabulary()
    json.dumps(served, allow_nan=False)  # JSON as served
    assert [s["name"] for s in served["stats"]] == [s.name for s in columns.STATS]
    assert [c["name"] for c in served["classes"]] == list(analysis.CLASSES)
    assert [s["name"] for s in served["severities"]] == list(analysis.SEVERITIES)
    assert [t["name"] for t in served["thresholds"]] == list(tg.Thresholds.names())
    assert set(vocabulary.CLASS_STYLES) == set(analysis.CLASSES)
    assert set(vocabulary.SEVERITY_COLORS) == set(analysis.SEVERITIES)
    for stat in served["stats"]:
        assert set(stat) == {"name", "label", "scale", "group", "description", "heatmap"}
        assert stat["scale"] in (columns.LOG, columns.LINEAR, columns.FRACTION, columns.COUNT)
    for cls in served["classes"]:
        assert set(cls) == {"name", "description", "label", "fill", "hatch", "accent", "tooltip",
                            "legend", "empty", "extreme", "norm_threshold", "nonfinite"}
        assert cls["description"] and cls["label"]
        assert cls["norm_threshold"] is None or cls["norm_threshold"] in tg.Thresholds.names()
    assert sum(cls["nonfinite"] for cls in served["classes"]) == 1
    assert [cls["name"] for cls in served["classes"] if cls["empty"]] == ["missing"]
    defaults = tg.Thresholds()
    for threshold in served["thresholds"]:
        assert threshold["default"] == getattr(defaults, threshold["name"])
        assert threshold["label"] and threshold["description"]
    served["classes"][-1]["fill"][0] = 0  # a copy: the styles themselves stay
    assert vocabulary.CLASS_STYLES["nonfinite"]["fill"] == [255, 45, 85]


def test_the_node_tests_use_the_served_vocabulary():
    """frontend/test/ builds the tab's vocabulary from a copy of the served one: kept equal here,
    so the Node tests of the tab can never test a vocabulary the plugin does not serve."""
    copy = pathlib.Path(__file__).parents[1] / "frontend" / "test" / "served_vocabulary.json"
    assert json.loads(copy.read_text(encoding="utf-8")) == vocabulary.vocabulary(), (
        "regenerate it: python -m tensorboard_gradients.server.vocabulary > " + str(copy))


def test_no_class_colour_occurs_in_the_viridis_map_the_values_use():
    """A filled class cell never reads as a value: its colour is far from every viridis colour
    (the tab's map, frontend/colormap.js: matplotlib's viridis, whose hues run from dark purple
    through blue and green to yellow)."""
    viridis = np.array([[68, 1, 84], [72, 40, 120], [62, 73, 137], [49, 104, 142], [38, 130, 142],
                        [31, 158, 137], [53, 183, 121], [110, 206, 88], [181, 222, 43],
                        [253, 231, 37]], dtype=float)
    steps = np.linspace(0, 1, 32)[:, None]
    fine = np.concatenate([a + (b - a) * steps for a, b in zip(viridis[:-1], viridis[1:])])
    for name, style in vocabulary.CLASS_STYLES.items():
        if style["fill"] is not None:
            distance = np.min(np.linalg.norm(fine - np.array(style["fill"], float), axis=1))
            assert distance > 100, (name, distance)


def test_the_answers_are_plain_data_without_http(client, provider):
    """The data-returning layer: each route's dict from a tag's source, no request; the
    source here is TensorBoard's data provider, the served one the plugin's own reader of the
    local logdir: they answer the same."""
    from tensorboard import context

    data = store.Store(provider)
    ctx = context.RequestContext()

    def as_served(route, **params):  # what the route sends, decoded
        return get(client, route, **params)[1]

    def as_json(answer):
        return json.loads(json.dumps(answer, allow_nan=False))

    assert as_json(answers.runs_overview(data, ctx, "")) == as_served("runs")
    loaded = data.source(ctx, "", "train", "gradients")
    lowered = tg.Thresholds(exploding_norm=2)
    heatmap = answers.heatmap_answer(
        loaded, answers.HeatmapQuery("l2_norm", max_steps=7, thresholds=lowered))
    assert heatmap["classes"][0][0] == "exploding" and len(heatmap["steps"]) == 7
    assert as_json(heatmap) == as_served("heatmap", run="train", tag="gradients", stat="l2_norm",
                                         max_steps=7, exploding_norm=2)
    by_epoch = answers.HeatmapQuery("nan_count", by_epoch=True, packed=True)
    assert as_json(answers.heatmap_answer(loaded, by_epoch)) == as_served(
        "heatmap", run="train", tag="gradients", stat="nan_count", axis="epoch",
        encoding="base64")
    with pytest.raises(store.UnknownError, match="no stat 'nope'"):
        answers.heatmap_answer(loaded, answers.HeatmapQuery("nope"))
    assert as_json(answers.alerts_answer(loaded, tg.Thresholds())) == as_served(
        "alerts", run="train", tag="gradients")
    series = answers.series_answer(loaded, 2, tg.Thresholds())
    assert series["variable"] == "out/kernel" and series["classes"][INF_STEP] == "exploding"
    assert as_json(series) == as_served("series", run="train", tag="gradients", variable_index=2)
    histogram = answers.histogram_answer(loaded, 0, 38)
    assert histogram["step"] == NAN_STEP
    assert histogram == as_served("histogram", run="train", tag="gradients", variable_index=0,
                                  step=38)
    with pytest.raises(store.UnknownError, match="no histograms"):
        answers.histogram_answer(data.source(ctx, "", "plain", "gradients"), 0, 0)
    assert answers.thresholds_answer() == as_served("thresholds")


def test_rows_by_layer_combine_each_layers_variables(client):
    """``rows=layers``: heatmap, series and histogram of one row per layer."""
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       rows="layers")
    assert status == 200 and body["rows"] == "layers"
    assert body["variables"] == body["layers"] == ["dense", "out"]
    # dense: a 3x3 kernel of ones and a bias of 0.1s, as one tensor: sqrt(9 + 3 * 0.01).
    assert body["values"][0][0] == pytest.approx(np.sqrt(9.03), rel=1e-6)
    assert body["classes"][0][NAN_STEP] == "nonfinite"  # the worst of its variables
    assert body["classes"][1][INF_STEP] == "exploding" and body["classes"][0][INF_STEP] == "ok"
    status, by_variable = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm")
    assert by_variable["rows"] == "variables" and by_variable["variables"] == VARIABLES
    status, series = get(client, "series", run="train", tag="gradients", variable="dense",
                         rows="layers")
    assert status == 200 and series["variable"] == "dense" and series["shape"] == [12]
    assert series["stats"]["size"][0] == 12 and series["stats"]["nan_count"][NAN_STEP] == 1
    assert series["classes"][NAN_STEP] == "nonfinite"
    status, histogram = get(client, "histogram", run="train", tag="gradients",
                            variable="dense", step=0, rows="layers")
    _, kernel = get(client, "histogram", run="train", tag="gradients",
                    variable="dense/kernel", step=0)
    _, bias = get(client, "histogram", run="train", tag="gradients", variable="dense/bias",
                  step=0)
    assert status == 200 and histogram["variable"] == "dense"
    assert histogram["counts"] == [k + b for k, b in zip(kernel["counts"], bias["counts"])]
    status, body = get(client, "series", run="train", tag="gradients", variable="dense/kernel",
                       rows="layers")
    assert status == 404 and "no variable 'dense/kernel'" in body["error"]
    status, body = get(client, "heatmap", run="train", tag="gradients", stat="l2_norm",
                       rows="tensors")
    assert status == 400 and "'rows' must be one of variables, layers" in body["error"]


def _scalar_loss_run(directory, losses):
    """A run of gradients with its loss logged only as the ordinary scalar ``train/loss``
    (a legacy ``simple_value``, as `torch.utils.tensorboard` writes it)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from tensorboard_gradients.format.event_files import EventFileWriter

    with tg.GradientWriter(str(directory)) as writer:
        for step, loss in enumerate(losses):
            scale = 4.0 if loss > 2 else 1.0  # the gradient climbs with the loss
            writer.write(step, {"dense/kernel": np.full((3, 3), scale, np.float32)})
    scalars = EventFileWriter(str(directory), filename_suffix=".scalars")
    scalars.write(*(event_pb2.Event(step=step, wall_time=1.0, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="train/loss", simple_value=loss)]))
        for step, loss in enumerate(losses)))
    scalars.close()


def test_the_runs_own_loss_scalar_is_judged_when_no_monitor_logged_the_loss(tmp_path,
                                                                          plugin_client):
    from tensorboard import context
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer

    losses = [1.0] * 80 + [1.1, 1.2, 1.3, 1.7, 2.5, 8.0, 8.0, 1.0]
    _scalar_loss_run(tmp_path / "run", losses)
    status, body = get(plugin_client(str(tmp_path)), "alerts", run="run", tag="gradients")
    assert status == 200
    assert [(a["rule"], a["first_step"], a["raised_step"]) for a in body["alerts"]
            if a["kind"] == "loss_spike"] == [("precursor", 84, 84), ("spike", 85, 86)]
    # Through TensorBoard's data provider (a logdir the plugin cannot read itself).
    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={"gradients": 0})
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    source = store.Store(data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))).source(
        context.RequestContext(), "", "run", "gradients")
    rows = source.rows(0, len(losses))
    # A legacy scalar is a float32.
    assert rows.loss_source == "train/loss"
    assert rows.loss.tolist() == np.array(losses, np.float32).astype(float).tolist()
