"""Reading a stats tag whose writer logged only the required gradient stats (format 1.3's
``stats=``): `read_logdir`, the analysis, the writer's digest, the plugin's routes on a real
`tensorboard` (both loaders) and the CLI all work with what was logged and say what was not.
"""

import json
import urllib.error
import urllib.parse

import numpy as np
import pytest

import tensorboard_gradients as tg
from support import TensorBoard, get_json
from tensorboard_gradients import analysis, cli
from tensorboard_gradients.analysis import layers
from tensorboard_gradients.format import columns

STEPS = 30
NAN_STEP = 12  # hidden/kernel gets a NaN entry
EXPLODE_STEP = 20  # out/kernel's norm is above the exploding ceiling from here on
VARIABLES = ["embed/kernel", "hidden/kernel", "hidden/bias", "out/kernel"]
SHAPES = [(4, 4), (4, 3), (3,), (3, 2)]
# What a writer asked for ``stats=("l2_norm",)`` logs: the required stats only.
REDUCED = columns.gradient_stats(("l2_norm",))
NOT_LOGGED = tuple(s for s in columns.GRADIENT_STATS if s not in REDUCED)
HEATMAP_STATS = [s for s in REDUCED if columns.BY_NAME[s].heatmap]


def gradients_at(step, rng):
    """embed/kernel is all zeros (dead, and vanishing), hidden/kernel has a NaN at `NAN_STEP`,
    out/kernel explodes from `EXPLODE_STEP`."""
    grads = {name: rng.normal(size=shape) for name, shape in zip(VARIABLES, SHAPES)}
    grads["embed/kernel"][:] = 0.0
    if step == NAN_STEP:
        grads["hidden/kernel"][0, 0] = np.nan
    if step >= EXPLODE_STEP:
        grads["out/kernel"] *= 1e6
    return grads


def write_run(run_dir, stats=("l2_norm",), steps=STEPS, seed=0):
    """A run of ``steps`` steps of `gradients_at` by a writer asked for ``stats`` (its
    ``stats=``; None: every stat)."""
    rng = np.random.default_rng(seed)
    with tg.GradientWriter(str(run_dir), stats=stats) as writer:
        for step in range(steps):
            writer.write(step, gradients_at(step, rng))


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("reduced_stats")
    write_run(root / "reduced")
    write_run(root / "full", stats=None)
    write_run(root / "std_only", stats=("std",))  # a std without the mean that pools it by layer
    return root


@pytest.fixture(scope="module")
def runs(logdir):
    return tg.read_logdir(str(logdir))


def _kinds(alerts):
    return {alert.kind for alert in alerts}


def test_read_logdir_lists_only_the_logged_stats(runs):
    series = runs["reduced"]["gradients"]
    assert series.stat_names == series.available_stats == columns.REQUIRED_STATS == REDUCED
    assert series.unlogged_stats == NOT_LOGGED
    assert runs["full"]["gradients"].unlogged_stats == ()
    assert runs["std_only"]["gradients"].unlogged_stats == tuple(
        s for s in NOT_LOGGED if s != "std")
    np.testing.assert_array_equal(series.stat("nan_count")[:, 1],
                                  [1 if step == NAN_STEP else 0 for step in range(STEPS)])
    np.testing.assert_allclose(series.stat("l2_norm"), runs["full"]["gradients"].stat("l2_norm"),
                               rtol=1e-6)
    with pytest.raises(KeyError, match="no stat 'zero_fraction'.*have \\['l2_norm'"):
        series.stat("zero_fraction")


