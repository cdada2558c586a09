"""Gradients tab in Chromium: time to the first heatmap paint, and redraw time.

    python benchmarks/frontend_paint.py [--sizes 100x1000,1000x10000] [--workdir DIR]

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
import route_latency  # noqa: E402  (the same logdirs and TensorBoard process handling)

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def measure(page, base, redraws):
    url = (f"{base}/data/plugin_entry.html?name=gradients"
           f"#run={route_latency.GRADIENT_RUN}&tag={route_latency.TAG}")
    result = {}
    for label in ("first_paint_cold_s", "first_paint_warm_s"):
        start = time.perf_counter()
        page.goto(url) if label.endswith("cold_s") else page.reload()
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100x1000,1000x10000")
    parser.add_argument("--workdir", default=None, help="logdirs are generated and kept here")
    parser.add_argument("--redraws", type=int, default=20)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    workdir = args.workdir or tempfile.mkdtemp(prefix="frontend_paint_")
    os.makedirs(workdir, exist_ok=True)
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=LAUNCH_ARGS)
        for variables, steps in route_latency.parse_sizes(args.sizes):
            logdir, _ = route_latency.logdir_for(workdir, variables, steps, scalar_tags=1)
            log = os.path.join(workdir, f"tensorboard_paint_{variables}x{steps}.log")
            with route_latency.TensorBoard(logdir, "false", "scalars=1000", 0, log) as tb:
                route_latency.wait_loaded(tb, steps, timeout=1800)
                page = browser.new_page(viewport={"width": 1920, "height": 1080})
                row = {"variables": variables, "steps": steps, **measure(page, tb.base, args.redraws)}
                page.close()
            rows.append(row)
            print(row, flush=True)
        browser.close()
    print("\n| size | columns drawn | first paint cold s | first paint warm s | redraw ms median | max |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variables']:,} x {r['steps']:,} | {r['columns']} | {r['first_paint_cold_s']:.2f} "
              f"| {r['first_paint_warm_s']:.2f} | {r['redraw_ms_median']:.1f} | {r['redraw_ms_max']:.1f} |")
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
