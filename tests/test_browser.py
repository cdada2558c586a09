"""The Gradients tab in a real Chromium, against a real `tensorboard` serving real training logs.

Runs: the demo's (quick mode: its deep sigmoid net, whose input-side layers vanish, the same net
fixed, and its healthy ReLU net: "vanishing/train" and "vanishing_fixed/train" are in natural
order as a path reads, a locale's collation swaps them), a Keras model whose batch at optimizer
step 3 holds a NaN (every gradient is NaN from there on), a run with a variable named like an XSS
payload, a written run that diverges in the second of its two epochs (its loss from 2.1 to
2e16), a healthy one of 120 one-step epochs with its loss (the two named so that natural and
code-point order differ) and one whose 1,000 variables all get a NaN gradient at one step (1,000
alerts, one finding). Screenshots go to $GRADIENTS_ARTIFACTS (default: the test's tmp dir).
`test_demo_end_to_end.py` checks every demo scenario against the CLI.
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
    CHROMIUM, UNMATCHED_HATCH_RGB, UNMATCHED_RGB, EXPLODING_HATCH_RGB, NONFINITE_RGB, VANISHING_HATCH_RGB, Tab, TensorBoard,
    boxes_overlap, canvas_pixels, get_json, has_color, ink_runs, natural_key, open_every_finding, row_band,
)

pytest.importorskip("playwright.sync_api")
# .ci/run installs Debian's chromium and sets GRADIENTS_REQUIRE_BROWSER=1, so CI cannot skip these.
if CHROMIUM is None and not os.environ.get("GRADIENTS_REQUIRE_BROWSER"):
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
XSS_NAME = "<img src=x onerror=window.__xss=1>/kernel"
NAN_STEP = 3
VANISHING = "vanishing%2Ftrain"
DARK_BACKGROUND = "rgb(48, 48, 48)"  # TensorBoard's own dark grey
HEALTHY = "healthy%2Ftrain"
DIVERGED = "lr_9_diverged"
MANY_EPOCHS = "lr_10_many_epochs"
MANY_EPOCHS_COUNT = 120
# A run whose 1,000 variables all get a NaN gradient at one step: 1,000 alerts, one finding.
MANY_ALERTS = "many_alerts"
# A run whose loss spikes 10x at LOSS_SPIKE_STEP, after one kernel's gradient rose 50x at
# MOVER_STEP: a loss-spike finding that names the variable that moved first.
LOSS_SPIKE = "lr_11_loss_spike"
LOSS_SPIKE_STEP, MOVER_STEP = 82, 78
# A run still training: healthy for its first steps; a test writes more, its loss spiking.
GROWING = "lr_12_growing"
GROWING_STEPS = 70  # before MOVER_STEP
MANY_ALERTS_VARIABLES = 1000
MANY_ALERTS_NAN_STEP = 5
# The diverged run: 2 epochs of 20 steps (1-20, 21-40); norms of 1, then 1e3 times larger at each
# step from EXPLODING_STEP (exploding cells), NaN from NONFINITE_STEP on.
EXPLODING_STEP = 25
NONFINITE_STEP = 30


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


def _diverged_climb(step):
    """How many steps the diverged run has been exploding at ``step`` (0 before)."""
    return max(0, step - EXPLODING_STEP + 1)


def _diverged_loss(step):
    """The diverged run's loss at ``step`` (logged until NONFINITE_STEP, NaN from there on)."""
    return 2.1 * 10.0 ** (3.2 * _diverged_climb(step))


def _write_diverged_run(run_dir):
    """Two layers over 2 epochs of 20 steps that diverge (see EXPLODING_STEP), with their loss."""
    rng = np.random.default_rng(0)
    with tg.GradientWriter(run_dir) as writer:
        for step in range(1, 41):
            if step in (1, 21):
                writer.write_epoch(step, (step - 1) // 20)
            gradients = {f"dense_{i}/{part}": 10.0 ** (3 * _diverged_climb(step)) * rng.normal(size=shape)
                         for i in range(2) for part, shape in (("kernel", (4, 4)), ("bias", 4))}
            if step >= NONFINITE_STEP:
                gradients = {name: np.full(g.shape, np.nan) for name, g in gradients.items()}
            else:  # the loss is NaN from there on: not a scalar of the curve
                writer.write_scalars(step, {"loss": _diverged_loss(step)})
            # Beside the gradients, NaN included: the loss-spike rule's evidence.
            writer.write(step, gradients, loss=_diverged_loss(step) if step < NONFINITE_STEP
                         else float("nan"))


def _write_loss_spike_run(run_dir, steps=range(120), seed=3):
    rng = np.random.default_rng(seed)
    with tg.GradientWriter(run_dir) as writer:
        for step in steps:
            rise = 50.0 if MOVER_STEP <= step < LOSS_SPIKE_STEP + 6 else 1.0
            spiking = LOSS_SPIKE_STEP <= step < LOSS_SPIKE_STEP + 6
            loss = (10.0 if spiking else 1.0) * (1 + 0.05 * rng.random())
            writer.write_scalars(step, {"loss": loss})
            writer.write(step, {"dense_0/kernel": rng.normal(size=(4, 4)),
                                "dense_1/kernel": rise * rng.normal(size=(4, 4)),
                                "dense_1/bias": rng.normal(size=4)}, loss=loss)


def _write_many_alerts_run(run_dir):
    rng = np.random.default_rng(2)
    with tg.GradientWriter(run_dir) as writer:
        for step in range(8):
            nan = step == MANY_ALERTS_NAN_STEP
            writer.write(step, {f"dense_{i:04d}/kernel": np.full(2, np.nan) if nan else rng.normal(size=2)
                                for i in range(MANY_ALERTS_VARIABLES)})


def _many_epochs_loss(step):
    return 2.0 * 0.98 ** step


def _write_many_epochs_run(run_dir):
    rng = np.random.default_rng(1)
    with tg.GradientWriter(run_dir) as writer:
        for step in range(MANY_EPOCHS_COUNT):
            writer.write_epoch(step, step)
            writer.write_scalars(step, {"loss": _many_epochs_loss(step)})
            writer.write(step, {"dense/kernel": rng.normal(size=(4, 4)),
                                "dense/bias": rng.normal(size=4)})


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, demo):
    root = tmp_path_factory.mktemp("browser_logs")
    for run in ("vanishing", "vanishing_fixed", "healthy"):
        shutil.copytree(demo[0] / run, root / run)
    _train_nan_keras_model(str(root / "nan_keras"))
    with tg.GradientWriter(str(root / "xss")) as writer:
        for step in range(10):
            writer.write(step, {XSS_NAME: np.full(3, 0.5), "dense/bias": np.full(3, 0.1)})
    _write_diverged_run(str(root / DIVERGED))
    _write_many_epochs_run(str(root / MANY_EPOCHS))
    _write_many_alerts_run(str(root / MANY_ALERTS))
    _write_loss_spike_run(str(root / LOSS_SPIKE))
    _write_loss_spike_run(str(root / GROWING), steps=range(GROWING_STEPS), seed=4)
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
    groups = tab.page.locator("[data-testid=alert-group]")
    assert groups.count() > 0
    assert "dense_00" in groups.first.inner_text() and "vanishing" in groups.first.inner_text().lower()
    box = tab.canvas_box()
    tab.page.mouse.move(*_cell_point(tab, 0, 0))  # step 1: every statistic (the default cadence)
    tooltip = tab.page.locator(".tooltip")
    tooltip.wait_for(state="visible")
    assert "dense_00/kernel" in tooltip.inner_text()
    assert "vanishing" in tooltip.inner_text()
    tab.page.wait_for_function("document.querySelector('.tip-extra').textContent.includes('zero fraction')")
    assert "norm " in tooltip.inner_text() and "NaN 0" in tooltip.inner_text()
    # Step 2: the norms only; the tooltip says so and when the rest are logged.
    tab.page.mouse.move(*_cell_point(tab, 0, 1))
    tab.page.wait_for_function(
        "document.querySelector('.tip-extra').textContent.includes('only the norms')")
    extra = tab.page.locator(".tip-extra").inner_text()
    assert "every statistic once every 10 logged steps" in extra and "zero fraction" not in extra
    assert "norm " in extra and "NaN 0" in extra
    tab.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + 2)
    details = tab.page.locator(".details")
    details.wait_for(state="visible")
    assert "dense_00/kernel" in details.inner_text()
    assert "nan_count" in details.inner_text()
    chart = tab.pixels("[data-testid=series-chart]")
    assert (chart[..., 3] > 0).sum() > 500, "the series chart is drawn"
    assert "|g| distribution" in details.inner_text() or "histogram" not in details.inner_text()
    tab.page.screenshot(path=str(artifacts / "vanishing.png"), full_page=True)
    # New data under a resting pointer (TensorBoard's reload, a view picked from the keyboard or
    # the URL): the tooltip of a cell that is no longer drawn goes.
    tab.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 2)
    tooltip.wait_for(state="visible")
    tab.page.evaluate(f"location.hash = '#run={VANISHING}&tag=gradients&axis=epoch'")
    tab.page.wait_for_function("document.querySelector('.axis-title').textContent.startsWith('epoch')")
    tooltip.wait_for(state="hidden")
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
    # Each group of alerts is edged in its severity's colour, and so is each alert once its group
    # is open; the callout is in the NaN alerts' one.
    groups = get_json(f"{server}/data/plugin/gradients/alerts?run=nan_keras/train&tag=gradients")["groups"]
    edge = "(buttons) => buttons.map((b) => getComputedStyle(b).borderLeftColor)"
    edges = page.locator("[data-testid=alert-group] .alert-button").evaluate_all(edge)
    assert edges == [_css_rgb(SEVERITY_COLORS[group["severity"]]) for group in groups]
    open_every_finding(tab)
    edges = page.locator("[data-testid=alert]").evaluate_all(edge)
    assert edges == [_css_rgb(SEVERITY_COLORS[alerts[i]["severity"]])
                     for group in groups for i in group["alerts"]]
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