def test_the_alerts_fire_and_the_dead_rule_judges_nothing_without_zero_fractions(runs):
    reduced, full = runs["reduced"]["gradients"], runs["full"]["gradients"]
    alerts = tg.diagnose(reduced)
    assert {"nonfinite", "exploding", "vanishing"} <= _kinds(alerts)
    assert "dead" not in _kinds(alerts)
    first = {a.kind: a for a in reversed(alerts)}
    assert (first["nonfinite"].variable, first["nonfinite"].first_step) == ("hidden/kernel",
                                                                            NAN_STEP)
    assert first["exploding"].first_step == EXPLODE_STEP
    # The same gradients with every stat: the dead rule judges, the rest is the same.
    full_alerts = tg.diagnose(full)
    assert [a.variable for a in full_alerts if a.kind == "dead"] == ["embed/kernel"]
    assert [a.to_json() for a in full_alerts if a.kind != "dead"] == [
        a.to_json() for a in alerts]
    np.testing.assert_array_equal(tg.classify(reduced), tg.classify(full))
    # What a report says was not judged, and why.
    assert analysis.lacking(reduced) == {"dead": ("zero_fraction",),
                                         "update_ratio": ("update_weight_ratio",)}
    assert analysis.lacking(full) == {"update_ratio": ("update_weight_ratio",)}


def test_a_stream_fed_in_pieces_judges_a_reduced_run_as_a_whole(runs):
    series = runs["reduced"]["gradients"]
    stream = analysis.AnalysisStream(series, analysis.Thresholds())
    for start in range(0, STEPS, 7):
        stream.feed(series.steps[start:start + 7], series.wall_times[start:start + 7],
                    series.values[start:start + 7])
    stream.close()
    assert [a.to_json() for a in stream.alerts()] == [a.to_json() for a in tg.diagnose(series)]


def test_layers_combine_only_what_was_logged(runs):
    reduced, full = runs["reduced"]["gradients"], runs["full"]["gradients"]
    combined = layers.combined(reduced)
    assert combined.stat_names == REDUCED and combined.variables == ("embed", "hidden", "out")
    np.testing.assert_allclose(combined.stat("l2_norm"), layers.combined(full).stat("l2_norm"),
                               rtol=1e-6)
    assert layers.needed_stats("l2_norm", reduced) == ("l2_norm", "nan_count", "inf_count",
                                                       "size")
    # A std logged without the mean cannot be pooled: no value by layer, the rest combined.
    std_only = layers.combined(runs["std_only"]["gradients"])
    assert np.isnan(std_only.stat("std")).all()
    np.testing.assert_allclose(std_only.stat("abs_max"), combined.stat("abs_max"))
    assert layers.needed_stats("std", runs["std_only"]["gradients"]) == (
        "std", "nan_count", "inf_count", "size")


def test_the_writers_digest_of_a_reduced_run_is_written_and_read(tmp_path, plugin_client,
                                                                  monkeypatch):
    """A long run of the required stats only is answered from its writer's digest: the
    plugin judges no step itself, and answers as for the run read whole."""
    from test_long_runs_served import _get, _plugin_busy

    write_run(tmp_path / "run", steps=1300, seed=1)
    client = plugin_client(str(tmp_path))
    with _plugin_busy(client, monkeypatch) as fed:
        long_alerts = _get(client, "alerts", True, monkeypatch)
        long_heatmap = _get(client, "heatmap", True, monkeypatch, stat="abs_max", rows="layers")
        series = _get(client, "series", True, monkeypatch, variable_index=1)
        assert fed == []  # the writer's digest answered
        response = client.get("/data/plugin/gradients/heatmap?run=run&tag=gradients"
                              "&stat=zero_fraction")
        assert response.status_code == 400
    assert long_alerts["steps_to_read"] == 0 and "dead" not in {
        a["kind"] for a in long_alerts["alerts"]}
    assert long_alerts["alerts"] == _get(client, "alerts", False, monkeypatch)["alerts"]
    assert long_heatmap["variables"] == ["embed", "hidden", "out"]
    assert set(series["stats"]) == set(REDUCED)
    assert _get(client, "runs", True, monkeypatch)["run"]["gradients"]["not_logged"] == list(
        NOT_LOGGED)
    assert _get(client, "export", True, monkeypatch, format="csv").splitlines()[0] == ",".join(
        ["step", "variable", "layer", *REDUCED])


def _status(url):
    """(status, JSON body) of a GET that may fail."""
    try:
        return 200, get_json(url)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module", params=["true", "false"], ids=["rust_loader", "python_loader"])
def served(request, logdir):
    with TensorBoard(logdir, load_fast=request.param) as tensorboard:
        tensorboard.wait_for_steps({"reduced": STEPS, "full": STEPS, "std_only": STEPS})
        yield tensorboard.base + "/data/plugin/gradients/"


