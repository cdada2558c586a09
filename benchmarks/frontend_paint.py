"""Gradients tab in Chromium: time to the first heatmap paint, and redraw time.

    python benchmarks/frontend_paint.py [--quick] [--sizes 100x1000,1000x10000] [--workdir DIR]

For each size (variables x logged steps, generated as in route_latency.py) TensorBoard
(--load_fast=false, every step) serves the run; Chromium (Debian's, driven by Playwright) opens
the tab's page at 1920 x 1080 (a plot about 1,200 px wide) and we time:

* first paint: navigation to the heatmap on screen (the tab's `drawn` flag), cold (the plugin
  reads and analyses the run first) and warm (page reloaded: the plugin's caches answer);
* redraw: `view.draw()` repeated (what a resize or a new colour scale costs: rasterising every
  pixel, labels, axis, colour bar), median of 20, at the columns the tab asked for (~one per
  pixel).

Target (issue 5): a redraw under 50 ms at 1,000 columns on screen.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import route_latency  # noqa: E402  (the same logdirs and TensorBoard process handling)

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1920, "height": 1080}
FULL = dict(sizes=((100, 1000), (1000, 10000)), workdir=None, redraws=20)
QUICK = dict(FULL, sizes=((100, 1000),), redraws=10)

ABOUT = """\
The Gradients tab in a real browser: Debian's Chromium (headless, software rendering, driven by
Playwright) opens the tab's page served by a real TensorBoard (`--load_fast=false`, every step)
on generated runs of V variables x S steps. First paint = navigation until the heatmap is on
screen, cold (the plugin reads and analyses the run first) and warm (page reloaded, the plugin's
caches answer); redraw = the heatmap view redrawn in place (what a resize or a new colour scale
costs: rasterising every pixel of the plot, labels, axis, colour bar), at the columns the tab
asked for (about one per pixel)."""

HOW_TO_READ = """\
How to read this: first paint is what a user waits for after opening the tab, in seconds; cold
includes the plugin's first read of the run (see the route latency section: the heatmap route is
most of it) and the browser's first load of the tab's modules. Redraw is pure drawing, in ms;
the target is under 50 ms at about 1,000 columns. No peer baseline: TensorBoard has no view that
draws variables x steps, and timing its Histograms or Scalars dashboards would time different
pictures of different data (one chart per variable or per tag), so a ratio would not mean
anything; the data side is compared with TensorBoard's scalars route in the route latency section.
Background: [NOTES.md](NOTES.md#frontend-paint)."""


def measure(page, base, redraws):
    url = (f"{base}/data/plugin_entry.html?name=gradients"
           f"#run={route_latency.GRADIENT_RUN}&tag={route_latency.TAG}")
    result = {}
    for label, load in (("first_paint_cold_s", lambda: page.goto(url)),
                        ("first_paint_warm_s", page.reload)):
        start = time.perf_counter()
        load()
        page.wait_for_function("window.gradientsApp && window.gradientsApp.drawn", timeout=600000)
        result[label] = time.perf_counter() - start
    result["columns"], result["rows"] = page.evaluate(
        "[window.gradientsApp.matrix.columns, window.gradientsApp.matrix.rows]")
    times = page.evaluate(
        """(n) => { const v = window.gradientsApp.view; const t = [];
                   for (let i = 0; i < n; i++) { v.draw(); t.push(v.lastDrawMs); } return t; }""",
        redraws)
    result["redraw_ms_median"] = statistics.median(times)
    result["redraw_ms_max"] = max(times)
    return result


def measure_size(browser, workdir, variables, steps, redraws):
    """One row; a failure (TensorBoard, the page) is recorded in it, so other sizes still run."""
    from playwright.sync_api import Error as PlaywrightError

    row = {"variables": variables, "steps": steps}
    logdir, _ = route_latency.logdir_for(workdir, variables, steps, scalar_tags=1)
    log = os.path.join(workdir, f"tensorboard_paint_{variables}x{steps}.log")
    with route_latency.TensorBoard(logdir, "false", "scalars=1000", 0, log) as tb:
        try:
            route_latency.wait_loaded(tb, steps, timeout=1800)
            page = browser.new_page(viewport=VIEWPORT)
            row.update(measure(page, tb.base, redraws))
            page.close()
        except (route_latency.RouteError, OSError, PlaywrightError) as error:
            row["error"] = f"{type(error).__name__}: {error}"
            row["log_tail"] = tb.log_tail()
    return row


def collect(settings):
    """{"config": settings and the browser, "rows": one per size}."""
    from playwright.sync_api import sync_playwright

    workdir = settings["workdir"] or tempfile.mkdtemp(prefix="frontend_paint_")
    os.makedirs(workdir, exist_ok=True)
    rows = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=_common.chromium_executable(),
                                        args=LAUNCH_ARGS)
            config = dict(settings, browser=browser.version, viewport=VIEWPORT)
            for variables, steps in settings["sizes"]:
                rows.append(measure_size(browser, workdir, variables, steps, settings["redraws"]))
                print({k: v for k, v in rows[-1].items() if k != "log_tail"}, flush=True)
            browser.close()
    finally:
        if not settings["workdir"]:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"config": config, "rows": rows}


def render(result):
    c = result["config"]
    intro = (f"Chromium {c['browser']} at {c['viewport']['width']} x {c['viewport']['height']}; "
             f"redraw = median and slowest of {c['redraws']} redraws.")
    headers = ["size (vars x steps)", "columns drawn", "first paint cold s", "first paint warm s",
               "redraw ms median", "redraw ms max"]
    rows = []
    for r in result["rows"]:
        size = f"{r['variables']:,} x {r['steps']:,}"
        if "error" in r:
            rows.append([size, _common.error_cell(r["error"])])
            continue
        rows.append([size, f"{r['columns']:,}", f"{r['first_paint_cold_s']:.2f}",
                     f"{r['first_paint_warm_s']:.2f}", f"{r['redraw_ms_median']:.1f}",
                     f"{r['redraw_ms_max']:.1f}"])
    errors = [
        _common.error_details(f"{r['variables']:,} x {r['steps']:,}", r["error"], r["log_tail"])
        for r in result["rows"] if "error" in r
    ]
    return "\n".join([intro, "", _common.table(headers, rows)] + errors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_common.parse_sizes, help="comma-separated VARIABLESxSTEPS")
    parser.add_argument("--workdir", help="logdirs are generated and kept here")
    parser.add_argument("--redraws", type=int)
    args = _common.parse_args(parser, FULL, QUICK)
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
