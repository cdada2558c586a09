"""The demo really trains, logs every step, and shows the vanishing layers it is meant to show."""

import subprocess
import sys
import pathlib

import numpy as np

import tensorboard_gradients as tg

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_demo_quick_run_logs_vanishing_and_healthy_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "demo" / "train.py"), "--logdir", str(tmp_path), "--steps", "40"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "median gradient L2 norm per kernel" in done.stdout
    runs = tg.read_logdir(str(tmp_path))
    assert sorted(runs) == ["relu_he", "sigmoid_deep"]
    for run in runs.values():
        series = run["gradients"]
        assert list(series.steps) == list(range(40))
        assert list(series.histograms.steps) == [0, 25]
    kernels = lambda series: [i for i, v in enumerate(series.variables) if v.endswith("kernel")]  # noqa: E731
    sigmoid = runs["sigmoid_deep"]["gradients"]
    norms = np.median(sigmoid.stat("l2_norm")[:, kernels(sigmoid)], axis=0)
    assert norms[0] < norms[-1] * 1e-4, "first sigmoid layer's gradient should vanish"
    relu = runs["relu_he"]["gradients"]
    norms = np.median(relu.stat("l2_norm")[:, kernels(relu)], axis=0)
    assert norms.min() > norms.max() / 10, "ReLU + He init keeps gradient norms within 10x"
