"""`tensorboard-gradients diagnose`: the installed command, its output and its exit status."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients import cli


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    with tg.GradientWriter(str(root / "healthy")) as writer:
        for step in range(100):
            writer.write(step, {f"dense_{i}/kernel": rng.normal(size=(8, 8)) for i in range(4)})
    with tg.GradientWriter(str(root / "broken")) as writer:
        for step in range(100):
            grads = {f"dense_{i}/kernel": rng.normal(size=(8, 8)) for i in range(4)}
            if step >= 70:
                grads["dense_2/kernel"][0, 0] = np.inf
            writer.write(step, grads)
    return str(root)


def run(*args):
    command = shutil.which("tensorboard-gradients", path=os.path.dirname(sys.executable))
    assert command, "the console script is installed next to the interpreter"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=120)


def test_table_and_exit_status_gate_on_fail_on_kinds(logdir):
    result = run("diagnose", logdir, "--fail-on", "nonfinite,exploding")
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["SEVERITY", "KIND", "RUN"]
    assert "critical  nonfinite" in lines[1] and "broken" in lines[1]
    assert "dense_2/kernel" in lines[1] and "70-99" in lines[1]
    assert all("healthy" not in line for line in lines)
    every = run("diagnose", logdir, "--every-alert").stdout.splitlines()
    assert every[1] == lines[1]  # a finding of one alert reads as that alert
    assert run("diagnose", logdir).returncode == 0  # no --fail-on: report only
    assert run("diagnose", logdir, "--fail-on", "vanishing").returncode == 0


def test_run_filter_and_json(logdir):
    result = run("diagnose", logdir, "--run", "healthy", "--json", "--fail-on", "any")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"logdir": logdir, "alerts": [], "groups": [],
                                         "problems": []}
    result = run("diagnose", logdir, "--run", "broken", "--json")
    alerts = json.loads(result.stdout)["alerts"]
    assert alerts[0]["kind"] == "nonfinite" and alerts[0]["run"] == "broken"
    assert alerts[0]["first_step"] == 70 and alerts[0]["tag"] == "gradients"
    (nonfinite,) = [g for g in json.loads(result.stdout)["groups"] if g["kind"] == "nonfinite"]
    assert nonfinite["alerts"] == [0] and nonfinite["run"] == "broken"


def test_threshold_overrides(logdir):
    result = run("diagnose", logdir, "--run", "healthy", "--threshold", "exploding_norm=1",
                 "--fail-on", "exploding")
    assert result.returncode == 1 and "above 1" in result.stdout


@pytest.mark.parametrize("args,message", [
    (["--threshold", "exploding_norm=abc"], "must be a number"),
    (["--threshold", "nope=1"], "unknown threshold"),
    (["--threshold", "exploding_norm"], "NAME=VALUE"),
    (["--fail-on", "explosions"], "unknown kind"),
    (["--run", "missing"], "no gradients for run 'missing'"),
])
def test_bad_arguments_exit_2_with_a_message(logdir, args, message):
    result = run("diagnose", logdir, *args)
    assert result.returncode == 2 and message in result.stderr


def test_missing_logdir_and_empty_logdir(tmp_path):
    result = run("diagnose", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such log directory" in result.stderr
    result = run("diagnose", str(tmp_path))
    assert result.returncode == 0 and "no gradient summaries" in result.stderr


def test_module_entry_point(logdir):
    result = subprocess.run(
        [sys.executable, "-m", "tensorboard_gradients", "diagnose", logdir, "--run", "healthy"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and "No gradient alerts." in result.stdout


def test_help_documents_the_exit_status():
    result = run("diagnose", "--help")
    assert result.returncode == 0
    for code in ("0  no alert", "1  an alert", "2  bad arguments", "3  no alert"):
        assert code in result.stdout


def test_a_run_read_in_pieces_gets_the_alerts_of_the_whole_run(tmp_path, monkeypatch, capsys):
    """`diagnose` decodes a few steps at a time (bounded memory on long runs); cutting the run
    into reads of 7 steps must not change one alert."""
    rng = np.random.default_rng(5)
    with tg.GradientWriter(str(tmp_path / "run")) as writer:
        for step in range(120):
            gradients = {f"layer_{i}/kernel": rng.normal(size=(6, 5)) * 10 ** (-i) for i in range(4)}
            if step in (40, 77):
                gradients["layer_1/kernel"] *= 1e4  # spikes
            if step == 90:
                gradients["layer_2/kernel"][0, 0] = np.nan
            if 50 <= step < 70:
                gradients["layer_3/kernel"] *= 1e-9  # vanishing for 20 steps
            writer.write(step, gradients)
    expected = tg.diagnose(tg.read_logdir(str(tmp_path))["run"]["gradients"])
    assert {a.kind for a in expected} >= {"exploding", "nonfinite", "vanishing"}
    monkeypatch.setattr(cli, "STEPS_PER_READ", 7)
    assert cli.main(["diagnose", str(tmp_path), "--json", "--fail-on", "nonfinite"]) == cli.EXIT_ALERT
    alerts = json.loads(capsys.readouterr().out)["alerts"]
    assert [(a["kind"], a["rule"], a["variable"], a["first_step"], a["last_step"], a["steps"],
             a["message"]) for a in alerts] == [
        (a.kind, a.rule, a.variable, a.first_step, a.last_step, a.steps, a.message)
        for a in expected]