def _entry_points_shown(tab):
    """The empty state's list of entry points: [(framework, entry point)]."""
    return [tuple(text.split(": ", 1)) for text in
            tab.page.locator("[data-testid=entry-points] li").all_inner_texts()]


def test_an_empty_logdir_shows_what_it_holds_and_how_to_log_gradients(browser, tmp_path):
    from test_format import _write_future_format

    from tensorboard_gradients.format.inventory import ENTRY_POINTS

    _write_future_format(str(tmp_path / "future"))  # unreadable data is named, not hidden
    with TensorBoard(tmp_path) as tensorboard:
        tab = Tab(browser, tensorboard.base)
        empty = tab.page.locator("[data-testid=empty-state]")
        empty.wait_for(state="visible")
        assert "future/gradients" in empty.inner_text() and "upgrade" in empty.inner_text()
        finding = tab.page.locator("[data-testid=logdir-finding]").inner_text()
        assert finding.startswith(f"TensorBoard's logdir {tmp_path}: 1 run;"), finding
        # Each framework's own entry point: PyTorch's is its monitor, not the numpy writer.
        assert _entry_points_shown(tab) == list(ENTRY_POINTS)
        assert ("PyTorch", "tensorboard_gradients.torch.GradientMonitor") in _entry_points_shown(tab)
        assert "GradientWriter" not in empty.inner_text()
        tab.close()


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_a_mistyped_logdir_reads_as_one(browser, tmp_path, load_fast):
    missing = tmp_path / "mnsit"  # the user meant "mnist"
    with TensorBoard(missing, load_fast=load_fast) as tensorboard:
        tab = Tab(browser, tensorboard.base)
        finding = tab.page.locator("[data-testid=logdir-finding]")
        finding.wait_for(state="visible")
        assert finding.inner_text() == (
            f"TensorBoard's logdir {missing}: no such directory. Check the path given to --logdir.")
        assert len(_entry_points_shown(tab)) > 1
        tab.close()


def test_epoch_view_live_refresh_and_downloads(browser, server):
    # 2 epochs of 8 steps, asked for by epoch.
    tab = Tab(browser, server, "#run=nan_keras%2Ftrain&tag=gradients&axis=epoch")
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
    selected = tab.page.evaluate("window.gradientsApp.selected")
    assert [selected["row"], selected["column"]] == [0, 0]
    tab.close()


def test_a_focused_picker_keeps_its_focus_through_the_tabs_reload_and_any_load(browser, server):
    """The toolbar is shown again in place, never rebuilt: the picker the user is on stays the
    same element, focused (an open one stays open), through the tab's reload finding more steps,
    a view loaded from the URL (the run picker showing the new run in place) and a stat picked
    from the keyboard, so the next arrow key picks the next stat."""
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    tab.wait_drawn()
    page = tab.page
    page.locator("[data-testid=stat-picker]").focus()
    page.evaluate("window.picker = document.activeElement")
    focused = "document.activeElement === window.picker && window.picker.isConnected"
    page.evaluate("window.gradientsApp.runs[window.gradientsApp.state.run].gradients.steps = 1")
    page.evaluate("window.gradientsApp.refreshIfGrown()")  # answers once the view is loaded again
    tab.wait_drawn()
    assert page.evaluate(focused), "the tab's reload kept the focus"
    page.evaluate(f"location.hash = '#run={HEALTHY}&tag=gradients&axis=step'")
    page.wait_for_function("window.gradientsApp.matrix.run === 'healthy/train' && window.gradientsApp.drawn")
    assert page.evaluate(focused), "a load from the URL kept the focus"
    assert page.locator("[data-testid=run-picker]").input_value() == "healthy/train"
    for _ in range(2):
        before = page.evaluate("window.gradientsApp.state.stat")
        page.keyboard.press("ArrowDown")
        page.wait_for_function("(before) => window.gradientsApp.state.stat !== before", arg=before)
        tab.wait_drawn()
        assert page.evaluate("window.gradientsApp.matrix.stat") == page.evaluate("window.picker.value")
        assert page.evaluate(focused), "the user's own pick kept the focus"
    tab.close()


# Counts the page's live timers: set and not yet fired or cleared.
COUNT_TIMERS = """(() => {
    const live = new Set();
    window.liveTimers = live;
    const [set, clear, every, stop] = [setTimeout, clearTimeout, setInterval, clearInterval];
    window.setTimeout = (fn, ms, ...args) => {
        const id = set.call(window, () => { live.delete(id); fn(...args); }, ms);
        live.add(id);
        return id;
    };
    window.clearTimeout = (id) => { live.delete(id); clear.call(window, id); };
    window.setInterval = (fn, ms, ...args) => {
        const id = every.call(window, fn, ms, ...args);
        live.add(id);
        return id;
    };
    window.clearInterval = (id) => { live.delete(id); stop.call(window, id); };
})()"""


def test_the_tabs_timers_replace_each_other_and_stop_with_the_tab(browser, server):
    """Loads in a row leave one timer, the refresh (each load's wait for the loss curve replaces
    the last and ends with its answers); hovering cells keeps one pause for their key stats,
    gone when the pointer leaves; the tab torn down leaves none and follows the URL no more."""
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    page = tab.page
    page.add_init_script(COUNT_TIMERS)
    page.reload()
    tab.wait_drawn()
    page.evaluate("() => { for (let i = 0; i < 4; i++) window.gradientsApp.load(); }")
    tab.wait_drawn()
    assert page.evaluate("window.liveTimers.size") == 1
    for column in range(0, 10, 2):
        page.mouse.move(*_cell_point(tab, 0, column))
        assert page.evaluate("window.liveTimers.size") <= 2
    page.mouse.move(0, 0)
    assert page.evaluate("window.liveTimers.size") == 1
    page.evaluate("window.gradientsApp.stop()")
    assert page.evaluate("window.liveTimers.size") == 0
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    page.evaluate(f"location.hash = '#run={HEALTHY}&tag=gradients'")
    page.wait_for_timeout(500)
    assert requests == [] and page.evaluate("window.gradientsApp.matrix.run") == DIVERGED
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
        assert background == DARK_BACKGROUND
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


