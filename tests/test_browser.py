"""The Gradients tab in a real Chromium, against a real `tensorboard` serving real training logs.

Runs: the demo's (quick mode: its deep sigmoid net, whose input-side layers vanish, and its
healthy ReLU net), a Keras model whose batch at optimizer step 3 holds a NaN (every gradient is
NaN from there on), and a run with a variable named like an XSS payload. Screenshots go to
$GRADIENTS_ARTIFACTS (default: the test's tmp dir). `test_demo_end_to_end.py` checks every demo
scenario against the CLI.
"""

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

import tensorboard_gradients as tg
from tensorboard_gradients.server.vocabulary import CLASS_STYLES, SEVERITY_COLORS
from support import (
    CHROMIUM, EXPLODING_HATCH_RGB, NONFINITE_RGB, VANISHING_HATCH_RGB, Tab, TensorBoard, get_json,
    has_color, row_band,
)

pytest.importorskip("playwright.sync_api")
# .ci/run installs Debian's chromium and sets GRADIENTS_REQUIRE_BROWSER=1, so CI cannot skip these.
if CHROMIUM is None and not os.environ.get("GRADIENTS_REQUIRE_BROWSER"):
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
XSS_NAME = "<img src=x onerror=window.__xss=1>/kernel"
NAN_STEP = 3
VANISHING = "vanishing%2Ftrain"
HEALTHY = "healthy%2Ftrain"


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
def logdir(tmp_path_factory, demo):
    root = tmp_path_factory.mktemp("browser_logs")
    for run in ("vanishing", "healthy"):
        shutil.copytree(demo[0] / run, root / run)
    _train_nan_keras_model(str(root / "nan_keras"))
    with tg.GradientWriter(str(root / "xss")) as writer:
        for step in range(10):
            writer.write(step, {XSS_NAME: np.full(3, 0.5), "dense/bias": np.full(3, 0.1)})
    return root


@pytest.fixture(scope="module")
def steps(logdir):
    """Logged steps of each run's `gradients` tag."""
    return {run: len(tags["gradients"].steps) for run, tags in tg.read_logdir(str(logdir)).items()}


@pytest.fixture(scope="module")
def server(logdir, steps):
    with TensorBoard(logdir) as tensorboard:
        tensorboard.wait_for_steps(steps)
        yield tensorboard.base


@pytest.fixture
def artifacts(tmp_path):
    directory = pathlib.Path(os.environ.get("GRADIENTS_ARTIFACTS", tmp_path))
    directory.mkdir(parents=True, exist_ok=True)
    return directory


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
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step")
    tab.wait_drawn()
    pixels = tab.pixels()
    assert len(np.unique(pixels.reshape(-1, 4), axis=0)) > 20, "the heatmap has real colour"
    rows = 26  # 13 dense layers x (kernel, bias)
    assert has_color(row_band(pixels, 0, 3, rows), VANISHING_HATCH_RGB)  # dense_00, dense_01
    assert not has_color(row_band(pixels, 22, 25, rows), VANISHING_HATCH_RGB)  # dense_11, logits
    alerts = tab.page.locator("[data-testid=alert]")
    assert alerts.count() > 0
    assert "dense_00" in alerts.first.inner_text() and "vanishing" in alerts.first.inner_text().lower()
    box = tab.canvas_box()
    tab.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 2)
    tooltip = tab.page.locator(".tooltip")
    tooltip.wait_for(state="visible")
    assert "dense_00/kernel" in tooltip.inner_text()
    assert "vanishing" in tooltip.inner_text()
    tab.page.wait_for_function("document.querySelector('.tip-extra').textContent.includes('zero fraction')")
    assert "norm " in tooltip.inner_text() and "NaN 0" in tooltip.inner_text()
    tab.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + 2)
    details = tab.page.locator(".details")
    details.wait_for(state="visible")
    assert "dense_00/kernel" in details.inner_text()
    assert "nan_count" in details.inner_text()
    chart = tab.pixels("[data-testid=series-chart]")
    assert (chart[..., 3] > 0).sum() > 500, "the series chart is drawn"
    assert "|g| distribution" in details.inner_text() or "histogram" not in details.inner_text()
    tab.page.screenshot(path=str(artifacts / "vanishing.png"), full_page=True)
    tab.close()


