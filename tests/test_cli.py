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
from terminal import run_in_terminal


def write_dense_run(path, steps, rng, change=lambda step, grads: None):
    """``steps`` steps of four normal 8x8 kernels, each step's first ``change``d in place."""
    with tg.GradientWriter(str(path)) as writer:
        for step in range(steps):
            grads = {f"dense_{i}/kernel": rng.normal(size=(8, 8)) for i in range(4)}
            change(step, grads)
            writer.write(step, grads)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    rng = np.random.default_rng(0)
    write_dense_run(root / "healthy", 100, rng)

    def inf_from_step_70(step, grads):
        if step >= 70:
            grads["dense_2/kernel"][0, 0] = np.inf

    write_dense_run(root / "broken", 100, rng, inf_from_step_70)
    return str(root)


def command():
    found = shutil.which("tensorboard-gradients", path=os.path.dirname(sys.executable))
    assert found, "the console script is installed next to the interpreter"
    return found


def run(*args, env=None):
    """The installed command, its output piped (no terminal)."""
    return subprocess.run([command(), *args], capture_output=True, text=True, timeout=120,
                          env=env)


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
    assert run("diagnose", logdir, "--fail-on", "vanishing").returncode == 0


def test_a_nonfinite_gradient_fails_the_gate_without_any_flag(logdir):
    default = run("diagnose", logdir)
    assert default.returncode == 1 and "critical  nonfinite" in default.stdout
    assert run("diagnose", logdir, "--fail-on", "critical").returncode == 1
    reported = run("diagnose", logdir, "--fail-on", "none")
    assert reported.returncode == 0 and reported.stdout == default.stdout  # reports, never fails
    assert run("diagnose", logdir, "--run", "healthy").returncode == 0


@pytest.fixture(scope="module")
def warnings_only(tmp_path_factory):
    """A run whose one finding is a warning: the input-side layer vanishing (1e-9 of the rest)."""
    root = tmp_path_factory.mktemp("warnings")

    def input_side_vanishing(step, grads):
        grads["dense_0/kernel"] *= 1e-9

    write_dense_run(root / "run", 40, np.random.default_rng(1), input_side_vanishing)
    return str(root)


@pytest.mark.parametrize("fail_on,status", [
    (None, 0), ("critical", 0), ("warning", 1), ("info", 1), ("vanishing", 1), ("exploding", 0),
    ("exploding,warning", 1), ("any", 1), ("none", 0),
])
def test_fail_on_takes_kinds_and_severities_each_counting_the_more_severe(
        warnings_only, fail_on, status):
    result = run("diagnose", warnings_only, *(["--fail-on", fail_on] if fail_on else []))
    assert "warning   vanishing" in result.stdout and "critical" not in result.stdout
    assert result.returncode == status, result.stderr


def test_an_unknown_fail_on_word_lists_the_valid_ones(logdir):
    result = run("diagnose", logdir, "--fail-on", "explosions")
    assert result.returncode == 2
    assert "unknown kind or severity explosions" in result.stderr
    for word in (*tg.analysis.KINDS, *tg.analysis.SEVERITIES, "any", "none"):
        assert word in result.stderr.split("valid:")[1]
    assert run("diagnose", logdir, "--fail-on", "none,exploding").returncode == 2


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


def test_a_missing_logdir_is_a_usage_error(tmp_path):
    result = run("diagnose", str(tmp_path / "nope"))
    assert result.returncode == 2 and "no such log directory" in result.stderr


@pytest.mark.parametrize("fail_on", [[], ["--fail-on", "any"], ["--fail-on", "none"]])
def test_an_empty_logdir_judges_nothing_and_exits_4(tmp_path, fail_on):
    result = run("diagnose", str(tmp_path), *fail_on)
    assert result.returncode == cli.EXIT_NOTHING_JUDGED == 4
    assert f"No gradient data in {tmp_path}: no event files" in result.stderr
    assert "No gradient alerts" not in result.stdout  # nothing judged is not a clean bill