def test_a_run_that_logged_only_the_required_stats_opens_and_says_what_was_not_logged(
        browser, tmp_path):
    """A writer's ``stats=`` left most gradient stats out: the picker offers only those logged
    (a hash asking for another opens on the norm), the heatmap draws, the hover leaves them out
    and the details say "not logged", never undefined or NaN."""
    from test_reduced_stats_reading import EXPLODE_STEP, NOT_LOGGED, REDUCED, STEPS, write_run

    write_run(tmp_path / "reduced")
    with TensorBoard(tmp_path) as tensorboard:
        tensorboard.wait_for_steps({"reduced": STEPS})
        tab = Tab(browser, tensorboard.base, "#run=reduced&tag=gradients&stat=zero_fraction&axis=step")
        tab.wait_drawn()
        assert tab.page.evaluate("window.gradientsApp.matrix.stat") == "l2_norm"
        assert len(np.unique(tab.pixels().reshape(-1, 4), axis=0)) > 2, "the heatmap is drawn"
        offered = tab.page.locator("[data-testid=stat-picker] option").evaluate_all(
            "options => options.map(o => o.value)")
        assert offered == [stat for stat in REDUCED if stat != "size"]
        # A healthy cell, then an exploding one: hover, pause for the key stats, click.
        for row, column in ((1, 0), (3, EXPLODE_STEP)):
            tab.page.mouse.move(*_cell_point(tab, row, column))
            extra = tab.page.locator(".tip-extra")
            tab.page.wait_for_function(
                "document.querySelector('.tip-extra')?.textContent.includes('max |g|')")
            text = tab.page.locator(".tooltip").inner_text()
            assert "undefined" not in text and "null" not in text, text
            assert "zero fraction" not in extra.inner_text()
            assert "NaN" not in text.replace("NaN 0", ""), text  # the count's word, no NaN value
            tab.page.mouse.click(*_cell_point(tab, row, column))
            tab.page.wait_for_function(
                f"document.querySelector('.details-subtitle')?.textContent.includes('step {column} ')")
            table = dict(tab.page.locator(".stats-table tr").evaluate_all(
                "rows => rows.map(r => [r.firstChild.textContent, r.lastChild.textContent])"))
            assert list(table) == [*REDUCED, *NOT_LOGGED]
            assert all(table[stat] == "not logged" for stat in NOT_LOGGED), table
            assert not any(text in ("undefined", "NaN", "null", "") for text in table.values()), table
        assert "not logged for this tag" in tab.page.locator(
            "label:has([data-testid=stat-picker])").get_attribute("title")
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


def _cell_point(tab, row, column):
    """The page point at the centre of heatmap cell (row, column)."""
    rows, columns = tab.page.evaluate(
        "[window.gradientsApp.matrix.rows, window.gradientsApp.matrix.columns]")
    box = tab.canvas_box()
    return (box["x"] + box["width"] * (column + 0.5) / columns,
            box["y"] + box["height"] * (row + 0.5) / rows)


def _class_label(name):
    return CLASS_STYLES[name]["label"]


def test_switching_runs_clears_the_previous_runs_details(browser, server):
    """The details belong to a cell of one run: after a switch they are gone (the same row or
    step of another run is another variable or another point of training), and a late answer
    for the old cell does not bring them back."""
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    tab.wait_drawn()
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    tab.page.mouse.click(*_cell_point(tab, 0, steps.index(NONFINITE_STEP - 1)))
    details = tab.page.locator(".details-subtitle")
    details.wait_for(state="visible")
    assert f"step {NONFINITE_STEP - 1} · {_class_label('exploding')}" in details.inner_text()
    tab.page.locator("[data-testid=run-picker]").select_option("healthy/train")
    tab.page.wait_for_function("window.gradientsApp.matrix.run === 'healthy/train'")
    tab.wait_drawn()
    tab.page.wait_for_timeout(500)  # any answer still coming for the old cell
    assert tab.page.locator(".details").is_hidden()
    assert tab.page.evaluate("window.gradientsApp.selected") is None
    tab.close()


