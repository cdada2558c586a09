"""The Gradients tab where TensorBoard is not served at a host's root: behind
``tensorboard --path_prefix=/tb`` and through the notebook extension's proxy (``%tensorboard`` in
Jupyter with ``TENSORBOARD_PROXY_URL``, as jupyter-server-proxy serves it), in a real Chromium
against a real `tensorboard` on both loaders."""

import http.server
import os
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

import tensorboard_gradients as tg
from support import CHROMIUM, Tab, TensorBoard, get_json

pytest.importorskip("playwright.sync_api")
if CHROMIUM is None and not os.environ.get("GRADIENTS_REQUIRE_BROWSER"):
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)

RUN = "run1"
STEPS = [0, 1, 2, 3, 4]


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("logs")
    rng = np.random.default_rng(0)
    with tg.GradientWriter(str(logdir / RUN)) as writer:
        for step in STEPS:
            writer.write(step, {"dense/kernel": rng.normal(size=(4, 3)),
                                "dense/bias": rng.normal(size=3)})
    return logdir


def _failed_responses(page):
    """The HTTP errors the page meets (every frame's requests), filled in as they come."""
    failed = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("requestfailed", lambda r: failed.append(f"failed {r.url}"))
    return failed


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_the_tab_works_behind_a_path_prefix(browser, logdir, load_fast):
    with TensorBoard(logdir, load_fast=load_fast, path_prefix="/tb") as tensorboard:
        tensorboard.wait_for_steps({RUN: len(STEPS)})
        assert tensorboard.base.endswith("/tb")
        tab = Tab(browser, tensorboard.base)
        failed = _failed_responses(tab.page)
        tab.wait_drawn()
        assert tab.page.evaluate("window.gradientsApp.state.run") == RUN
        # Every request the tab made (its modules, style sheet and routes) stayed under the prefix.
        assert not failed and not tab.errors, (failed, tab.errors)
        tab.close()


class _NotebookProxy(http.server.ThreadingHTTPServer):
    """What jupyter-server-proxy does for ``%tensorboard``: ``/proxy/<port>/<path>`` is passed to
    ``127.0.0.1:<port>/<path>`` (TensorBoard itself knows nothing of the prefix), and the page
    holding the notebook extension's output is ``/notebook.html``."""

    def __init__(self, notebook_html):
        self.notebook_html = notebook_html.encode()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.base = f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self._answer()

    def do_POST(self):
        self._answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))

    def _answer(self, body=None):
        if self.path == "/notebook.html":
            return self._send(200, {"Content-Type": "text/html"}, self.server.notebook_html)
        parts = self.path.split("/", 3)  # "", "proxy", port, rest
        if len(parts) < 3 or parts[1] != "proxy":
            return self._send(404, {}, b"not proxied")
        headers = {k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")}
        request = urllib.request.Request(
            f"http://127.0.0.1:{parts[2]}/{parts[3] if len(parts) > 3 else ''}", data=body,
            headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, answer, content = response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            status, answer, content = error.code, error.headers, error.read()
        kept = ("content-type", "content-encoding", "cache-control", "x-content-type-options",
                "content-security-policy")
        self._send(status, {k: v for k, v in answer.items() if k.lower() in kept}, content)

    def _send(self, status, headers, content):
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args):
        pass


def _notebook_output(port, monkeypatch):
    """The HTML ``%tensorboard`` displays in a notebook cell for a TensorBoard on ``port``: the
    notebook extension's own (`tensorboard.notebook`), with jupyter-server-proxy's setting."""
    IPython_display = pytest.importorskip("IPython.display")
    from tensorboard import notebook

    shown = []
    monkeypatch.setenv("TENSORBOARD_PROXY_URL", "/proxy/%PORT%/")
    # No Jupyter front end runs here: what the extension hands to `display` is the cell's output.
    monkeypatch.setattr(IPython_display, "display", shown.append)
    notebook._display_ipython(port, height=800, display_handle=None)
    (html,) = shown
    return html.data


def _frame_of_the_tab(page, timeout_s=120):
    """The Gradients tab's frame inside TensorBoard's page, once TensorBoard has made it."""
    for _ in range(timeout_s * 2):
        found = [f for f in page.frames if "plugin_entry.html?name=gradients" in f.url]
        if found:
            return found[0]
        page.wait_for_timeout(500)
    raise AssertionError(f"no Gradients frame among {[f.url for f in page.frames]}")


@pytest.mark.parametrize("load_fast", ["true", "false"])
def test_the_tab_works_through_the_notebook_extensions_proxy(browser, logdir, load_fast,
                                                             monkeypatch):
    with TensorBoard(logdir, load_fast=load_fast) as tensorboard:
        tensorboard.wait_for_steps({RUN: len(STEPS)})
        cell = _notebook_output(tensorboard.port, monkeypatch)
        proxy = _NotebookProxy(f"<!doctype html><html><body>{cell}</body></html>")
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        try:
            proxied = f"{proxy.base}/proxy/{tensorboard.port}/"
            assert RUN in get_json(proxied + "data/plugin/gradients/runs")
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            failed = _failed_responses(page)
            page.goto(f"{proxy.base}/notebook.html")
            # The user opens the Gradients tab in TensorBoard's page (its tab bar or the
            # "inactive" menu): that page's own URL for it.
            page.wait_for_function("document.querySelector('iframe').src.includes('/proxy/')")
            page.evaluate("(f => { f.src = f.src + '#gradients'; })"
                          "(document.querySelector('iframe'))")
            frame = _frame_of_the_tab(page)
            assert frame.url.startswith(proxied), frame.url
            frame.wait_for_function("window.gradientsApp && window.gradientsApp.drawn",
                                    timeout=60_000)
            assert frame.evaluate("window.gradientsApp.state.run") == RUN
            assert not [f for f in failed if "/proxy/" in f and "gradients" in f], failed
            page.close()
        finally:
            proxy.shutdown()
            proxy.server_close()
