"""The Gradients tab in a real Chromium, against a real `tensorboard` serving real training logs.

Runs: the demo's deep sigmoid net (input-side layers vanish) and its healthy ReLU twin, a Keras
model whose batch at optimizer step 3 holds a NaN (every gradient is NaN from there on), and a
run with a variable named like an XSS payload. Screenshots go to $GRADIENTS_ARTIFACTS (default:
the test's tmp dir).
"""

import os
import pathlib
import shutil
import socket
import json
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

import tensorboard_gradients as tg

ROOT = pathlib.Path(__file__).resolve().parents[1]
playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# .ci/run installs Debian's chromium and sets GRADIENTS_REQUIRE_BROWSER=1, so CI cannot skip these.
if CHROMIUM is None and not os.environ.get("GRADIENTS_REQUIRE_BROWSER"):
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
XSS_NAME = "<img src=x onerror=window.__xss=1>/kernel"
NAN_STEP = 3
NONFINITE_RGB = (255, 45, 85)
VANISHING_HATCH_RGB = (200, 240, 255)
EXPLODING_HATCH_RGB = (150, 0, 20)


def _train_nan_keras_model(run_dir):
    import keras

    from tensorboard_gradients.keras import GradientMonitor

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    x[(NAN_STEP - 1) * 8] = np.nan  # the third batch of 8: optimizer step 3
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[GradientMonitor(run_dir)])


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("browser_logs")
    sys.path.insert(0, str(ROOT / "demo"))
    try:
        import train as demo
    finally:
        sys.path.pop(0)
    for name, scenario in demo.SCENARIOS.items():
        demo.train(str(root / name), steps=60, **scenario)
    _train_nan_keras_model(str(root / "nan_keras"))
    with tg.GradientWriter(str(root / "xss")) as writer:
        for step in range(10):
            writer.write(step, {XSS_NAME: np.full(3, 0.5), "dense/bias": np.full(3, 0.1)})
    return str(root)


