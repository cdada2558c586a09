"""A vanished layer stays flagged while it stays vanished (issue 33): a real PyTorch run whose
output side shrinks toward its stalled first layer (tests/deep_sigmoid_training.py), checked
through the CLI as a subprocess, a real `tensorboard` on both loaders and the tab in Chromium.
The finding on layer ``0`` spans every logged step; it used to end at step 53 of 150.
"""

import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

import tensorboard_gradients as tg  # noqa: E402
from tensorboard_gradients import analysis  # noqa: E402
from tensorboard_gradients.analysis.layers import Layers  # noqa: E402

import deep_sigmoid_training as training  # noqa: E402
from support import (  # noqa: E402
    CHROMIUM, VANISHING_HATCH_RGB, Tab, TensorBoard, get_json, has_color, row_band,
)

RUN = "deep_sigmoid"
LAST_STEP = training.STEPS - 1
# The depth finding on the first layer: from the first logged step to the last, every step.
WHOLE_RUN = {"kind": "vanishing", "rule": "depth", "layer": training.FIRST_LAYER,
             "first_step": 0, "last_step": LAST_STEP, "steps": training.STEPS}


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("vanishing_persists")
    training.train(str(root / RUN))
    return root


def _depth_finding(alerts):
    """The depth alert on the first layer (as JSON fields), or None."""
    found = [{field: alert[field] for field in WHOLE_RUN} for alert in alerts
             if (alert["kind"], alert["rule"], alert["layer"])
             == ("vanishing", "depth", training.FIRST_LAYER)]
    return found[0] if found else None


def test_the_run_is_a_stalled_first_layer_under_a_shrinking_output_side(logdir):
    """What the run must show for the other tests to mean anything: layer 0 starts below
    depth_ratio x the output side and ends above it because the output side came down, while
    its own norm never gets back to the level of the step its finding began at."""
    series = tg.read_logdir(str(logdir))[RUN]["gradients"]
    thresholds = analysis.Thresholds()
    layers = Layers.of(series.layers)
    norms = layers.root_sum_squares(series.stat("l2_norm").astype(np.float64))
    output_side = math.ceil(len(layers.names) * thresholds.depth_reference_fraction)
    reference = np.median(norms[:, -output_side:], axis=1)
    first = layers.names.index(training.FIRST_LAYER)
    ratios = norms[:, first] / reference
    assert ratios[:20].max() < thresholds.depth_ratio < np.median(ratios[-50:])
    assert reference[-50:].mean() < reference[:5].mean() / 5  # the output side fell
    assert norms[:, first].max() < thresholds.depth_ratio * reference[0]


def test_the_cli_reports_the_finding_to_the_last_step(logdir):
    done = subprocess.run(
        [sys.executable, "-m", "tensorboard_gradients", "diagnose", str(logdir), "--json"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr  # warnings only: the default gate is critical
    alerts = json.loads(done.stdout)["alerts"]
    assert _depth_finding(alerts) == WHOLE_RUN
    assert {alert["run"] for alert in alerts} == {RUN}


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_tensorboard_serves_the_finding_and_the_cells_to_the_last_step(logdir, load_fast):
    with TensorBoard(logdir, load_fast=load_fast) as tensorboard:
        tensorboard.wait_for_steps({RUN: training.STEPS})
        route = f"{tensorboard.base}/data/plugin/gradients/"
        alerts = get_json(route + f"alerts?run={RUN}&tag=gradients", timeout=30)["alerts"]
        assert _depth_finding(alerts) == WHOLE_RUN
        heatmap = get_json(route + f"heatmap?run={RUN}&tag=gradients&stat=l2_norm", timeout=30)
    assert heatmap["steps"] == list(range(training.STEPS)) and not heatmap["downsampled"]
    for row, layer in enumerate(heatmap["layers"]):
        classes = set(heatmap["classes"][row])
        if layer == training.FIRST_LAYER:
            assert classes == {"vanishing"}, heatmap["variables"][row]
        elif layer == training.HEAD:
            assert heatmap["classes"][row][-1] == "ok", heatmap["variables"][row]


# .ci/run installs Chromium and sets GRADIENTS_REQUIRE_BROWSER=1, so CI cannot skip this.
@pytest.mark.skipif((CHROMIUM is None or importlib.util.find_spec("playwright") is None)
                    and not os.environ.get("GRADIENTS_REQUIRE_BROWSER"),
                    reason="Chromium or Playwright is not installed")
def test_the_tab_hatches_the_first_layer_in_the_last_column(logdir, browser):
    with TensorBoard(logdir) as tensorboard:
        tensorboard.wait_for_steps({RUN: training.STEPS})
        tab = Tab(browser, tensorboard.base, f"#run={RUN}&tag=gradients&axis=step")
        tab.wait_drawn()
        layers, columns = tab.page.evaluate(
            "[window.gradientsApp.matrix.layers, window.gradientsApp.matrix.columns]")
        assert columns == training.STEPS
        pixels = tab.pixels()
        last_column = pixels[:, pixels.shape[1] * (columns - 1) // columns:]
        for layer, hatched in ((training.FIRST_LAYER, True), (training.HEAD, False)):
            rows = [row for row, name in enumerate(layers) if name == layer]
            band = row_band(last_column, rows[0], rows[-1], len(layers))
            assert has_color(band, VANISHING_HATCH_RGB) == hatched, layer
        # The finding the panel lists spans the run too.
        assert _depth_finding(tab.wait_alerts()) == WHOLE_RUN
        tab.close()
