"""Both writers' event files served by a real `tensorboard` process through both loaders."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients import analysis

STEPS = 150  # more than either loader keeps per tag by default (10 Python, 100 Rust)
NAN_STEP = 123


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    with tg.GradientWriter(str(root / "numpy_run")) as writer:
        for step in range(STEPS):
            fc2 = np.ones(5)
            if step == NAN_STEP:
                fc2[2] = np.nan
            writer.write(
                step, {"fc1/weight": np.full((4, 3), 1.0 + step), "fc2/weight": fc2},
                histograms=step % 10 == 0,
            )
    tf = pytest.importorskip("tensorflow")
    from tensorboard_gradients import summary

    variables = [tf.Variable(tf.ones([3, 2]), name="dense/kernel"), tf.Variable(0.5, name="scale")]
    file_writer = tf.summary.create_file_writer(str(root / "tf_run"))

    @tf.function
    def log(step):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(variables[0] * variables[1]) * tf.cast(step, tf.float32)
        grads = tape.gradient(loss, variables)
        with file_writer.as_default(step=step):
            summary.gradients(grads, variables)

    for step in range(STEPS):
        log(tf.constant(step, tf.int64))
    file_writer.close()
    return str(root)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_every_step_reaches_the_plugin_through_both_loaders(logdir, load_fast):
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
            "--port", str(port), f"--load_fast={load_fast}", "--reload_interval", "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    base = f"http://127.0.0.1:{port}"
    expected = {
        "numpy_run": {"gradients": {"variables": 2, "steps": STEPS, "histograms": True}},
        "tf_run": {"gradients": {"variables": 2, "steps": STEPS, "histograms": False}},
    }
    runs = None
    try:
        deadline = time.time() + 90
        while time.time() < deadline:
            try:
                listing = _get_json(base + "/data/plugins_listing")
                runs = _get_json(base + "/data/plugin/gradients/runs")
            except OSError:
                time.sleep(0.5)
                continue
            summary = {
                run: {tag: {k: info[k] for k in ("variables", "steps", "histograms")} for tag, info in tags.items()}
                for run, tags in runs.items()
            }
            if summary == expected:
                break
            time.sleep(0.5)
        assert listing["gradients"]["enabled"] is True
        assert listing["gradients"]["tab_name"] == "Gradients"
        assert listing["gradients"]["loading_mechanism"] == {
            "type": "IFRAME", "module_path": "/data/plugin/gradients/static/index.js"}
        assert summary == expected, f"TensorBoard served {runs}"
        assert runs["tf_run"]["gradients"]["stats"][-2:] == ["weight_l2_norm", "grad_weight_ratio"]

        route = base + "/data/plugin/gradients/"
        vocabulary = _get_json(route + "thresholds")["vocabulary"]
        assert [c["name"] for c in vocabulary["classes"]] == list(analysis.CLASSES)
        heatmap = _get_json(route + "heatmap?run=numpy_run&tag=gradients&stat=l2_norm")
        assert heatmap["steps"] == list(range(STEPS)) and not heatmap["downsampled"]
        assert heatmap["classes"][1][NAN_STEP] == "nonfinite"
        assert heatmap["values"][0][-1] == pytest.approx(np.sqrt(12) * STEPS)
        merged = _get_json(route + "heatmap?run=numpy_run&tag=gradients&stat=l2_norm&max_steps=10")
        assert len(merged["steps"]) == 10 and "nonfinite" in merged["classes"][1]
        alerts = _get_json(route + "alerts?run=numpy_run&tag=gradients")["alerts"]
        assert (alerts[0]["kind"], alerts[0]["variable"], alerts[0]["first_step"]) == (
            "nonfinite", "fc2/weight", NAN_STEP)
        histogram = _get_json(
            route + f"histogram?run=numpy_run&tag=gradients&variable=fc2/weight&step={NAN_STEP}")
        assert histogram["step"] == 120 and histogram["steps"] == list(range(0, STEPS, 10))
        assert _get_json(route + f"histogram?run=numpy_run&tag=gradients&variable_index=1"
                         f"&step={NAN_STEP}") == histogram
        for query, status in (("histogram?run=numpy_run&tag=gradients&variable_index=1"
                               "&step=9223372036854775808", 400),
                              ("heatmap?run=numpy_run&tag=gradients&stat=nope", 404)):
            try:
                urllib.request.urlopen(route + query, timeout=10)
                raise AssertionError(f"{query} must not answer 200")
            except urllib.error.HTTPError as error:
                assert error.code == status and json.loads(error.read())["error"]
    finally:
        process.terminate()
        process.wait(timeout=30)
