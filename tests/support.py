"""What the tests that drive a real `tensorboard` process and a real Chromium share.

Also used by `docs/screenshot.py` (the README's screenshot), so it imports nothing from pytest.
"""

import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# The tab's colours for cell classes (frontend/colormap.js).
NONFINITE_RGB = (255, 45, 85)
VANISHING_HATCH_RGB = (200, 240, 255)
EXPLODING_HATCH_RGB = (150, 0, 20)


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


class TensorBoard:
    """``with TensorBoard(logdir, load_fast="false") as tb:`` a real process; ``tb.base`` is its
    URL once the Gradients plugin answers."""

    def __init__(self, logdir, load_fast="false", reload_interval=1):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host",
             "127.0.0.1", "--port", str(port), f"--load_fast={load_fast}",
             "--reload_interval", str(reload_interval)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
        )

    def __enter__(self):
        try:
            self.wait_for(lambda: self.runs() is not None, "the Gradients plugin to answer")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)

    def runs(self):
        """The plugin's ``runs`` answer, or None while TensorBoard is not up."""
        try:
            return get_json(self.base + "/data/plugin/gradients/runs")
        except OSError:
            return None

    def wait_for(self, condition, what, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tensorboard exited with {self.process.returncode}")
            if condition():
                return
            time.sleep(0.5)
        raise TimeoutError(f"timed out waiting for {what}")

    def wait_for_steps(self, expected):
        """Until every run in ``expected`` ({run: logged steps of its `gradients` tag}) is loaded."""
        def loaded():
            runs = self.runs() or {}
            return all(run in runs and runs[run]["gradients"]["steps"] == steps
                       for run, steps in expected.items())
        self.wait_for(loaded, f"runs {sorted(expected)} to be loaded")


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)


class Tab:
    """The plugin's page as TensorBoard frames it (`data/plugin_entry.html?name=gradients`)."""

    def __init__(self, browser, base, hash_="", viewport=(1400, 900)):
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
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

    def wait_alerts(self):
        """The alerts panel's list as the app holds it (JSON objects, as the plugin sent them)."""
        self.page.wait_for_function("window.gradientsApp && Array.isArray(window.gradientsApp.alerts)")
        self.page.locator(".alerts h2").wait_for()
        return self.page.evaluate("window.gradientsApp.alerts")

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


def row_band(pixels, first_row, last_row, rows):
    """The pixel rows of heatmap rows ``first_row..last_row`` (inclusive) of ``rows``."""
    height = pixels.shape[0]
    return pixels[height * first_row // rows: height * (last_row + 1) // rows]


def run_demo(logdir, quick=True):
    """Runs ``demo/train.py`` as a user would; returns its stdout (raises with its output on error)."""
    command = [sys.executable, str(ROOT / "demo" / "train.py"), "--logdir", str(logdir)]
    done = subprocess.run(command + (["--quick"] if quick else []), capture_output=True,
                          text=True, timeout=1200)
    if done.returncode != 0:
        raise RuntimeError(f"the demo failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout
