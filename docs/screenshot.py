"""Regenerates docs/gradients_tab.png: the Gradients tab as it first opens on the demo's logs.

    python docs/screenshot.py [--logdir runs/demo] [--output docs/gradients_tab.png]

Uses the demo's logs in LOGDIR, training them first (``demo/train.py``, about 1.5 minutes) when
they are not there; serves them with a real `tensorboard` and captures the tab in Debian's
Chromium (Playwright) as a new user first sees it: no run in the URL and none picked before, so
it opens on the most severe run (`RUN`). The details panel is open on the first layer's kernel
at the first non-finite step.
"""

import argparse
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import support  # noqa: E402  (the tests' TensorBoard and Chromium handling)

RUN = "exploding/train"  # the demo's most severe run: the tab opens on it


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logdir", default=str(ROOT / "runs" / "demo"))
    parser.add_argument("--output", default=str(ROOT / "docs" / "gradients_tab.png"))
    args = parser.parse_args()

    import tensorboard_gradients as tg
    from playwright.sync_api import sync_playwright

    if not (os.path.isdir(args.logdir) and RUN in tg.read_logdir(args.logdir)):
        print(f"training the demo into {args.logdir} ...", flush=True)
        support.run_demo(args.logdir, quick=False)
    runs = tg.read_logdir(args.logdir)
    with support.TensorBoard(args.logdir) as tensorboard, sync_playwright() as playwright:
        tensorboard.wait_for_steps({run: len(tags["gradients"].steps) for run, tags in runs.items()})
        browser = support.launch_chromium(playwright)
        tab = support.Tab(browser, tensorboard.base, "")
        tab.wait_drawn()
        tab.wait_alerts()
        opened = tab.page.evaluate("window.gradientsApp.state.run")
        if opened != RUN:
            raise RuntimeError(f"the tab opened on {opened!r}, not the most severe run {RUN!r}")
        tab.page.locator("[data-testid=loss-curve]").wait_for(state="visible")
        box = tab.canvas_box()
        tab.page.mouse.click(box["x"] + box["width"] * 0.99, box["y"] + 2)  # dense_00/kernel
        tab.page.locator(".details canvas").first.wait_for(state="visible")
        tab.page.wait_for_function("document.querySelector('.details').textContent.includes('distribution')")
        tab.page.mouse.move(0, 0)  # no tooltip in the picture
        tab.page.screenshot(path=args.output, full_page=True)
        tab.close()
        browser.close()
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