def _url(route, **params):
    return route + "?" + urllib.parse.urlencode(params)


def test_the_routes_answer_the_logged_stats_and_name_them_for_the_others(served):
    runs = get_json(served + "runs")
    assert runs["reduced"]["gradients"]["stats"] == list(REDUCED)
    assert runs["reduced"]["gradients"]["not_logged"] == list(NOT_LOGGED)
    assert "not_logged" not in runs["full"]["gradients"]
    tag = dict(run="reduced", tag="gradients")
    for rows in ("variables", "layers"):
        for stat in HEATMAP_STATS:
            status, body = _status(served + _url("heatmap", stat=stat, rows=rows, **tag))
            assert status == 200 and body["stat"] == stat, body
            assert len(body["steps"]) == STEPS
        status, body = _status(served + _url("series", variable_index=1, rows=rows, **tag))
        assert status == 200 and list(body["stats"]) == list(REDUCED)
        assert "NaN" not in body["stats"]["l2_norm"]
    status, body = _status(served + _url("heatmap", stat="l2_norm", **tag))
    assert body["classes"][1][NAN_STEP] == "nonfinite"
    assert body["classes"][3][EXPLODE_STEP] == "exploding"
    for stat in NOT_LOGGED:
        for encoding in ("json", "base64"):
            status, body = _status(served + _url("heatmap", stat=stat, encoding=encoding, **tag))
            assert status == 400, body
            assert body["error"] == (
                f"stat {stat!r} was not logged in run 'reduced', tag 'gradients': its writer "
                f"logged only {', '.join(REDUCED)} (a writer's stats= chooses the gradient "
                "stats)")
    assert _status(served + _url("heatmap", stat="nope", **tag))[0] == 404
    status, body = _status(served + _url("alerts", **tag))
    assert status == 200
    kinds = {a["kind"] for a in body["alerts"]}
    assert {"nonfinite", "exploding", "vanishing"} <= kinds and "dead" not in kinds
    assert "dead" in {a["kind"] for a in get_json(served + _url("alerts", run="full",
                                                                tag="gradients"))["alerts"]}
    # A std logged without its mean: by layer it has no value, and still answers.
    status, body = _status(served + _url("heatmap", stat="std", rows="layers", run="std_only",
                                         tag="gradients"))
    assert status == 200 and {v for row in body["values"] for v in row} == {"NaN"}


def test_the_cli_says_what_was_not_logged_and_what_was_not_judged(logdir, capsys):
    assert cli.main(["diagnose", str(logdir), "--run", "reduced", "--fail-on", "dead"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["SEVERITY", "KIND", "RUN"]
    assert {line.split()[1] for line in out[1:-1]} >= {"nonfinite", "exploding", "vanishing"}
    assert out[-1] == (
        f"Not logged in run 'reduced', tag 'gradients': {', '.join(NOT_LOGGED)} (the writer's "
        "stats= left them out); not judged: dead (needs zero_fraction).")
    assert cli.main(["diagnose", str(logdir), "--run", "reduced", "--json",
                     "--fail-on", "nonfinite"]) == cli.EXIT_ALERT
    document = json.loads(capsys.readouterr().out)
    assert document["not_logged"] == [{"run": "reduced", "tag": "gradients",
                                       "stats": list(NOT_LOGGED),
                                       "not_judged": {"dead": ["zero_fraction"]}}]
    # A run that logged every stat: no such line, no such field.
    cli.main(["diagnose", str(logdir), "--run", "full", "--json"])
    assert "not_logged" not in json.loads(capsys.readouterr().out)
    cli.main(["diagnose", str(logdir), "--run", "full"])
    assert "Not logged" not in capsys.readouterr().out
    # std without the mean: only zero_fraction's absence stops a rule.
    cli.main(["diagnose", str(logdir), "--run", "std_only", "--json"])
    (note,) = json.loads(capsys.readouterr().out)["not_logged"]
    assert "std" not in note["stats"] and note["not_judged"] == {"dead": ["zero_fraction"]}