def _serve(logdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1",
         "--port", str(port), "--load_fast=false", "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(base + "/data/plugin/gradients/runs", timeout=5)
            return process, base
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("tensorboard did not start")


@pytest.fixture(scope="module")
def server(logdir):
    process, base = _serve(logdir)
    # Wait until every run is loaded with every step.
    deadline = time.time() + 90
    while time.time() < deadline:
        runs = json.loads(urllib.request.urlopen(base + "/data/plugin/gradients/runs").read())
        if {"relu_he", "sigmoid_deep", "xss", "nan_keras/train"} <= set(runs) and all(
            runs[r]["gradients"]["steps"] == 60 for r in ("relu_he", "sigmoid_deep")
        ):
            break
        time.sleep(0.5)
    yield base
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def artifacts(tmp_path):
    directory = pathlib.Path(os.environ.get("GRADIENTS_ARTIFACTS", tmp_path))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class Tab:
    """The plugin's page as TensorBoard frames it (`data/plugin_entry.html?name=gradients`)."""

    def __init__(self, browser, base, hash_=""):
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.base = base
        self.page.goto(f"{base}/data/plugin_entry.html?name=gradients{hash_}")

    def wait_drawn(self):
        """Waits for the heatmap's draw after the latest load (fails with the page's message)."""
        self.page.wait_for_function(
            "(window.gradientsApp && window.gradientsApp.drawn) || document.querySelector('.status-error')")
        error = self.page.locator(".status-error")
        assert error.count() == 0, error.inner_text()

    def pixels(self, selector="[data-testid=heatmap-canvas]"):
        """Every pixel of a canvas as an [height, width, 4] array."""
        data = self.page.evaluate(
            """(selector) => {
                const c = document.querySelector(selector);
                return [c.width, c.height, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)];
            }""", selector)
        width, height, flat = data
        return np.array(flat, dtype=np.uint8).reshape(height, width, 4)

    def canvas_box(self):
        return self.page.locator("[data-testid=heatmap-canvas]").bounding_box()

    def close(self):
        assert self.errors == [], self.errors
        self.page.close()


def has_color(pixels, rgb):
    return bool(np.all(pixels[..., :3] == rgb, axis=-1).any())


def test_the_tab_appears_in_tensorboard_and_draws_in_its_frame(browser, server, artifacts):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(server + "/")
    page.get_by_text("Gradients", exact=True).first.click()
    frame = page.frame_locator("iframe")
    frame.locator("[data-testid=heatmap-canvas]").wait_for(state="visible", timeout=60000)
    frame.locator(".alerts h2").wait_for(timeout=60000)
    labels = frame.locator("canvas.labels").bounding_box()
    cells = frame.locator("[data-testid=heatmap-canvas]").bounding_box()
    assert labels["x"] + labels["width"] <= cells["x"] + 1 and abs(labels["y"] - cells["y"]) < 1
    assert frame.locator(".alerts h2").inner_text().startswith(("Alerts", "No alerts"))
    page.screenshot(path=str(artifacts / "tensorboard_gradients_tab.png"))
    page.close()


def test_vanishing_layers_are_flagged_and_hover_and_click_explain_them(browser, server, artifacts):
    tab = Tab(browser, server, "#run=sigmoid_deep&tag=gradients")
    tab.wait_drawn()
    pixels = tab.pixels()
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 20, "the heatmap has real colour"
    rows = 26  # 13 dense layers x (kernel, bias)
    top_rows = pixels[: pixels.shape[0] * 4 // rows]  # dense_00 and dense_01
    bottom_rows = pixels[-pixels.shape[0] * 4 // rows:]  # dense_11 and logits
    assert has_color(top_rows, VANISHING_HATCH_RGB)
    assert not has_color(bottom_rows, VANISHING_HATCH_RGB)
    alerts = tab.page.locator("[data-testid=alert]")
    assert alerts.count() > 0
    assert "dense_00" in alerts.first.inner_text() and "vanishing" in alerts.first.inner_text().lower()
    box = tab.canvas_box()
    tab.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 2)
    tooltip = tab.page.locator(".tooltip")
    tooltip.wait_for(state="visible")
    assert "sigmoid_deep/dense_00/kernel" in tooltip.inner_text()
    assert "vanishing" in tooltip.inner_text()
    tab.page.wait_for_function("document.querySelector('.tip-extra').textContent.includes('zero fraction')")
    assert "norm " in tooltip.inner_text() and "NaN 0" in tooltip.inner_text()
    tab.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + 2)
    details = tab.page.locator(".details")
    details.wait_for(state="visible")
    assert "sigmoid_deep/dense_00/kernel" in details.inner_text()
    assert "nan_count" in details.inner_text()
    chart = tab.pixels("[data-testid=series-chart]")
    assert (chart[..., 3] > 0).sum() > 500, "the series chart is drawn"
    assert "|g| distribution" in details.inner_text() or "histogram" not in details.inner_text()
    tab.page.screenshot(path=str(artifacts / "sigmoid_deep.png"), full_page=True)
    tab.close()


def test_drag_zooms_into_steps_at_full_resolution_and_the_loss_lines_up(browser, server):
    tab = Tab(browser, server, "#run=sigmoid_deep&tag=gradients")
    tab.wait_drawn()
    loss = tab.page.locator("[data-testid=loss-curve]")
    loss.wait_for(state="visible")
    assert (tab.pixels("[data-testid=loss-curve]")[..., 3] > 0).sum() > 100
    assert abs(loss.bounding_box()["width"] - tab.canvas_box()["width"]) < 1
    box = tab.canvas_box()
    tab.page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + 20)
    tab.page.mouse.down()
    tab.page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 40, steps=5)
    tab.page.mouse.up()
    tab.page.wait_for_function("location.hash.includes('zoom=')")
    tab.wait_drawn()
    first, last = map(int, tab.page.evaluate("location.hash").split("zoom=")[1].split("&")[0].split("-"))
    assert 10 <= first < last <= 35
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    assert steps == list(range(first, last + 1))
    tab.page.locator("[data-testid=reset-zoom]").click()
    tab.page.wait_for_function("!location.hash.includes('zoom=')")
    tab.wait_drawn()
    assert len(tab.page.evaluate("window.gradientsApp.matrix.steps")) == 60
    tab.close()