@pytest.fixture(scope="module")
def keras_without_monitor(tmp_path_factory):
    """A real Keras job whose gradient monitor was never attached: only Keras' own TensorBoard
    callback wrote (train/ and validation/ runs, epoch_loss and epoch_accuracy scalars)."""
    root = tmp_path_factory.mktemp("keras_only")
    script = f"""
import numpy as np, keras
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32"); y = (x[:, 0] > 0).astype("int32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, validation_split=0.25, epochs=2, verbose=0,
          callbacks=[keras.callbacks.TensorBoard(log_dir={str(root)!r})])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.mark.parametrize("fail_on", [[], ["--fail-on", "any"]])
def test_a_job_that_never_attached_a_monitor_exits_4_naming_what_was_found(
        keras_without_monitor, fail_on):
    event_files = [p for p in keras_without_monitor.rglob("*") if "tfevents" in p.name]
    result = run("diagnose", str(keras_without_monitor), *fail_on)
    assert result.returncode == 4, result.stderr
    first = result.stderr.splitlines()[0]
    assert f"No gradient data in {keras_without_monitor}: {len(event_files)} event files in 2 runs" in first
    assert "scalar tags: epoch_accuracy, epoch_learning_rate, epoch_loss" in first
    assert first.endswith("; no gradients tag.")
    assert "tensorboard_gradients.keras.GradientMonitor" in result.stderr
    assert "tensorboard_gradients.torch.GradientMonitor" in result.stderr


def test_a_run_without_gradients_exits_4_and_a_run_that_is_not_there_2(keras_without_monitor):
    result = run("diagnose", str(keras_without_monitor), "--run", "train", "--json")
    assert result.returncode == 4
    document = json.loads(result.stdout)
    assert document["alerts"] == [] and "No gradient data in run 'train'" in document["no_gradient_data"]
    result = run("diagnose", str(keras_without_monitor), "--run", "nope")
    assert result.returncode == 2 and "no gradients for run 'nope'" in result.stderr


def test_piped_into_head_it_stops_quietly_with_status_0(tmp_path):
    """A reader that stops early (`| head`) is not an alert: the command exits 0 without a
    traceback, even with critical alerts in what it did not get to print."""
    with tg.GradientWriter(str(tmp_path / "run")) as writer:
        for step in range(3):
            writer.write(step, {f"layer_{i:04d}/kernel": np.full((2, 2), np.nan if step else 1.0)
                                for i in range(1500)})
    process = subprocess.Popen([command(), "diagnose", str(tmp_path), "--every-alert"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    head = process.stdout.read(200)  # the table is ~200 KB: far more than a pipe's buffer
    process.stdout.close()
    status = process.wait(timeout=120)
    errors = process.stderr.read().decode()
    assert head.startswith(b"SEVERITY") and status == 0 and errors == ""
    shell = subprocess.run(f"set -o pipefail; '{command()}' diagnose '{tmp_path}' --every-alert"
                           " | head -n 2", shell=True, executable="bash", capture_output=True,
                           text=True, timeout=120)
    assert shell.returncode == 0 and shell.stderr == "" and len(shell.stdout.splitlines()) == 2


def test_the_table_fits_the_terminal_and_a_pipe_gets_a_row_per_line(logdir):
    # Piped, a row per line, whatever $COLUMNS says (CI runners and pytest-xdist set it).
    piped = run("diagnose", logdir, "--every-alert",
                env=dict(os.environ, COLUMNS="80")).stdout.splitlines()
    assert max(len(line) for line in piped) > 80 and len(piped) == 1 + len(
        json.loads(run("diagnose", logdir, "--json").stdout)["alerts"])
    fitted = run_in_terminal([command(), "diagnose", logdir, "--every-alert"], 80,
                             env={k: v for k, v in os.environ.items() if k != "COLUMNS"})
    fitted = fitted.splitlines()
    assert max(len(line) for line in fitted) <= 80 and len(fitted) > len(piped)
    assert fitted[0].split()[:3] == ["SEVERITY", "KIND", "RUN"]
    # Wrapped, not cut: the message column holds every word of every message, in order.
    piped_at, fitted_at = piped[0].index("MESSAGE"), fitted[0].index("MESSAGE")
    assert (" ".join(line[fitted_at:] for line in fitted[1:]).split()
            == " ".join(line[piped_at:] for line in piped[1:]).split())


def test_module_entry_point(logdir):
    result = subprocess.run(
        [sys.executable, "-m", "tensorboard_gradients", "diagnose", logdir, "--run", "healthy"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and "No gradient alerts." in result.stdout


def test_help_documents_the_exit_status():
    result = run("diagnose", "--help")
    assert result.returncode == 0
    for code in ("0  nothing of a --fail-on", "1  an alert", "2  bad arguments",
                 "3  nothing of a --fail-on", "4  nothing was judged", "status 0"):
        assert code in result.stdout
    assert "(default: critical)" in " ".join(result.stdout.split())


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