def test_an_epoch_cell_opens_the_details_of_its_worst_step(browser, server):
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=epoch")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") == [0, 1]
    pixels = tab.pixels()
    assert has_color(pixels[:, pixels.shape[1] // 2:], NONFINITE_RGB), "epoch 1 is drawn NaN/Inf"
    tab.page.mouse.click(*_cell_point(tab, 0, 1))
    details = tab.page.locator(".details-subtitle")
    details.wait_for(state="visible")
    text = details.inner_text()
    assert "epoch 1 · steps 21–40" in text, text
    assert f"step {NONFINITE_STEP} · {_class_label('nonfinite')}" in text, text
    # The healthy epoch: its own range, its worst (ok) step.
    tab.page.mouse.click(*_cell_point(tab, 0, 0))
    tab.page.wait_for_function(
        "document.querySelector('.details-subtitle').textContent.includes('epoch 0')")
    assert "steps 1–20" in details.inner_text()
    tab.close()


def test_a_nan_cell_says_nan_in_its_tooltip_and_details(browser, server):
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    tab.wait_drawn()
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    point = _cell_point(tab, 0, steps.index(NONFINITE_STEP + 2))
    tab.page.mouse.move(*point)
    tooltip = tab.page.locator(".tooltip")
    tooltip.wait_for(state="visible")
    nonfinite = _class_label("nonfinite")
    assert f"l2_norm: {nonfinite}" in tooltip.inner_text()
    assert "l2_norm: 0" not in tooltip.inner_text()
    tab.page.wait_for_function(
        "document.querySelector('.tip-extra').textContent.includes('zero fraction')")
    assert f"norm {nonfinite}" in tooltip.inner_text() and "NaN 16" in tooltip.inner_text()
    tab.page.mouse.click(*point)
    table = tab.page.locator(".stats-table")
    table.wait_for(state="visible")
    row = ("(name) => [...document.querySelectorAll('.stats-table tr')]"
           ".find((r) => r.firstChild.textContent === name).lastChild.textContent")
    assert tab.page.evaluate(row, "l2_norm") == nonfinite
    assert tab.page.evaluate(row, "nan_count") == "16"
    tab.close()


def test_the_default_axis_shows_when_the_run_went_wrong(browser, server):
    """Two epochs would hide the onset (steps 25-29 exploding, NaN from 30) in one column: such a
    run opens on its steps; a run of many short epochs opens on them; the toggle and a hash that
    asks for an axis win."""
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") is None
    assert tab.page.evaluate("window.gradientsApp.matrix.columns") == 40
    tab.page.get_by_role("button", name="Epochs", exact=True).click()
    tab.page.wait_for_function("location.hash.includes('axis=epoch')")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") == [0, 1]
    tab.page.reload()
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") == [0, 1]
    tab.page.evaluate(f"location.hash = '#run={MANY_EPOCHS}&tag=gradients'")
    tab.page.wait_for_function(f"window.gradientsApp.matrix.run === '{MANY_EPOCHS}'")
    tab.wait_drawn()
    epochs = tab.page.evaluate("window.gradientsApp.matrix.epochIndex")
    assert epochs == list(range(MANY_EPOCHS_COUNT))
    tab.close()


def test_axis_labels_never_overlap_and_the_axes_have_titles(browser, server):
    tab = Tab(browser, server, f"#run={MANY_EPOCHS}&tag=gradients&axis=epoch",
              viewport=(1100, 800))
    tab.wait_drawn()
    # The widest label an epoch can have, whichever way it is written.
    widest = tab.page.evaluate(
        """() => { const axis = document.querySelector('canvas.axis');
                   const c = axis.getContext('2d');
                   c.font = `11px ${getComputedStyle(axis).fontFamily}`;
                   const texts = window.gradientsApp.matrix.epochIndex
                     .flatMap((e) => [String(e), `epoch ${e}`]);
                   return Math.max(...texts.map((text) => c.measureText(text).width)); }""")
    ratio = tab.page.evaluate("window.devicePixelRatio")
    axis = tab.pixels("canvas.axis")
    labels = ink_runs(axis[int(6 * ratio):], max_gap=int(4 * ratio))  # under the tick marks
    for first, last in labels:
        assert last - first + 1 <= (widest + 1) * ratio, f"labels run into each other: {labels}"
    assert len(labels) >= 5, labels
    drawn = tab.page.evaluate("window.gradientsApp.view.axes.drawnLabels")
    assert all(b["left"] >= a["right"] for a, b in zip(drawn, drawn[1:]))
    assert tab.page.locator("[data-testid=axis-title]").inner_text().startswith("epoch")
    # The step axis too, at its narrowest.
    tab.page.get_by_role("button", name="Steps", exact=True).click()
    tab.page.wait_for_function("location.hash.includes('axis=step')")
    tab.wait_drawn()
    assert tab.page.locator("[data-testid=axis-title]").inner_text() == "step"
    drawn = tab.page.evaluate("window.gradientsApp.view.axes.drawnLabels")
    assert len(drawn) >= 3 and all(b["left"] >= a["right"] for a, b in zip(drawn, drawn[1:]))
    tab.close()


def test_a_diverging_loss_is_drawn_on_a_log_scale_beside_its_range(browser, server):
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    tab.wait_drawn()
    loss = tab.page.locator("[data-testid=loss-curve]")
    loss.wait_for(state="visible")
    # On a log scale the climb before the NaN shows: at step 27 the curve is half-way up (on a
    # linear one every step but the last lies on the floor).
    pixels = tab.pixels("[data-testid=loss-curve]")
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    x = int(pixels.shape[1] * (steps.index(27) + 0.5) / len(steps))
    inked = np.flatnonzero(pixels[:, x, 3] > 0) / pixels.shape[0]
    assert inked.size and 0.25 < inked.mean() < 0.75, inked
    assert "(log scale)" in tab.page.locator(".loss-label").inner_text()
    assert tab.page.locator("[data-testid=loss-min]").inner_text() == "2.1"
    # Its range beside the curve, never over it.
    curve = loss.bounding_box()
    for name in ("loss-max", "loss-min"):
        assert not boxes_overlap(tab.page.locator(f"[data-testid={name}]").bounding_box(), curve)
    tab.close()


def _tab_with_scalars_held(browser, server):
    """The diverged run's tab, with every request to the Scalars plugin (the loss curve's) held
    in the returned list until the test lets it through (``route.continue_()``)."""
    held = []

    def hold(route):
        held.append(route)

    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step",
              routes=[("**/data/plugin/scalars/**", hold)])
    return tab, held


def test_the_cells_stay_put_when_a_slow_loss_curve_arrives(browser, server):
    """The loss curve sits above the cells. Drawn when the Scalars plugin answered, after the
    heatmap, it pushed the cells down under a pointer already on them (a hover at a cell measured
    at the first draw fell on the curve and showed no tooltip). With the Scalars answers held back
    a second, the cells are where they first appeared once the curve is there."""
    tab, held = _tab_with_scalars_held(browser, server)
    # Every frame from now on, the top of the cells as the page shows them while drawn.
    tab.page.evaluate("""() => {
        window.cellTops = new Set();
        const record = () => {
            const app = window.gradientsApp;
            const cells = document.querySelector('[data-testid=heatmap-canvas]');
            if (app && app.drawn && cells) window.cellTops.add(cells.getBoundingClientRect().top);
            requestAnimationFrame(record);
        };
        record();
    }""")
    released = 0
    for _ in range(200):  # tags, then the loss's points: each held, then let through
        tab.page.wait_for_timeout(1000 if not released else 50)
        for route in held[released:]:
            route.continue_()
        released = len(held)
        if tab.page.locator("[data-testid=loss-curve]").is_visible():
            break
    assert released == 2, released
    tab.wait_drawn()
    assert tab.page.evaluate("[...window.cellTops]") == [tab.canvas_box()["y"]]
    tab.close()


def test_a_scalars_plugin_that_does_not_answer_holds_nothing_back(browser, server):
    """The heatmap waits a few seconds for its loss curve, not for ever: with the Scalars answers
    held, the cells are drawn without a curve; the curve comes when the answers do."""
    tab, held = _tab_with_scalars_held(browser, server)
    tab.wait_drawn()
    loss = tab.page.locator("[data-testid=loss-curve]")
    assert len(held) == 1 and loss.is_hidden()  # the tags asked, never answered
    held[0].continue_()
    for _ in range(100):  # then the loss's points are asked
        if len(held) == 2:
            break
        tab.page.wait_for_timeout(50)
    held[1].continue_()
    loss.wait_for(state="visible")
    assert (tab.pixels("[data-testid=loss-curve]")[..., 3] > 0).sum() > 100
    tab.close()


def test_the_legend_explains_the_row_dots(browser, server):
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients")
    tab.wait_drawn()
    legend = tab.page.locator("[data-testid=legend-dots]")
    assert "alert" in legend.inner_text()
    dots = legend.locator(".legend-item").evaluate_all(
        "(items) => items.map((i) => [i.textContent,"
        " getComputedStyle(i.querySelector('.dot')).backgroundColor])")
    assert dots == [[name, _css_rgb(color)] for name, color in SEVERITY_COLORS.items()]
    tab.close()


def test_the_tab_opens_on_the_most_severe_run_unless_the_user_picked_another(browser, server):
    severities = list(SEVERITY_COLORS)  # most urgent first, as the plugin's vocabulary
    runs = get_json(f"{server}/data/plugin/gradients/runs")

    def severity(run):
        url = f"{server}/data/plugin/gradients/alerts?run={run}&tag=gradients"
        alerts = get_json(url)["alerts"]
        return (min((severities.index(a["severity"]) for a in alerts), default=len(severities)),
                -len(alerts), natural_key(run))

    expected = min(runs, key=severity)
    tab = Tab(browser, server)
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.state.run") == expected
    options = tab.page.locator("[data-testid=run-picker] option").evaluate_all(
        "(options) => options.map((option) => option.value)")
    assert options == sorted(runs, key=natural_key)
    assert options.index(DIVERGED) < options.index(MANY_EPOCHS)
    # A run's path reads as a path: the run first, then the runs whose names it begins (the
    # demo's Run menu listed exploding_clipped/train before exploding/train).
    assert options.index("vanishing/train") == options.index("vanishing_fixed/train") - 1
    # The user's pick outlasts the frame (TensorBoard reloads it without its hash)...
    tab.page.locator("[data-testid=run-picker]").select_option("healthy/train")
    tab.page.wait_for_function("location.hash.includes('run=healthy')")
    tab.page.goto("about:blank")
    tab.page.goto(f"{server}/data/plugin_entry.html?name=gradients")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.state.run") == "healthy/train"
    # ...and a link's run wins over it.
    tab.page.goto("about:blank")
    tab.page.goto(f"{server}/data/plugin_entry.html?name=gradients#run=xss")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.state.run") == "xss"
    tab.close()


def test_the_details_open_beside_the_heatmap_without_scrolling_it_away(browser, server):
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step", viewport=(1100, 700))
    tab.wait_drawn()
    tab.page.mouse.click(*_cell_point(tab, 0, 30))
    details = tab.page.locator(".details")
    tab.page.locator("[data-testid=series-chart]").wait_for(state="visible")
    tab.page.wait_for_timeout(300)  # any scrolling would be done
    assert tab.page.evaluate("window.scrollY") == 0
    cells = tab.canvas_box()
    box = details.bounding_box()
    assert box["x"] >= cells["x"] + cells["width"], "side by side"
    assert 0 <= box["y"] < 700 / 2, "the details start in the upper half of the window"
    assert cells["y"] >= 0 and cells["y"] + cells["height"] <= 700, "the heatmap stays in view"
    tab.close()


def _alerts_answer(server, run):
    return get_json(f"{server}/data/plugin/gradients/alerts?run={run}&tag=gradients")


def _outlined_rows(tab):
    """The heatmap rows outlined on the overlay (a clicked alert's or group's cells): those with
    ink across their middle (an outline's sides cross it; nothing else is drawn there while the
    pointer is off the heatmap and no cell is selected)."""
    overlay = tab.pixels("canvas.overlay")
    rows = tab.page.evaluate("window.gradientsApp.matrix.rows")
    height = overlay.shape[0]
    return [row for row in range(rows) if overlay[int(height * (row + 0.5) / rows), :, 3].any()]


def _rows_of_layers(tab, layers):
    """The heatmap rows (of the matrix shown) of the variables, or layers, of ``layers``."""
    shown = tab.page.evaluate("window.gradientsApp.matrix.layers")
    return [row for row, layer in enumerate(shown) if layer in layers]


def _step_range(first, last):
    return f"step {first}" if first == last else f"steps {first}\u2013{last}"


def test_alerts_read_as_findings_that_open_to_their_alerts_and_outline_their_cells(browser, server):
    """The demo's vanishing run: a finding per rule and stretch of steps, most urgent first;
    opening one lists its alerts (built only then), clicking it outlines every cell of its
    alerts (a whole-layer alert: every variable of the layer), clicking an alert its own."""
    answer = _alerts_answer(server, "vanishing/train")
    groups, alerts = answer["groups"], answer["alerts"]
    assert len(groups) < len(alerts), "the demo's vanishing run has findings of several alerts"
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step")
    tab.wait_drawn()
    tab.wait_alerts()
    shown = tab.page.locator("[data-testid=alert-group]")
    assert shown.count() == len(groups)
    for item, group in zip(shown.all(), groups):
        text = item.inner_text().lower()
        assert group["message"].lower() in text
        steps = _step_range(group["first_step"], group["last_step"])
        assert f"{group['severity']} · {group['kind']} · {steps}" in text
    # A finding of one alert is that alert; the others' alerts are built when they are opened.
    assert tab.page.locator("[data-testid=alert]").count() == sum(len(g["alerts"]) == 1 for g in groups)
    assert f"in {len(groups)} findings" in tab.page.locator(".alerts h2").inner_text()
    index, group = max(((i, g) for i, g in enumerate(groups) if g["unit"] == "layer"),
                       key=lambda pair: pair[1]["subjects"])
    members = [alerts[i] for i in group["alerts"]]
    assert len(members) > 1
    opened = tab.open_finding(index)
    texts = opened.all_inner_texts()
    assert len(texts) == len(members) and all(a["message"] in t for a, t in zip(members, texts))
    layers = {a["layer"] for a in members}
    assert _outlined_rows(tab) == _rows_of_layers(tab, layers)
    assert len(_outlined_rows(tab)) == 2 * len(layers), "a whole layer: its kernel and its bias"
    opened.first.click()
    assert _outlined_rows(tab) == _rows_of_layers(tab, {members[0]["layer"]})
    tab.close()


def test_a_thousand_alerts_are_one_finding_opened_on_demand(browser, server):
    """1,000 NaN alerts: one finding under the first-NaN call-out; its alerts are built when it
    opens, and clicking it outlines all 1,000 rows at the NaN step."""
    answer = _alerts_answer(server, MANY_ALERTS)
    assert len(answer["alerts"]) >= MANY_ALERTS_VARIABLES
    tab = Tab(browser, server, f"#run={MANY_ALERTS}&tag=gradients&axis=step")
    tab.wait_drawn()
    tab.wait_alerts()
    assert f"step {MANY_ALERTS_NAN_STEP}" in tab.page.locator("[data-testid=first-nonfinite]").inner_text()
    shown = tab.page.locator("[data-testid=alert-group]")
    assert shown.count() == len(answer["groups"])
    assert tab.page.locator(".alerts button, .alerts summary").count() == len(answer["groups"])
    findings = "1 finding" if len(answer["groups"]) == 1 else f"{len(answer['groups'])} findings"
    assert tab.page.locator(".alerts h2").inner_text() == f"Alerts ({len(answer['alerts']):,}, in {findings})"
    nonfinite = [i for i, g in enumerate(answer["groups"]) if g["kind"] == "nonfinite"]
    assert answer["groups"][nonfinite[0]]["subjects"] == MANY_ALERTS_VARIABLES
    assert tab.open_finding(nonfinite[0]).count() == MANY_ALERTS_VARIABLES
    spans = tab.page.evaluate("window.gradientsApp.view.highlight")
    assert sorted(row for span in spans for row in span["rows"]) == list(range(MANY_ALERTS_VARIABLES))
    assert {(span["firstStep"], span["lastStep"]) for span in spans} == {(MANY_ALERTS_NAN_STEP,) * 2}
    tab.close()


def test_rows_by_layer_combine_each_layers_variables_and_alerts_follow(browser, server):
    """The Layers switch: one row per layer (the vanishing demo's input-side layers hatched), its
    tooltip and details those of the whole layer, the row dots and a clicked finding on layer
    rows; kept in the hash through a reload, and switched back."""
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step")
    tab.wait_drawn()
    layers = list(dict.fromkeys(tab.page.evaluate("window.gradientsApp.matrix.layers")))
    ratio = tab.page.evaluate("window.devicePixelRatio")

    def label_count():
        """Lines of text right of the row dots (an underscore under a name is no line)."""
        labels = tab.pixels("canvas.labels")[:, int(14 * ratio):]
        lines = ink_runs(labels.transpose(1, 0, 2), max_gap=0)
        return sum(last - first + 1 >= 5 * ratio for first, last in lines)

    assert label_count() == 2 * len(layers)  # a kernel and a bias each
    requests = []
    tab.page.on("request", lambda request: requests.append(request.url))
    tab.page.get_by_role("button", name="Layers", exact=True).click()
    tab.page.wait_for_function("location.hash.includes('rows=layers')")
    tab.page.wait_for_function("window.gradientsApp.matrix.rowsBy === 'layers' && window.gradientsApp.drawn")
    assert tab.page.evaluate("window.gradientsApp.matrix.variables") == layers
    assert label_count() == len(layers)
    pixels = tab.pixels()
    assert has_color(row_band(pixels, 0, 0, len(layers)), VANISHING_HATCH_RGB)  # dense_00
    assert not has_color(row_band(pixels, len(layers) - 2, len(layers) - 1, len(layers)), VANISHING_HATCH_RGB)
    # The dots: one per layer with alerts, whether they name the layer or one of its variables.
    answer = _alerts_answer(server, "vanishing/train")
    dotted = sorted(row for row, _ in tab.page.evaluate("[...window.gradientsApp.view.rowSeverity]"))
    assert dotted == sorted({layers.index(a["layer"]) for a in answer["alerts"] if a["layer"]})
    # A finding about variables outlines their layers' rows (before a cell is selected: its
    # crosshair crosses every row).
    index, group = max(enumerate(answer["groups"]), key=lambda pair: pair[1]["subjects"])
    tab.page.locator("[data-testid=alert-group]").nth(index).click()
    members = [answer["alerts"][i] for i in group["alerts"]]
    assert _outlined_rows(tab) == sorted({layers.index(a["layer"]) for a in members})
    # The tooltip and the details: the layer's, from its combined series and histogram.
    tab.page.mouse.move(*_cell_point(tab, 0, 0))  # step 1: every statistic
    tooltip = tab.page.locator(".tooltip")
    tooltip.wait_for(state="visible")
    tab.page.wait_for_function("document.querySelector('.tip-extra').textContent.includes('zero fraction')")
    assert tooltip.inner_text().startswith(f"{layers[0]}\nlayer · its variables as one tensor")
    tab.page.mouse.click(*_cell_point(tab, 0, 3))
    tab.page.locator("[data-testid=series-chart]").wait_for(state="visible")
    assert tab.page.locator(".details-title").inner_text() == layers[0]
    assert "its variables as one tensor" in tab.page.locator(".details-subtitle").inner_text()
    asked = [url.split("/gradients/")[1] for url in requests if "/data/plugin/gradients/" in url]
    assert any(url.startswith("series?") and "rows=layers" in url and "variable_index=0" in url
               for url in asked)
    if tab.page.evaluate("window.gradientsApp.info().histograms"):
        tab.page.locator(".histogram").wait_for(state="visible")
        assert any(url.startswith("histogram?") and "rows=layers" in url for url in asked)
    # The hash keeps the view; Variables brings the variables back.
    tab.page.reload()
    tab.wait_drawn()
    assert tab.page.evaluate("[window.gradientsApp.matrix.rowsBy, window.gradientsApp.matrix.rows]") == [
        "layers", len(layers)]
    assert tab.page.get_by_role("button", name="Layers", exact=True).get_attribute("aria-pressed") == "true"
    tab.page.get_by_role("button", name="Variables", exact=True).click()
    tab.page.wait_for_function("!location.hash.includes('rows=')")
    tab.page.wait_for_function(
        "window.gradientsApp.matrix.rowsBy === 'variables' && window.gradientsApp.drawn")
    assert tab.page.evaluate("window.gradientsApp.matrix.rows") == 2 * len(layers)
    tab.close()


# Comparing runs: the demo's vanishing net (12 sigmoid layers + logits) against its healthy one
# (10 ReLU layers + logits): the same names up to dense_09, then dense_10 and dense_11 only in
# vanishing (rows 20-23 of the 26 by variable, 10-11 of the 13 by layer).
COMPARE_ROWS = 26
ONLY_IN_VANISHING = (20, 23)


def _share(band, rgb_set):
    flat = [tuple(p) for p in band[..., :3].reshape(-1, 3).tolist()]
    return sum(p in rgb_set for p in flat) / max(1, len(flat))


def test_comparing_two_runs_side_by_side_and_as_a_ratio_survives_a_reload(browser, server, artifacts):
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step")
    tab.wait_drawn()
    assert tab.page.locator("[data-testid=compare-view]").is_hidden()
    tab.page.select_option("[data-testid=compare-picker]", "healthy/train")
    tab.page.wait_for_function("location.hash.includes('compare=healthy')")
    tab.wait_drawn()
    # Side by side: both runs on the union of their rows; vanishing's extra layers hatched grey
    # in healthy's heatmap, never in vanishing's.
    assert tab.page.locator("[data-testid=heatmap-canvas]").is_hidden()
    unmatched = {UNMATCHED_RGB, UNMATCHED_HATCH_RGB}
    a = tab.pixels("[data-testid=compare-a]")
    b = tab.pixels("[data-testid=compare-b]")
    assert _share(row_band(b, *ONLY_IN_VANISHING, COMPARE_ROWS), unmatched) > 0.95
    assert _share(row_band(a, *ONLY_IN_VANISHING, COMPARE_ROWS), unmatched) == 0
    assert _share(row_band(b, 0, 19, COMPARE_ROWS), unmatched) == 0
    assert has_color(row_band(a, 0, 3, COMPARE_ROWS), VANISHING_HATCH_RGB)
    assert "4 only in vanishing/train" in tab.page.locator("[data-testid=compare-unmatched]").inner_text()
    # The ratio: the input side of the vanishing net is orders of magnitude below the healthy
    # one's, so its rows are deep blue; the rows only one run has are hatched grey.
    tab.page.locator("[data-testid=compare-mode-ratio]").click()
    tab.page.wait_for_function("location.hash.includes('compare_mode=ratio')")
    tab.wait_drawn()
    ratio = tab.pixels("[data-testid=compare-ratio]")
    input_side = row_band(ratio, 0, 3, COMPARE_ROWS)[..., :3].reshape(-1, 3).astype(int)
    blue = (input_side[:, 2] - input_side[:, 0] > 60).mean()
    assert blue > 0.9, f"only {blue:.0%} of the input-side pixels are blue"
    assert (input_side[:, 0] - input_side[:, 2] > 60).mean() == 0, "and none red"
    assert _share(row_band(ratio, *ONLY_IN_VANISHING, COMPARE_ROWS), unmatched) > 0.95
    assert len(np.unique(ratio.reshape(-1, 4), axis=0)) > 10, "the ratio has real colour"
    ticks = tab.page.locator("[data-testid=compare-ticks]").inner_text()
    assert "1x" in ticks and "1/" in ticks
    # The tooltip: both values and the ratio; an unmatched row says so.
    box = tab.page.locator("[data-testid=compare-ratio]").bounding_box()
    row_y = lambda row: box["y"] + box["height"] * (row + 0.5) / COMPARE_ROWS  # noqa: E731
    tab.page.mouse.move(box["x"] + box["width"] / 2, row_y(0))
    tooltip = tab.page.locator("[data-testid=compare-tooltip]")
    tooltip.wait_for(state="visible")
    text = tooltip.inner_text()
    assert "dense_00/kernel" in text and "l2_norm in vanishing/train" in text and "l2_norm in healthy/train" in text
    assert "ratio vanishing/train / healthy/train: 1/" in text
    tab.page.mouse.move(box["x"] + box["width"] / 2, row_y(21))
    tab.page.wait_for_function(
        "document.querySelector('[data-testid=compare-tooltip]').textContent.includes('only in vanishing/train')")
    tab.page.screenshot(path=str(artifacts / "compare_ratio.png"), full_page=True)
    # A reload keeps the comparison (it is in the hash).
    tab.page.reload()
    tab.wait_drawn()
    assert tab.page.locator("[data-testid=compare-picker]").input_value() == "healthy/train"
    assert tab.page.locator("[data-testid=compare-mode-ratio]").get_attribute("aria-pressed") == "true"
    ratio = tab.pixels("[data-testid=compare-ratio]")
    input_side = row_band(ratio, 0, 3, COMPARE_ROWS)[..., :3].reshape(-1, 3).astype(int)
    assert (input_side[:, 2] - input_side[:, 0] > 60).mean() > 0.9
    # By layer and by epoch: rows match by layer name, columns by epoch index.
    tab.page.get_by_role("button", name="Layers", exact=True).click()
    tab.wait_drawn()
    comparison = tab.page.evaluate(
        "(({rows, columnCount, matchedColumns}) => ({statuses: rows.map((r) => r.status), columnCount, matchedColumns}))"
        "(window.gradientsApp.comparison)")
    assert comparison["statuses"] == ["both"] * 10 + ["a", "a", "both"]
    tab.page.get_by_role("button", name="Epochs").click()
    tab.wait_drawn()
    comparison = tab.page.evaluate(
        "(({columnCount, matchedColumns, epochIndex}) => ({columnCount, matchedColumns, epochIndex}))"
        "(window.gradientsApp.comparison)")
    assert comparison["epochIndex"] is not None and comparison["columnCount"] >= 2
    assert comparison["matchedColumns"] == comparison["columnCount"]
    ratio = tab.pixels("[data-testid=compare-ratio]")
    input_side = row_band(ratio, 0, 1, 13)[..., :3].reshape(-1, 3).astype(int)
    assert (input_side[:, 2] - input_side[:, 0] > 60).mean() > 0.9
    # None again: the heatmap of the run alone.
    tab.page.select_option("[data-testid=compare-picker]", "")
    tab.page.wait_for_function("!location.hash.includes('compare=')")
    tab.wait_drawn()
    assert tab.page.locator("[data-testid=heatmap-canvas]").is_visible()
    assert tab.page.locator("[data-testid=compare-view]").is_hidden()
    tab.close()


def test_the_legend_explains_the_dashed_epoch_lines_while_they_are_drawn(browser, server):
    """The diverged run's second epoch starts at step 21: a dashed line there on the step axis,
    explained in the legend; none on the epoch axis (each column is an epoch), nor on a run
    without epoch marks."""
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    tab.wait_drawn()
    epochs = tab.page.locator("[data-testid=legend-epochs]")
    assert epochs.is_visible() and "epoch starts" in epochs.inner_text()
    pixels = tab.pixels()
    steps = tab.page.evaluate("window.gradientsApp.matrix.steps")
    x = round(pixels.shape[1] * steps.index(21) / len(steps))
    line = pixels[:, x - 1: x + 2, :3].astype(int)
    assert (line.min(axis=-1) > 150).any(axis=1).mean() > 0.3, "a light dashed line where epoch 1 starts"
    tab.page.get_by_role("button", name="Epochs", exact=True).click()
    tab.page.wait_for_function("location.hash.includes('axis=epoch')")
    tab.wait_drawn()
    assert epochs.count() == 0
    tab.page.evaluate("location.hash = '#run=xss&tag=gradients'")
    tab.page.wait_for_function("window.gradientsApp.matrix.run === 'xss'")
    tab.wait_drawn()
    assert epochs.count() == 0
    tab.close()


def _loss_points(tab):
    """The loss curve's points as drawn: [{x, value}] (axes.drawnLoss)."""
    tab.page.locator("[data-testid=loss-curve]").wait_for(state="visible")
    tab.page.wait_for_function("window.gradientsApp.view.axes.drawnLoss.length > 0")
    return tab.page.evaluate("window.gradientsApp.view.axes.drawnLoss")


def test_the_epochs_view_draws_each_epochs_mean_loss_over_its_column(browser, server):
    """A run of 120 epochs opens on epochs, its loss curve above them (it used to be hidden
    there): one point per epoch, at its column's centre; the diverged run's two epochs show the
    mean of each epoch's logged losses."""
    tab = Tab(browser, server, f"#run={MANY_EPOCHS}&tag=gradients")
    tab.wait_drawn()
    assert tab.page.evaluate("window.gradientsApp.matrix.epochIndex") == list(range(MANY_EPOCHS_COUNT))
    points = _loss_points(tab)
    assert "mean per epoch" in tab.page.locator("[data-testid=loss-name]").inner_text()
    width = tab.canvas_box()["width"]
    assert [p["x"] for p in points] == pytest.approx(
        [width * (c + 0.5) / MANY_EPOCHS_COUNT for c in range(MANY_EPOCHS_COUNT)], abs=0.5)
    assert [p["value"] for p in points] == pytest.approx(
        [_many_epochs_loss(step) for step in range(MANY_EPOCHS_COUNT)], rel=1e-6)
    assert (tab.pixels("[data-testid=loss-curve]")[..., 3] > 0).sum() > 200
    tab.page.evaluate(f"location.hash = '#run={DIVERGED}&tag=gradients&axis=epoch'")
    tab.page.wait_for_function(f"window.gradientsApp.matrix.run === '{DIVERGED}'")
    tab.wait_drawn()
    tab.page.wait_for_function("window.gradientsApp.view.axes.drawnLoss.length === 2")
    means = [p["value"] for p in _loss_points(tab)]
    logged = lambda first, last: [_diverged_loss(s) for s in range(first, min(last, NONFINITE_STEP - 1) + 1)]  # noqa: E731
    assert means == pytest.approx([np.mean(logged(1, 20)), np.mean(logged(21, 40))], rel=1e-5)
    tab.close()


def test_an_opened_finding_lists_its_alerts_in_the_space_below_it(browser, server):
    """The demo's vanishing run at 1,400 x 900: its largest finding about layers opened shows
    every one of its alerts (they fit the window; a 40%-of-the-window cap showed 4 of 5)."""
    answer = _alerts_answer(server, "vanishing/train")
    index, group = max(((i, g) for i, g in enumerate(answer["groups"]) if g["unit"] == "layer"),
                       key=lambda pair: pair[1]["subjects"])
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step", viewport=(1400, 900))
    tab.wait_drawn()
    tab.wait_alerts()
    members = tab.open_finding(index)
    assert members.count() == len(group["alerts"]) > 1
    side = tab.page.locator(".side").bounding_box()
    assert side["y"] + side["height"] <= 900
    for box in [members.nth(i).bounding_box() for i in range(members.count())]:
        assert box["y"] + box["height"] <= side["y"] + side["height"] + 0.5, "shown, not scrolled away"
    tab.close()


def _side_width(window):
    """The side column's width beside the heatmap (style.css: clamp(320px, 24vw, 400px)) and
    its gap, from 1,100 px; none on a narrower window (the details go under the heatmap)."""
    return min(400, max(320, 0.24 * window)) + 16 if window >= 1100 else 0


def test_the_heatmap_takes_the_window_less_its_fixed_panels(browser, server):
    """At 1,400 px the cells were ~620 px wide (a side column of a third of the window), narrower
    than at 1,000 px. Now they take the window less the padding, the row labels and the side
    column (a scroll bar's width spare), wider on every wider window."""
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step", viewport=(1000, 900))
    tab.wait_drawn()
    widths = {}
    for window in (1000, 1400, 1600):
        tab.page.set_viewport_size({"width": window, "height": 900})
        tab.page.wait_for_function(
            "document.querySelector('[data-testid=heatmap-canvas]').getBoundingClientRect().width"
            " === Math.floor(document.querySelector('.plot').clientWidth)")
        widths[window] = tab.canvas_box()["width"]
        assert widths[window] >= window - 32 - 240 - _side_width(window) - 16, (window, widths)
    assert widths[1000] < widths[1400] < widths[1600], widths
    tab.close()


def test_the_compare_toolbar_never_leaves_one_control_alone_on_a_line(browser, server):
    """Comparing two runs adds a run picker and a mode toggle: from 1,000 to 1,600 px wide the
    toolbar wraps whole groups of controls, never one button onto a line of its own."""
    tab = Tab(browser, server, f"#run={VANISHING}&tag=gradients&axis=step&compare=healthy%2Ftrain",
              viewport=(1000, 900))
    tab.wait_drawn()
    for window in range(1000, 1601, 50):
        tab.page.set_viewport_size({"width": window, "height": 900})
        tops = tab.page.locator(".toolbar select, .toolbar button, .toolbar a.button").evaluate_all(
            "(controls) => controls.map((c) => Math.round(c.getBoundingClientRect().top))")
        lines = {}
        for top in tops:  # a select and a button of one line differ by a pixel or two
            line = next((known for known in lines if abs(known - top) <= 4), top)
            lines[line] = lines.get(line, 0) + 1
        assert all(count > 1 for count in lines.values()), (window, lines)
    tab.close()


def _sequential_logdir(root):
    """A run as the PyTorch monitor names an nn.Sequential's parameters ("0.weight", "0.bias",
    "2.weight"...: layers "0", "2"...), its first three layers' gradients vanishing."""
    rng = np.random.default_rng(3)
    with tg.GradientWriter(str(root / "sequential")) as writer:
        for step in range(1, 31):
            writer.write(step, {f"{layer}.{part}": (1e-10 if layer < 6 else 1.0) * rng.normal(size=shape)
                                for layer in range(0, 14, 2)
                                for part, shape in (("weight", (8, 8)), ("bias", 8))})


def test_an_nn_sequentials_numbered_layers_read_as_layers(browser, tmp_path):
    _sequential_logdir(tmp_path)
    with TensorBoard(tmp_path) as tensorboard:
        tab = Tab(browser, tensorboard.base, "#run=sequential&tag=gradients&axis=step&rows=layers")
        tab.wait_drawn()
        tab.wait_alerts()
        assert tab.page.evaluate("window.gradientsApp.matrix.variables")[:2] == ["0", "2"]
        findings = tab.page.locator("[data-testid=alert-group]").all_inner_texts()
        assert any("of 7 layers" in text and text.endswith("first layer 0.") for text in findings), findings
        tab.page.mouse.move(*_cell_point(tab, 0, 3))
        tooltip = tab.page.locator(".tooltip")
        tooltip.wait_for(state="visible")
        assert tooltip.inner_text().startswith("layer 0\n")
        tab.page.mouse.click(*_cell_point(tab, 1, 3))
        tab.page.locator("[data-testid=series-chart]").wait_for(state="visible")
        assert tab.page.locator(".details-title").inner_text() == "layer 2"
        tab.close()


def _frame_of_tab(page):
    """The Gradients tab's frame in TensorBoard's page, once its heatmap is drawn."""
    page.frame_locator("iframe").locator("[data-testid=heatmap-canvas]").wait_for(state="visible", timeout=60000)
    frame = next(frame for frame in page.frames if "plugin_entry.html" in frame.url)
    frame.wait_for_function("window.gradientsApp && window.gradientsApp.drawn")
    return frame


def _pick_theme(page, name):
    """Picks ``name`` ("Browser default", "Light" or "Dark") in TensorBoard's theme menu."""
    page.get_by_label("Menu for changing light or dark theme").click()
    page.get_by_role("menuitem", name=name, exact=True).click()


def _label_ink(frame):
    """The mean brightness (0-255) of the row labels' drawn text (right of the alert dots)."""
    ratio = frame.evaluate("window.devicePixelRatio")
    labels = canvas_pixels(frame, "canvas.labels")[:, int(12 * ratio):]
    inked = labels[..., 3] > 200
    return labels[..., :3][inked].mean()


def test_the_tab_follows_tensorboards_theme(browser, server, artifacts):
    """Dark picked in TensorBoard's theme menu: the tab's page, text and canvases turn dark with
    it (the heatmap's classes still painted as they were); Light brings it back. Under "Browser
    default" a dark browser makes both dark, and Light in TensorBoard wins over the browser."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{server}/#gradients")
    frame = _frame_of_tab(page)
    frame.locator("[data-testid=run-picker]").select_option("vanishing/train")
    frame.wait_for_function("window.gradientsApp.matrix.run === 'vanishing/train' && window.gradientsApp.drawn")
    body = "getComputedStyle(document.body).{}"
    assert frame.evaluate(body.format("backgroundColor")) == "rgb(255, 255, 255)"
    assert _label_ink(frame) < 100, "dark text on white"
    cells = canvas_pixels(frame, "[data-testid=heatmap-canvas]")
    _pick_theme(page, "Dark")
    frame.wait_for_function(f"getComputedStyle(document.body).backgroundColor === '{DARK_BACKGROUND}'")
    text = [int(channel) for channel in frame.evaluate(body.format("color"))[4:-1].split(",")]
    assert min(text) > 200, f"light text: {text}"
    assert _label_ink(frame) > 180, "the row labels redrawn in light text"
    dark_cells = canvas_pixels(frame, "[data-testid=heatmap-canvas]")
    assert has_color(dark_cells, VANISHING_HATCH_RGB) and np.array_equal(dark_cells, cells)
    page.screenshot(path=str(artifacts / "tab_in_tensorboards_dark_theme.png"))
    _pick_theme(page, "Light")
    frame.wait_for_function("getComputedStyle(document.body).backgroundColor === 'rgb(255, 255, 255)'")
    assert _label_ink(frame) < 100
    assert errors == []
    page.close()
    # A dark browser: TensorBoard's "Browser default" is dark, and so is the tab; Light wins.
    page = browser.new_page(viewport={"width": 1400, "height": 900}, color_scheme="dark")
    page.goto(f"{server}/#gradients")
    frame = _frame_of_tab(page)
    _pick_theme(page, "Browser default")
    frame.wait_for_function(f"getComputedStyle(document.body).backgroundColor === '{DARK_BACKGROUND}'")
    _pick_theme(page, "Light")
    frame.wait_for_function("getComputedStyle(document.body).backgroundColor === 'rgb(255, 255, 255)'")
    page.close()


def test_a_loss_spike_is_marked_over_the_loss_curve(browser, server):
    """The diverged run: its loss went NaN with the gradients at NONFINITE_STEP, a critical
    loss spike, marked as a band over its steps, right of every finite loss point drawn."""
    [spike] = [a for a in _alerts_answer(server, DIVERGED)["alerts"] if a["kind"] == "loss_spike"]
    assert (spike["severity"], spike["first_step"], spike["raised_step"]) == (
        "critical", NONFINITE_STEP, NONFINITE_STEP)
    tab = Tab(browser, server, f"#run={DIVERGED}&tag=gradients&axis=step")
    tab.wait_drawn()
    points = _loss_points(tab)
    tab.page.wait_for_function("window.gradientsApp.view.axes.drawnMarks.length > 0")
    [mark] = tab.page.evaluate("window.gradientsApp.view.axes.drawnMarks")
    assert mark["rule"] == "spike"
    assert max(p["x"] for p in points) < mark["left"] < mark["right"] <= tab.canvas_box()["width"]
    tab.close()


def test_a_loss_spike_is_marked_on_the_columns_and_outlines_the_cells_that_moved_first(
        browser, server):
    """The heatmap's columns of a loss spike are marked; picking its finding outlines them and
    the cells of the variable whose gradient moved first, from the step it began to move."""
    [spike] = _alerts_answer(server, LOSS_SPIKE)["alerts"]
    assert (spike["kind"], spike["first_step"]) == ("loss_spike", LOSS_SPIKE_STEP)
    assert spike["moved_first"] == {"variable": "dense_1/kernel", "layer": "dense_1",
                                    "from_step": MOVER_STEP}
    tab = Tab(browser, server, f"#run={LOSS_SPIKE}&tag=gradients&axis=step")
    tab.wait_drawn()
    view = "window.gradientsApp.view"
    tab.page.wait_for_function(f"({view}.drawnColumnMarks || []).length > 0")
    [mark] = tab.page.evaluate(f"{view}.drawnColumnMarks")
    [band] = tab.page.evaluate(f"{view}.axes.drawnMarks")
    width = tab.canvas_box()["width"]
    # One column per step (120 columns): the marks sit at the spike's columns, 82-87.
    assert mark["rule"] == "spike" and band["rule"] == "spike"
    assert abs(mark["left"] - width * LOSS_SPIKE_STEP / 120) < 1.5
    assert abs(mark["right"] - width * (LOSS_SPIKE_STEP + 6) / 120) < 1.5
    assert abs(mark["left"] - band["left"]) < 1.5, "the loss curve's band above the same columns"
    assert _outlined_rows(tab) != [], "the marks cross every row"
    tab.page.locator("[data-testid=alert-group]").first.click()
    tab.page.wait_for_function(f"({view}.drawnOutlines || []).length === 2")
    columns, cells = tab.page.evaluate(f"{view}.drawnOutlines")
    height = tab.canvas_box()["height"]
    assert columns["top"] == 0 and abs(columns["bottom"] - height) < 1.5, "the spike's columns"
    assert abs(columns["left"] - mark["left"]) < 1.5
    row = tab.page.evaluate("window.gradientsApp.matrix.variables").index("dense_1/kernel")
    rows = tab.page.evaluate("window.gradientsApp.matrix.rows")
    assert abs(cells["top"] - height * row / rows) < 1.5, "the mover's row"
    assert abs(cells["left"] - width * MOVER_STEP / 120) < 1.5
    assert abs(cells["right"] - width * (LOSS_SPIKE_STEP + 1) / 120) < 1.5
    tab.close()


def test_a_live_run_shows_a_new_warning_at_the_next_refresh(browser, server, logdir):
    """The run goes on training and its loss spikes: the tab's next refresh (the periodic one,
    called here) shows the warning, with its column marks."""
    tab = Tab(browser, server, f"#run={GROWING}&tag=gradients&axis=step")
    tab.wait_drawn()
    heading = tab.page.locator(".alerts h2")
    assert heading.inner_text() == "No alerts"
    _write_loss_spike_run(str(logdir / GROWING), steps=range(GROWING_STEPS, 120), seed=5)
    tab.page.wait_for_function(
        """async () => { await window.gradientsApp.refreshIfGrown();
                         return window.gradientsApp.matrix.lastSteps.at(-1) === 119; }""",
        polling=500, timeout=60000)
    tab.wait_drawn()
    assert heading.inner_text().startswith("Alerts (")
    assert "loss spiked" in tab.page.locator(".alerts").inner_text()
    assert tab.page.evaluate("window.gradientsApp.view.drawnColumnMarks.length") == 1
    tab.close()