def test_the_nan_step_is_flagged_and_called_out(browser, server, artifacts):
    tab = Tab(browser, server, "#run=nan_keras%2Ftrain&tag=gradients&axis=step")
    tab.wait_drawn()
    callout = tab.page.locator("[data-testid=first-nonfinite]")
    assert f"step {NAN_STEP}" in callout.inner_text()
    pixels = tab.pixels()
    columns = int(tab.page.evaluate("window.gradientsApp.matrix.columns"))
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    column = steps.index(NAN_STEP)
    width = pixels.shape[1]
    before = pixels[:, : width * column // columns]
    at = pixels[:, width * column // columns: width * (column + 1) // columns]
    assert has_color(at, NONFINITE_RGB) and not has_color(before, NONFINITE_RGB)
    tab.page.screenshot(path=str(artifacts / "nan_keras.png"), full_page=True)
    tab.close()


def test_thresholds_change_the_highlighting_and_survive_a_reload(browser, server):
    tab = Tab(browser, server, "#run=relu_he&tag=gradients")
    tab.wait_drawn()
    assert not has_color(tab.pixels(), EXPLODING_HATCH_RGB)
    tab.page.get_by_role("button", name="Thresholds").click()
    field = tab.page.locator("[data-testid=threshold-exploding_norm]")
    field.fill("1e-6")
    field.dispatch_event("change")
    tab.page.wait_for_function("location.hash.includes('t.exploding_norm=0.000001')")
    tab.page.wait_for_function(
        "window.gradientsApp.matrix && window.gradientsApp.alerts.some(a => a.kind === 'exploding')")
    tab.wait_drawn()
    assert has_color(tab.pixels(), EXPLODING_HATCH_RGB)
    assert tab.page.url.startswith(f"{server}/data/plugin_entry.html?name=gradients#")
    tab.page.reload()
    tab.wait_drawn()
    tab.page.wait_for_function("window.gradientsApp.alerts && window.gradientsApp.alerts.length > 0")
    assert has_color(tab.pixels(), EXPLODING_HATCH_RGB)
    tab.page.get_by_role("button", name="Thresholds").click()
    assert tab.page.locator("[data-testid=threshold-exploding_norm]").input_value() == "0.000001"
    tab.page.get_by_role("button", name="Reset to defaults").click()
    tab.page.wait_for_function("!location.hash.includes('exploding_norm')")
    tab.close()


def test_a_variable_named_like_html_renders_as_text_and_runs_nothing(browser, server):
    tab = Tab(browser, server, "#run=xss&tag=gradients")
    tab.wait_drawn()
    box = tab.canvas_box()
    tab.page.mouse.move(box["x"] + 5, box["y"] + 5)
    tooltip = tab.page.locator(".tooltip")
    tooltip.wait_for(state="visible")
    assert XSS_NAME in tooltip.inner_text()
    assert tab.page.evaluate("window.__xss") is None
    assert tab.page.locator(".tooltip img").count() == 0
    tab.close()


def test_backend_errors_are_shown_not_blank(browser, server):
    # update_ratio_low above update_ratio_high is refused by the plugin with a 400.
    tab = Tab(browser, server, "#run=relu_he&tag=gradients&t.update_ratio_low=0.5")
    tab.page.wait_for_function("document.querySelector('.status-error')")
    text = tab.page.locator(".status-error").inner_text()
    assert "update_ratio_low must be below update_ratio_high" in text
    tab.close()


def test_an_empty_logdir_shows_how_to_log_gradients(browser, tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from test_format import _write_future_format
    finally:
        sys.path.pop(0)
    _write_future_format(str(tmp_path / "future"))  # unreadable data is named, not hidden
    process, base = _serve(str(tmp_path))
    try:
        tab = Tab(browser, base)
        empty = tab.page.locator("[data-testid=empty-state]")
        empty.wait_for(state="visible")
        assert "GradientMonitor" in empty.inner_text() and "summary.gradients" in empty.inner_text()
        assert "future/gradients" in empty.inner_text() and "upgrade" in empty.inner_text()
        tab.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_epoch_view_live_refresh_and_downloads(browser, server):
    # 2 epochs of 8 steps: the run opens on the layer-by-epoch view.
    tab = Tab(browser, server, "#run=nan_keras%2Ftrain&tag=gradients")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") == [0, 1]
    tab.page.get_by_role("button", name="Steps", exact=True).click()
    tab.page.wait_for_function("location.hash.includes('axis=step')")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") is None
    href = tab.page.locator("[data-testid=download-csv]").get_attribute("href")
    assert href.startswith("export?") and "format=csv" in href
    csv = tab.page.request.get(f"{server}/data/plugin/gradients/{href}").text()
    assert csv.startswith("step,variable,layer,l2_norm")
    with tab.page.expect_download() as download:
        tab.page.get_by_role("button", name="PNG").click()
    assert download.value.suggested_filename.endswith(".png")
    # A refresh that finds the same number of steps keeps the view; the selection survives one
    # that finds more (checked by the app's own state, the periodic timer is 30 s).
    tab.page.mouse.click(tab.canvas_box()["x"] + 5, tab.canvas_box()["y"] + 5)
    tab.page.locator(".details").wait_for(state="visible")
    tab.page.evaluate("window.gradientsApp.runs[window.gradientsApp.state.run].gradients.steps = 1")
    tab.page.evaluate("window.gradientsApp.refreshIfGrown()")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.selected") == [0, 0]
    tab.close()


def test_dark_mode_and_tiny_runs(browser, tmp_path):
    with tg.GradientWriter(str(tmp_path / "one")) as writer:
        writer.write(0, {"only/kernel": np.ones(2)})
    process, base = _serve(str(tmp_path))
    try:
        page = browser.new_page(color_scheme="dark")
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{base}/data/plugin_entry.html?name=gradients#run=one&tag=gradients")
        page.wait_for_function("window.gradientsApp && window.gradientsApp.drawn", timeout=60000)
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(32, 33, 36)"
        assert page.evaluate("[window.gradientsApp.matrix.rows, window.gradientsApp.matrix.columns]") == [1, 1]
        assert errors == []
        page.close()
    finally:
        process.terminate()
        process.wait(timeout=30)