def test_drag_zooms_into_steps_at_full_resolution_and_the_loss_lines_up(browser, server, steps):
    total = steps["vanishing/train"]
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step")
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
    assert 0.15 * total <= first < last <= 0.6 * total
    zoomed = tab.page.evaluate("window.gradientsApp.matrix.steps")
    assert zoomed == list(range(first, last + 1))
    tab.page.locator("[data-testid=reset-zoom]").click()
    tab.page.wait_for_function("!location.hash.includes('zoom=')")
    tab.wait_drawn()
    assert len(tab.page.evaluate("window.gradientsApp.matrix.steps")) == total
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


def _css_rgb(color):
    """"#d93025" or [217, 48, 37] as the browser computes it: "rgb(217, 48, 37)"."""
    channels = color if isinstance(color, list) else [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    return "rgb({}, {}, {})".format(*channels)


def test_the_tab_paints_with_the_served_vocabulary(browser, server):
    served = get_json(f"{server}/data/plugin/gradients/thresholds")["vocabulary"]
    assert {c["name"]: {k: c[k] for k in CLASS_STYLES[c["name"]]} for c in served["classes"]} == CLASS_STYLES
    assert {s["name"]: s["color"] for s in served["severities"]} == SEVERITY_COLORS
    tab = Tab(browser, server, "#run=nan_keras%2Ftrain&tag=gradients&axis=step")
    tab.wait_drawn()
    alerts = tab.wait_alerts()
    page = tab.page
    nonfinite = CLASS_STYLES["nonfinite"]
    # The stylesheet's colours: custom properties on the tab's root, from the served answer.
    variable = "(name) => getComputedStyle(window.gradientsApp.root).getPropertyValue(name).trim()"
    assert page.evaluate(variable, "--class-nonfinite-fill") == _css_rgb(nonfinite["fill"])
    for name, color in SEVERITY_COLORS.items():
        assert page.evaluate(variable, f"--severity-{name}") == color
    # Each alert is edged in its severity's colour; the callout is in the NaN alerts' one.
    edges = page.locator("[data-testid=alert]").evaluate_all(
        "(buttons) => buttons.map((b) => getComputedStyle(b).borderLeftColor)")
    assert edges == [_css_rgb(SEVERITY_COLORS[alert["severity"]]) for alert in alerts]
    callout = page.locator("[data-testid=first-nonfinite]")
    assert nonfinite["label"] in callout.inner_text()
    assert callout.evaluate("(p) => getComputedStyle(p).color") == _css_rgb(SEVERITY_COLORS["critical"])
    # The legend's chips: the fill, and the hatch stripes in their colours.
    chip = "(label) => { const item = [...document.querySelectorAll('.legend-item')].find((i) => i.textContent === label); " \
           "const s = getComputedStyle(item.querySelector('.chip')); return [s.backgroundColor, s.backgroundImage]; }"
    assert page.evaluate(chip, nonfinite["label"])[0] == _css_rgb(nonfinite["fill"])
    for name in ("vanishing", "exploding"):
        assert _css_rgb(CLASS_STYLES[name]["hatch"]["rgb"]) in page.evaluate(chip, CLASS_STYLES[name]["label"])[1]
    # On canvas: the NaN cells in the fill, each row's alert dot in its most urgent severity's colour.
    assert has_color(tab.pixels(), nonfinite["fill"])
    rows = page.evaluate("[...window.gradientsApp.view.rowSeverity]")
    labels = tab.pixels("canvas.labels")
    height = labels.shape[0]
    count = page.evaluate("window.gradientsApp.matrix.rows")
    assert rows
    for row, severity in rows:
        dot = labels[int(height * (row + 0.5) / count), 6, :3].tolist()
        assert _css_rgb(dot) == _css_rgb(SEVERITY_COLORS[severity])
    # The tooltip names a NaN cell's class in the class's tooltip colour.
    steps = page.evaluate("window.gradientsApp.matrix.steps")
    box = tab.canvas_box()
    page.mouse.move(box["x"] + box["width"] * (steps.index(NAN_STEP) + 0.5) / len(steps), box["y"] + 5)
    tip = page.locator(".tip-class")
    tip.wait_for(state="visible")
    assert tip.evaluate("(t) => getComputedStyle(t).color") == _css_rgb(nonfinite["tooltip"])
    tab.close()


def test_thresholds_change_the_highlighting_and_survive_a_reload(browser, server):
    tab = Tab(browser, server, f"#run={HEALTHY}&tag=gradients")
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
    tab = Tab(browser, server, f"#run={HEALTHY}&tag=gradients&t.update_ratio_low=0.5")
    tab.page.wait_for_function("document.querySelector('.status-error')")
    text = tab.page.locator(".status-error").inner_text()
    assert "update_ratio_low must be below update_ratio_high" in text
    tab.close()


def test_an_empty_logdir_shows_how_to_log_gradients(browser, tmp_path):
    from test_format import _write_future_format

    _write_future_format(str(tmp_path / "future"))  # unreadable data is named, not hidden
    with TensorBoard(tmp_path) as tensorboard:
        tab = Tab(browser, tensorboard.base)
        empty = tab.page.locator("[data-testid=empty-state]")
        empty.wait_for(state="visible")
        assert "GradientMonitor" in empty.inner_text() and "summary.gradients" in empty.inner_text()
        assert "future/gradients" in empty.inner_text() and "upgrade" in empty.inner_text()
        tab.close()


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
    with TensorBoard(tmp_path) as tensorboard:
        page = browser.new_page(color_scheme="dark")
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{tensorboard.base}/data/plugin_entry.html?name=gradients#run=one&tag=gradients")
        page.wait_for_function("window.gradientsApp && window.gradientsApp.drawn", timeout=60000)
        background = page.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(32, 33, 36)"
        assert page.evaluate("[window.gradientsApp.matrix.rows, window.gradientsApp.matrix.columns]") == [1, 1]
        assert errors == []
        page.close()


def test_damaged_runs_are_named_while_the_healthy_run_draws(browser, tmp_path):
    from test_server_robustness import BOMB_SHAPE, expected_steps, write_logdir

    write_logdir(tmp_path)
    expected = expected_steps("false")
    with TensorBoard(tmp_path) as tensorboard:
        tensorboard.wait_for(
            lambda: {run: tags.get("gradients", {}).get("steps")
                     for run, tags in (tensorboard.runs() or {}).items()} == expected,
            "every run to be loaded")
        tab = Tab(browser, tensorboard.base, "#run=good&tag=gradients&axis=step")
        tab.wait_drawn()
        assert len(np.unique(tab.pixels().reshape(-1, 4), axis=0)) > 5, "the heatmap is drawn"
        assert tab.page.evaluate("window.gradientsApp.matrix.columns") == expected["good"]
        problems = tab.page.locator("[data-testid=data-problems]")
        problems.wait_for(state="visible")
        text = problems.inner_text()
        assert "tags cannot be read" in text and "tags have damaged data" in text
        assert "version_overflow/gradients: gradients metadata is malformed" in text
        assert (f"bomb/gradients: 1 logged step of this tag was refused as damaged: a tensor of "
                f"shape {BOMB_SHAPE}") in text
        assert "checksum/gradients: 1 logged step of this tag was left out" in text
        # The damaged run itself: its good steps drawn, the refusal said above them.
        tab.page.evaluate("location.hash = '#run=bomb&tag=gradients&axis=step'")
        tab.page.wait_for_function("window.gradientsApp.matrix.run === 'bomb'")
        tab.wait_drawn()
        assert tab.page.evaluate("window.gradientsApp.matrix.columns") == expected["bomb"]
        assert "refused as damaged" in tab.page.locator(".status-warning").inner_text()
        tab.close()


def test_a_statistic_the_tab_does_not_know_is_offered_and_drawn(browser, tmp_path):
    """A newer writer's column reaches the picker under its own name, and a known one under the
    served label: the tab keeps no list of statistics of its own."""
    from tensorboard_gradients.format import columns
    from tensorboard_gradients.format.layout import Layout

    newer = Layout.create(["dense/kernel", "dense/bias"], [(3, 2), (2,)], with_weights=False)
    newer = Layout(newer.variables, newer.layers, newer.shapes,
                   newer.stats + ("sign_agreement",))
    with tg.GradientWriter(str(tmp_path / "newer")) as writer:
        for step in range(4):
            stats = np.ones((2, len(newer.stats)), np.float32)
            stats[:, [columns.position(newer.stats, c) for c in ("nan_count", "inf_count")]] = 0
            stats[:, -1] = 0.25 * (step + 1)
            writer.write_statistics(step, newer, stats)
    with TensorBoard(tmp_path) as tensorboard:
        tensorboard.wait_for_steps({"newer": 4})
        tab = Tab(browser, tensorboard.base, "#run=newer&tag=gradients")
        tab.wait_drawn()
        picker = tab.page.locator("[data-testid=stat-picker]")
        offered = dict(picker.locator("option").evaluate_all(
            "options => options.map(o => [o.value, o.textContent])"))
        assert offered["sign_agreement"] == "sign_agreement"
        assert offered["l2_norm"] == columns.BY_NAME["l2_norm"].label
        assert "size" not in offered  # not a heatmap (`Stat.heatmap`)
        picker.select_option("sign_agreement")
        tab.page.wait_for_function("location.hash.includes('stat=sign_agreement')")
        tab.page.wait_for_function("window.gradientsApp.matrix && window.gradientsApp.matrix.stat"
                                   " === 'sign_agreement' && window.gradientsApp.drawn")
        assert len(np.unique(tab.pixels().reshape(-1, 4), axis=0)) > 2, "the heatmap is drawn"
        tab.close()


def test_a_long_run_still_being_read_is_asked_again_until_whole(browser, tmp_path):
    """Right after TensorBoard starts, the plugin may still be reading a long run: its answers
    show the steps read so far and count the rest (``steps_to_read``). The tab then asks again
    by itself until the run is whole. A run that reads in a blink is made to answer "still
    being read" once (the first heatmap's answer rewritten in the browser), so the test sees
    the tab come back for the rest."""
    rng = np.random.default_rng(0)
    with tg.GradientWriter(str(tmp_path / "long")) as writer:
        for step in range(1300):  # more logged steps than TensorBoard keeps: a long run
            writer.write(step, {"dense/kernel": rng.normal(size=(4, 3)),
                                "dense/bias": rng.normal(size=3)})
    answers = []

    def first_answer_partial(route):
        response = route.fetch()
        body = response.json()
        answers.append(body["steps_to_read"])
        if len(answers) == 1:
            body.update(steps_to_read=700, sampled="this long run is still being read from its "
                        "event files: 600 of its 1,300 logged steps so far")
        headers = {name: value for name, value in response.headers.items()
                   if name.lower() not in ("content-encoding", "content-length")}
        route.fulfill(status=response.status, headers=headers, body=json.dumps(body))

    with TensorBoard(tmp_path) as tensorboard:
        tensorboard.wait_for_steps({"long": 1300})
        tab = Tab(browser, tensorboard.base, "#run=long&tag=gradients",
                  routes=[("**/data/plugin/gradients/heatmap?*", first_answer_partial)])
        tab.page.wait_for_function(  # one check: the tab may ask again right after
            "window.gradientsApp && window.gradientsApp.matrix"
            " && window.gradientsApp.matrix.stepsToRead === 700"
            " && document.querySelector('.status').textContent.includes('still being read')")
        # No click, no reload: the tab asks again and draws the whole run.
        tab.page.wait_for_function("window.gradientsApp.drawn"
                                   " && window.gradientsApp.matrix.stepsToRead === 0", timeout=20000)
        assert answers[0] == 0 and len(answers) >= 2
        assert "still being read" not in tab.page.locator(".status").inner_text()
        assert tab.page.evaluate("window.gradientsApp.matrix.lastSteps.at(-1)") == 1299
        tab.close()
