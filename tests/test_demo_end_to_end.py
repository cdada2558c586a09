"""From the demo to the Gradients tab: what a new user sees, on both TensorBoard loaders.

The demo runs in quick mode (as `demo/train.py --quick`), a real `tensorboard` serves it, and a
real Chromium opens the tab on every scenario: the vanishing run's first layers are flagged, the
exploding run shows exploding cells and its first non-finite step, the healthy and fixed runs
show no alerts, and `tensorboard-gradients diagnose` says exactly what the tab says.
"""

import json
import os
import subprocess
import sys
import urllib.parse

import pytest

import tensorboard_gradients as tg
from support import (
    CHROMIUM, EXPLODING_HATCH_RGB, NONFINITE_RGB, SPIKE_HATCH_RGB, VANISHING_HATCH_RGB, Tab,
    TensorBoard, has_color, open_every_finding, row_band,
)

pytest.importorskip("playwright.sync_api")
if CHROMIUM is None and not os.environ.get("GRADIENTS_REQUIRE_BROWSER"):
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)

HEALTHY_RUNS = ("healthy/train", "vanishing_fixed/train", "exploding_clipped/train", "custom_loop/train")
ALERT_FIELDS = ("kind", "rule", "variable", "layer", "first_step", "last_step", "steps", "severity")


@pytest.fixture(scope="module")
def runs(demo):
    return tg.read_logdir(str(demo[0]))


@pytest.fixture(scope="module", params=["true", "false"], ids=["load_fast", "python_loader"])
def server(request, demo, runs):
    with TensorBoard(demo[0], load_fast=request.param,
                     with_tensorflow=True) as tensorboard:
        tensorboard.wait_for_steps({run: len(tags["gradients"].steps) for run, tags in runs.items()})
        yield tensorboard.base


@pytest.fixture(scope="module")
def cli_alerts(demo):
    """``{run: [alert tuples]}`` from ``tensorboard-gradients diagnose LOGDIR --json``."""
    done = subprocess.run(
        [sys.executable, "-m", "tensorboard_gradients", "diagnose", str(demo[0]), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 1, done.stderr  # the exploding run's NaN and explosion: critical
    found = {}
    for alert in json.loads(done.stdout)["alerts"]:
        found.setdefault(alert["run"], []).append(tuple(alert[f] for f in ALERT_FIELDS))
    return found


def open_run(browser, base, run):
    tab = Tab(browser, base, f"#run={urllib.parse.quote(run, safe='')}&tag=gradients&axis=step")
    tab.wait_drawn()
    alerts = tab.wait_alerts()
    return tab, alerts


def test_the_vanishing_runs_first_layers_are_flagged(browser, server):
    tab, alerts = open_run(browser, server, "vanishing/train")
    rows = tab.page.evaluate("window.gradientsApp.matrix.variables.length")
    assert rows == 26  # 12 sigmoid layers + logits, kernel and bias each
    pixels = tab.pixels()
    assert has_color(row_band(pixels, 0, 1, rows), VANISHING_HATCH_RGB)  # dense_00
    assert not has_color(row_band(pixels, 22, 25, rows), VANISHING_HATCH_RGB)  # dense_11, logits
    assert not has_color(pixels, EXPLODING_HATCH_RGB) and not has_color(pixels, NONFINITE_RGB)
    first = tab.page.locator("[data-testid=alert-group]").first.inner_text()
    assert "VANISHING" in first.upper() and "dense_00" in first
    tab.close()


def test_the_exploding_run_shows_exploding_cells_then_its_first_nan_step(browser, server, runs):
    tab, alerts = open_run(browser, server, "exploding/train")
    first_nan = min(a["first_step"] for a in alerts if a["kind"] == "nonfinite")
    assert first_nan == runs["exploding/train"]["gradients"].steps[-1]  # TerminateOnNaN stopped it
    callout = tab.page.locator("[data-testid=first-nonfinite]").inner_text()
    assert f"step {first_nan}" in callout
    pixels = tab.pixels()
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    width = pixels.shape[1]
    nan_from = width * steps.index(first_nan) // len(steps)
    assert has_color(pixels[:, nan_from:], NONFINITE_RGB)
    assert has_color(pixels[:, :nan_from], EXPLODING_HATCH_RGB), "exploding cells before the NaN"
    assert not has_color(pixels[:, :nan_from], NONFINITE_RGB)
    assert tab.page.locator("[data-testid=alert-group]").first.inner_text().upper().startswith(
        "CRITICAL")
    tab.close()


@pytest.mark.parametrize("run", HEALTHY_RUNS)
def test_the_healthy_and_fixed_runs_show_no_alerts(browser, server, run):
    tab, alerts = open_run(browser, server, run)
    assert alerts == []
    assert tab.page.locator(".alerts h2").inner_text() == "No alerts"
    pixels = tab.pixels()
    for colour in (VANISHING_HATCH_RGB, SPIKE_HATCH_RGB, EXPLODING_HATCH_RGB, NONFINITE_RGB):
        assert not has_color(pixels, colour), (run, colour)
    tab.close()


def test_the_cli_says_what_the_tab_says(browser, server, runs, cli_alerts):
    assert set(cli_alerts) == {"vanishing/train", "exploding/train"}
    for run in runs:
        tab, alerts = open_run(browser, server, run)
        shown = [tuple(a[f] for f in ALERT_FIELDS) for a in alerts]
        assert shown == cli_alerts.get(run, []), run
        open_every_finding(tab)
        assert tab.page.locator("[data-testid=alert]").count() == len(shown)
        tab.close()
