"""The demo (quick mode, as a user runs it) logs every scenario and each shows what it is built for.

No browser here: `test_demo_end_to_end.py` checks the same runs in the Gradients tab.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request

import pytest

import tensorboard_gradients as tg
from support import ROOT, run_demo

QUICK_STEPS = 87  # 3 epochs of ceil(1797 / 64) = 29 batches
CUSTOM_LOOP_STEPS = 84  # 3 epochs of 28 full batches (drop_remainder)
HEALTHY = ("healthy/train", "vanishing_fixed/train", "exploding_clipped/train", "custom_loop/train")


def test_every_scenario_is_a_run_with_every_step_and_histograms(demo):
    logdir, _ = demo
    runs = tg.read_logdir(str(logdir))
    assert sorted(runs) == sorted(f"{name}/train" for name in (
        "healthy", "vanishing", "vanishing_fixed", "exploding", "exploding_clipped", "custom_loop"))
    for run in ("healthy/train", "vanishing/train", "vanishing_fixed/train", "exploding_clipped/train"):
        series = runs[run]["gradients"]
        assert list(series.steps) == list(range(1, QUICK_STEPS + 1)), run
        assert list(series.histograms.steps) == list(range(1, QUICK_STEPS + 1, 10)), run
        assert list(series.epoch_starts) == [1, 30, 59], run
        assert "update_l2_norm" in series.stat_names
    custom = runs["custom_loop/train"]["gradients"]
    assert list(custom.steps) == list(range(1, CUSTOM_LOOP_STEPS + 1))
    assert list(custom.histograms.steps) == list(range(10, CUSTOM_LOOP_STEPS + 1, 10))
    assert any("batch_norm_00/gamma" in v for v in custom.variables)


def test_each_scenario_shows_its_problem_and_the_fixes_are_healthy(demo):
    logdir, stdout = demo
    runs = tg.read_logdir(str(logdir))
    alerts = {run: tg.diagnose(tags["gradients"]) for run, tags in runs.items()}
    for run in HEALTHY:
        assert alerts[run] == [], (run, [a.message for a in alerts[run]])
        assert f"{run:26s} no alerts" in stdout

    vanishing = [a for a in alerts["vanishing/train"] if a.kind == "vanishing"]
    flagged_layers = {a.layer for a in vanishing}
    assert {"dense_00", "dense_01", "dense_02"} <= flagged_layers
    assert not flagged_layers & {"dense_09", "dense_10", "dense_11", "logits"}, flagged_layers
    assert all(a.kind in ("vanishing", "update_ratio") for a in alerts["vanishing/train"])

    exploding = runs["exploding/train"]["gradients"]
    found = alerts["exploding/train"]
    first_nan = min(a.first_step for a in found if a.kind == "nonfinite")
    # TerminateOnNaN stops training at the first NaN loss: the last logged step is that NaN step.
    assert first_nan == exploding.steps[-1] and first_nan < QUICK_STEPS
    explosions = [a for a in found if a.kind == "exploding" and a.rule == "absolute"]
    assert explosions and all(a.first_step < first_nan for a in explosions)
    assert any(a.kind == "exploding" and a.rule == "global" for a in found)
    assert f"first NaN/Inf gradient at step {first_nan}" in stdout
    assert f"Logs written to {logdir}" in stdout


def test_the_full_demo_shows_what_the_readme_says(tmp_path):
    """The demo table (README, docs/demo.md) is about `./dev demo`, 20 epochs: where it says "no alerts",
    none (a spike rule once fired on `vanishing_fixed` at step 472, past the quick mode's 87)."""
    stdout = run_demo(tmp_path, quick=False)
    runs = tg.read_logdir(str(tmp_path))
    alerts = {run: tg.diagnose(tags["gradients"]) for run, tags in runs.items()}
    for run in HEALTHY:
        assert alerts[run] == [], (run, [a.message for a in alerts[run]])
        assert f"{run:26s} no alerts" in stdout
    assert {a.kind for a in alerts["vanishing/train"]} == {"vanishing", "update_ratio"}
    found = alerts["exploding/train"]
    first_nan = min(a.first_step for a in found if a.kind == "nonfinite")
    assert {a.kind for a in found} == {"exploding", "nonfinite", "loss_spike"}
    assert all(a.first_step < first_nan for a in found if a.kind == "exploding")
    # The loss logged beside the gradients went NaN with them: critical, at that step.
    [loss] = [a for a in found if a.kind == "loss_spike"]
    assert (loss.severity, loss.first_step) == ("critical", first_nan)
    assert f"first NaN/Inf gradient at step {first_nan}" in stdout


def test_an_unknown_scenario_is_refused_with_the_known_ones():
    done = subprocess.run(
        [sys.executable, str(ROOT / "demo" / "train.py"), "--only", "healthy,nope"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "unknown scenario(s) nope" in done.stderr and "exploding_clipped" in done.stderr


def _demo_process(*args, sigint_ignored=False):
    """`demo/train.py` as `./dev demo` runs it, in a process group of its own (Ctrl-C reaches
    TensorBoard too, as from a terminal); stdout line-buffered for reading as it goes.
    ``sigint_ignored``: started as a script's background job is (`... --serve &`), with SIGINT
    ignored."""
    ignored = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen(
        [sys.executable, "-u", str(ROOT / "demo" / "train.py"), *args], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=ignored)


def test_a_taken_port_is_skipped_before_training_and_the_url_printed_is_the_tabs(tmp_path):
    with socket.socket() as taken:  # another server on the port asked for
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # Started as a background job of a script is, with SIGINT ignored: kill -INT stops it.
        demo = _demo_process("--logdir", str(tmp_path), "--only", "healthy", "--epochs", "1",
                             "--serve", "--port", str(port), sigint_ignored=True)
        # Its stderr (TensorFlow's and TensorBoard's messages) drained as it comes: a full pipe
        # would block the demo or TensorBoard, and the stop below would wait on that.
        errors = []
        drain = threading.Thread(target=lambda: errors.extend(demo.stderr), daemon=True)
        drain.start()
        try:
            lines = []
            for line in demo.stdout:  # bounded: the demo exits when TensorBoard fails
                lines.append(line.rstrip())
                if line.startswith("Open http://"):
                    break
            text = "\n".join(lines)
            assert f"Port {port} is in use" in text, text + "".join(errors)
            assert text.index(f"Port {port} is in use") < text.index("== healthy")
            url = lines[-1].split()[1]
            served = int(url.split(":")[2].split("/")[0])
            assert served != port and url == f"http://localhost:{served}/#gradients"
            with urllib.request.urlopen(f"http://127.0.0.1:{served}/data/plugins_listing",
                                        timeout=30) as answer:
                assert json.load(answer)["gradients"]["enabled"]
            # SIGINT to the demo alone (kill -INT; a terminal's Ctrl-C reaches TensorBoard too):
            # it stops, and TensorBoard with it.
            os.kill(demo.pid, signal.SIGINT)
            try:
                assert demo.wait(timeout=60) == 0
            except subprocess.TimeoutExpired:
                raise AssertionError("the demo did not stop within 60 s of SIGINT; its stderr:\n"
                                     + "".join(errors)[-4000:]) from None
            with pytest.raises(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{served}/data/plugins_listing",
                                       timeout=5)
        finally:
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()


def test_the_demo_exits_non_zero_when_tensorboard_fails(tmp_path):
    demo = _demo_process("--logdir", str(tmp_path), "--only", "healthy", "--epochs", "1",
                         "--serve", "--", "--load_fast=bogus")
    try:
        out, err = demo.communicate(timeout=600)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert demo.returncode != 0
    assert "TensorBoard failed (exit status" in err and "Open http://" not in out
