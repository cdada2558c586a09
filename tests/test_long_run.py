"""A long run at the size CI affords (200 tensors x 20,000 steps, statistics every step): every
planted one-step spike (x1,000) and the one NaN step show in the overview heatmap, in the alerts
and in the CLI, served by a real `tensorboard` on both loaders; written with the writer's digest
(the first heatmap after TensorBoard has read the run is then complete) and without it (as
format 1.1 writers wrote: the plugin reads the steps itself). The full size of the goal
(1,000 x 100,000) is measured in `benchmarks/`, not here.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.format.layout import Layout
from support import TensorBoard, get_json

VARIABLES, STEPS, SPIKES = 200, 20_000, 20
RUN = "long"
STAT = "l2_norm"


def _planted(rng):
    """(spikes as [(variable index, step)], the NaN's (variable index, step)): distinct
    variables, steps past the spike rule's first window and apart from each other."""
    rows = rng.choice(VARIABLES, SPIKES + 1, replace=False)
    steps = rng.choice(np.arange(100, STEPS, 50), SPIKES + 1, replace=False)
    planted = [(int(r), int(s)) for r, s in zip(rows, steps)]
    return planted[:SPIKES], planted[SPIKES]


@pytest.fixture(scope="module", params=[True, False], ids=["writer_digest", "no_digest"])
def long_run(tmp_path_factory, request):
    """Writes the run: per variable a healthy norm level times log-normal noise of 0.05 decades
    (far inside the spike rule's 10x floor), every column scaled alike so the row stays a
    valid statistics row; with the writer's digest or without."""
    rng = np.random.default_rng(15)
    spikes, nan = _planted(rng)
    names = [f"block{i // 2}/{'kernel' if i % 2 == 0 else 'bias'}" for i in range(VARIABLES)]
    layout = Layout.create(names, [(64, 64) if i % 2 == 0 else (64,) for i in range(VARIABLES)],
                           with_weights=False)
    stats = layout.stats
    level = 10 ** rng.uniform(-3, -1, VARIABLES)
    base = np.zeros((VARIABLES, len(stats)), np.float32)
    size = np.array([4096.0 if i % 2 == 0 else 64.0 for i in range(VARIABLES)])
    scaled = {"l2_norm": 1.0, "mean": 0.0, "std": 1 / np.sqrt(size), "min": -3 / np.sqrt(size),
              "max": 3 / np.sqrt(size), "abs_max": 3 / np.sqrt(size),
              "mean_abs": 0.8 / np.sqrt(size)}
    for name, factor in scaled.items():
        base[:, stats.index(name)] = level * factor
    base[:, stats.index("size")] = size
    scaled_columns = [stats.index(name) for name in scaled]
    spike_at = {}
    for row, step in spikes:
        spike_at.setdefault(step, []).append(row)
    root = tmp_path_factory.mktemp("long")
    noise = 10 ** rng.normal(0, 0.05, (STEPS, VARIABLES)).astype(np.float32)
    with tg.GradientWriter(str(root / RUN), digest=request.param) as writer:
        for step in range(STEPS):
            matrix = base.copy()
            matrix[:, scaled_columns] *= noise[step][:, None]
            for row in spike_at.get(step, ()):
                matrix[row, scaled_columns] *= 1000
            if step == nan[1]:
                matrix[nan[0], stats.index("nan_count")] = 1
            writer.write_statistics(step, layout, matrix)
    return str(root), names, spikes, nan, request.param


def _cell(heatmap, row, step):
    """(class, value) of the overview column holding `step` in `row`."""
    column = int(np.searchsorted(heatmap["steps"], step, side="right")) - 1
    assert heatmap["steps"][column] <= step <= heatmap["last_steps"][column]
    return heatmap["classes"][row][column], heatmap["values"][row][column]


def _alerted(alerts, names, planted, rule):
    return {(names.index(a["variable"]), a["first_step"]) for a in alerts
            if a["rule"] == rule and a["variable"] is not None
            and a["first_step"] == a["last_step"]} >= set(planted)


@pytest.mark.parametrize("load_fast", ["false", "true"])
def test_no_planted_spike_or_nan_is_lost_in_the_overview_or_the_alerts(long_run, load_fast):
    logdir, names, spikes, nan, written = long_run
    with TensorBoard(logdir, load_fast=load_fast) as tb:
        tb.wait_for_steps({RUN: STEPS}, timeout=600)
        base = f"{tb.base}/data/plugin/gradients"
        # Without the writer's digest the plugin reads this long run in the background; until
        # it is done, answers say so. With it, the first answer is already the whole run.
        deadline = time.monotonic() + 300
        while True:
            heatmap = get_json(f"{base}/heatmap?run={RUN}&tag=gradients&stat={STAT}",
                               timeout=120)
            if heatmap["sampled"] is None or time.monotonic() > deadline:
                break
            assert "still being read" in heatmap["sampled"] and not written
            time.sleep(1)
        alerts = get_json(f"{base}/alerts?run={RUN}&tag=gradients", timeout=120)["alerts"]
    assert heatmap["sampled"] is None and heatmap["downsampled"]  # every step, merged columns
    assert len(heatmap["steps"]) < STEPS
    quiet = np.nanmedian(np.asarray(heatmap["values"], dtype=float), axis=1)
    for row, step in spikes:
        kind, value = _cell(heatmap, row, step)
        assert kind == "spike" and value > 100 * quiet[row], (names[row], step, kind, value)
    assert _cell(heatmap, *nan)[0] == "nonfinite"
    assert _alerted(alerts, names, spikes, "spike"), "a planted spike has no alert of its own"
    assert any(a["kind"] == "nonfinite" and a["variable"] == names[nan[0]]
               and a["first_step"] == nan[1] for a in alerts)


def test_no_planted_spike_or_nan_is_lost_in_the_cli(long_run):
    logdir, names, spikes, nan, _ = long_run
    done = subprocess.run(
        [sys.executable, "-m", "tensorboard_gradients.cli", "diagnose", logdir, "--json"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 1, done.stderr[-3000:]  # the planted NaN fails the default gate
    alerts = json.loads(done.stdout)["alerts"]
    assert _alerted(alerts, names, spikes, "spike")
    assert any(a["kind"] == "nonfinite" and a["variable"] == names[nan[0]]
               and a["first_step"] == nan[1] for a in alerts)
