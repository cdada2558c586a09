"""GradientMonitor on each Keras 3 backend: real `model.fit` runs in subprocesses (the backend is
fixed per process), checked against references independent of the monitor (see
`keras_backend_training`), and the runs they write served by the plugin's routes."""

import json
import os
import subprocess
import sys

import pytest

# The script's scenarios (it reports every one of them; kept here so that this process never
# imports Keras for the list).
SCENARIOS = ("sgd", "sgd_eager", "schedule", "steps_per_execution", "data_parallel", "clipping",
             "mixed_precision", "variables_and_probe", "unchanged_training", "torch_compile",
             "fewer_stats", "adam")
BACKENDS = ("tensorflow", "jax", "torch")
FRAMEWORK = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "keras_backend_training.py")
# Per backend process; measured 1-3 minutes each on a 2-core CPU, run side by side.
TIMEOUT_S = 900
BASE = "/data/plugin/gradients/"


def _installed(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
    """The three backends' training processes, started together (each waits on its own)."""
    root = tmp_path_factory.mktemp("keras_backends")
    started = {}
    for backend in BACKENDS:
        if not _installed(FRAMEWORK[backend]):
            continue
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        if backend == "jax":  # two CPU devices for the data-parallel run (one is used otherwise)
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                                " --xla_force_host_platform_device_count=2").strip()
        started[backend] = subprocess.Popen(
            [sys.executable, SCRIPT, str(root / backend)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.communicate()


_results = {}


def _run(processes, backend):
    """The script's report for `backend` (waiting for it at most TIMEOUT_S)."""
    if backend not in processes:
        pytest.skip(f"{FRAMEWORK[backend]} is not installed")
    if backend not in _results:
        process = processes[backend]
        try:
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            _results[backend] = {"error": f"timed out after {TIMEOUT_S} s\n{stderr[-3000:]}"}
        else:
            lines = stdout.strip().splitlines()
            if process.returncode != 0 or not lines:
                _results[backend] = {"error": f"exit {process.returncode}\n{stderr[-3000:]}"}
            else:
                _results[backend] = json.loads(lines[-1])
    report = _results[backend]
    assert "error" not in report, report.get("error")
    assert report["backend"] == backend
    assert tuple(report["results"]) == SCENARIOS
    return report


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("backend", BACKENDS)
def test_monitor_logs_the_applied_gradients(processes, backend, scenario):
    result = _run(processes, backend)["results"][scenario]
    if result.startswith("skip: "):
        pytest.skip(result[len("skip: "):])
    assert result == "ok", result


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_plugin_serves_each_backends_run(processes, backend, plugin_client):
    report = _run(processes, backend)
    assert report["results"]["sgd"] == "ok"
    client = plugin_client(report["logdirs"]["sgd"])

    def get(route):
        response = client.get(BASE + route)
        assert response.status_code == 200, (route, response.get_data()[:300])
        return json.loads(response.get_data())

    runs = get("runs")
    assert runs["train"]["gradients"]["steps"] == 8
    assert runs["train"]["gradients"]["variables"] == 6
    assert runs["train"]["gradients"]["epochs"] == 2
    heatmap = get("heatmap?run=train&tag=gradients&stat=l2_norm")
    assert heatmap["steps"] == list(range(1, 9)) and heatmap["epochs"] == [1, 5]
    assert heatmap["variables"][0] == "hidden/kernel" and heatmap["layers"][-1] == "out"
    # The update column each backend records: the tab's update/weight ratio of every kernel.
    ratio = get("heatmap?run=train&tag=gradients&stat=update_weight_ratio")
    kernels = [i for i, name in enumerate(ratio["variables"]) if name.endswith("/kernel")]
    assert all(isinstance(v, float) and 0 < v < 1 for i in kernels for v in ratio["values"][i])
    series = get("series?run=train&tag=gradients&variable=hidden/kernel")
    assert series["steps"] == list(range(1, 9))
    get("alerts?run=train&tag=gradients")
