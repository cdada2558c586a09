"""What the tests that drive a real `tensorboard` process and a real Chromium share.

Also used by `docs/screenshot.py` (the README's screenshot), so it imports nothing from pytest.
"""

import base64
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

from tensorboard_gradients.server.vocabulary import CLASS_STYLES

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# The tab's colours for cell classes: the plugin's vocabulary, which the tab paints with.
NONFINITE_RGB = tuple(CLASS_STYLES["nonfinite"]["fill"])
VANISHING_HATCH_RGB = tuple(CLASS_STYLES["vanishing"]["hatch"]["rgb"])
EXPLODING_HATCH_RGB = tuple(CLASS_STYLES["exploding"]["hatch"]["rgb"])
SPIKE_HATCH_RGB = tuple(CLASS_STYLES["spike"]["hatch"]["rgb"])
# A row only one of two compared runs has (frontend/compare.js): its grey and its stripes.
UNMATCHED_RGB = (196, 196, 196)
UNMATCHED_HATCH_RGB = (120, 120, 120)


def get_json(url, timeout=10):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


# `tensorboard.compat.tf` takes TensorBoard's stub when a module `tensorboard.compat.notf` exists
# (TensorBoard's own switch for builds without TensorFlow).
_TENSORBOARD_WITHOUT_TF = (
    "import sys, types; "
    "sys.modules['tensorboard.compat.notf'] = types.ModuleType('tensorboard.compat.notf'); "
    "sys.argv[0] = 'tensorboard'; "
    "from tensorboard.main import run_main; run_main()"
)


class TensorBoard:
    """``with TensorBoard(logdir, load_fast="false") as tb:`` a real process; ``tb.base`` is its
    URL (with its ``path_prefix``) once the Gradients plugin answers. ``python``: the interpreter
    whose TensorBoard and plugin to run (default: this one).

    ``with_tensorflow``: TensorBoard as it runs beside an installed TensorFlow (a Keras user's),
    which reads files through TensorFlow's own record reader. Without it (the default) TensorBoard
    runs as where the plugin is installed alone (a PyTorch or JAX user's: the plugin needs only
    tensorboard, numpy and werkzeug), with TensorBoard's own TF-free stub
    (``tensorboard.compat.notf``): the same plugin code and routes, and no TensorFlow import, 5.5 of
    each process's 7 CPU seconds to start. Tests of what TensorFlow's reading does to the tab
    (damaged files, the loader cases) pass True."""

    def __init__(self, logdir, load_fast="false", reload_interval=1, path_prefix="",
                 python=sys.executable, with_tensorflow=False):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}{path_prefix}"
        main = ["-m", "tensorboard.main"] if with_tensorflow else ["-c", _TENSORBOARD_WITHOUT_TF]
        self.process = subprocess.Popen(
            [str(python), *main, "--logdir", str(logdir), "--host",
             "127.0.0.1", "--port", str(self.port), f"--load_fast={load_fast}",
             "--reload_interval", str(reload_interval), f"--path_prefix={path_prefix}"],
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

    def wait_for_steps(self, expected, timeout=120):
        """Until every run in ``expected`` ({run: logged steps of its `gradients` tag}) is loaded."""
        def loaded():
            runs = self.runs() or {}
            return all(run in runs and runs[run]["gradients"]["steps"] == steps
                       for run, steps in expected.items())
        self.wait_for(loaded, f"runs {sorted(expected)} to be loaded", timeout)


def launch_chromium(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)


class Tab:
    """The plugin's page as TensorBoard frames it (`data/plugin_entry.html?name=gradients`)."""

    def __init__(self, browser, base, hash_="", viewport=(1400, 900), routes=()):
        """``routes``: ``(url pattern, handler)`` pairs given to ``page.route`` before the
        page opens."""
        self.page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
        self.errors = []
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        for pattern, handler in routes:
            self.page.route(pattern, handler)
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

    def open_finding(self, index):
        """Clicks the ``index``-th finding of the alerts panel open and returns the locator of
        its alerts, once built: they are built on the <details>' toggle event, a task queued
        after the click (under load, read straight after the click, there were none yet)."""
        self.page.locator("[data-testid=alert-group]").nth(index).locator("summary").click()
        opened = self.page.locator("details.alert-group[open] [data-testid=alert]")
        opened.first.wait_for()  # built all at once: the first there, all there
        return opened

    def pixels(self, selector="[data-testid=heatmap-canvas]"):
        """Every pixel of a canvas as an [height, width, 4] array."""
        return canvas_pixels(self.page, selector)

    def canvas_box(self):
        return self.page.locator("[data-testid=heatmap-canvas]").bounding_box()

    def close(self):
        assert self.errors == [], self.errors
        self.page.close()


def canvas_pixels(document, selector):
    """Every pixel of the canvas ``selector`` of a Playwright page or frame, [height, width, 4].

    The bytes come back as one base64 string: as an array, Playwright serialized each of a
    heatmap's few million values on its own (8 s a canvas, a third of the browser tests' time)."""
    width, height, encoded = document.evaluate(
        """(selector) => {
            const c = document.querySelector(selector);
            const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let text = '';
            for (let i = 0; i < data.length; i += 0x8000) {  // apply's argument count is bounded
                text += String.fromCharCode.apply(null, data.subarray(i, i + 0x8000));
            }
            return [c.width, c.height, btoa(text)];
        }""", selector)
    pixels = np.frombuffer(bytearray(base64.b64decode(encoded)), dtype=np.uint8)
    return pixels.reshape(height, width, 4)


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


# Hand-made event files: what a real writer never produces, as a crafted, bit-rotten or foreign
# file has it. Used by test_damaged_logdirs (read_logdir, the CLI) and test_server_robustness (a
# real TensorBoard), so that both craft their damage the same way.

BOMB_SHAPE = [1048576, 1048576]  # float32: 4.4 TB once expanded, declared in a few bytes


def metadata_content(make_content, layout, name="gradients", **changes) -> bytes:
    """``make_content(name, layout)`` (e.g. `metadata.stats_metadata_content`), then with
    ``changes`` to its JSON fields: metadata as another program or an attacker may write it."""
    content = json.loads(make_content(name, layout))
    content.update(changes)
    return json.dumps(content).encode()


def tensor_proto(dtype, shape, **values):
    """A `TensorProto` of ``dtype`` (a `types_pb2` enum) DECLARING ``shape``, whatever
    ``values`` (e.g. ``float_val=[1.0]``) hold."""
    from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2

    dims = [tensor_shape_pb2.TensorShapeProto.Dim(size=size) for size in shape]
    return tensor_pb2.TensorProto(
        dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=dims), **values
    )


def bomb_tensor():
    """TensorFlow's splat encoding: one float for every entry of a `BOMB_SHAPE` tensor (4.4 TB
    once expanded), in a record of a few hundred bytes."""
    return tensor_proto(1, BOMB_SHAPE, float_val=[1.0])  # 1: DT_FLOAT


def summary_value(tag, tensor, content=None):
    """A `Summary.Value` of our plugin: ``tensor`` (a `TensorProto`), with metadata made of
    ``content`` (bytes) when given (loaders keep the first metadata of a tag)."""
    from tensorboard.compat.proto import summary_pb2

    from tensorboard_gradients.format import metadata

    value = summary_pb2.Summary.Value(tag=tag, tensor=tensor)
    if content is not None:
        value.metadata.CopyFrom(metadata.create_summary_metadata(content))
    return value


def write_event_file(run_dir, events, name=None):
    """Writes ``[(step, [summary_value, ...]), ...]`` to a new event file in ``run_dir``, one
    record per step after the file-version record; renamed to ``name`` when given (so that a
    run's files sort in a known order). Returns the file's path."""
    from tensorboard.compat.proto import event_pb2, summary_pb2

    from tensorboard_gradients.format import event_files

    writer = event_files.EventFileWriter(str(run_dir))
    for step, values in events:
        writer.write(event_pb2.Event(step=step, wall_time=1000.0 + step,
                                     summary=summary_pb2.Summary(value=values)))
    path = writer.path
    writer.close()
    if name is not None:
        renamed = os.path.join(str(run_dir), name)
        os.rename(path, renamed)
        path = renamed
    return path


def record_spans(data):
    """``(offset, length)`` of each record of an event file's bytes: its length field at
    ``offset``, its data from ``offset + 12`` to ``offset + 12 + length``."""
    import struct

    spans, offset = [], 0
    while offset + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        spans.append((offset, length))
        offset += 12 + length + 4
    return spans


def _damage_record_of_step(path, step, damage):
    """Calls ``damage(data, offset, length)`` on the bytes of the first record of event file
    ``path`` that logs a summary at ``step`` and writes them back, every checksum as it was."""
    from tensorboard.compat.proto import event_pb2

    data = bytearray(pathlib.Path(path).read_bytes())
    for offset, length in record_spans(data):
        event = event_pb2.Event.FromString(bytes(data[offset + 12: offset + 12 + length]))
        if event.HasField("summary") and event.step == step:
            damage(data, offset, length)
            pathlib.Path(path).write_bytes(bytes(data))
            return
    raise AssertionError(f"{path} has no record of step {step}")


def flip_byte(path, step, field="data"):
    """Flips one byte of the record of ``step`` (see `_damage_record_of_step`): in the middle of
    its data (``"data"``: the record fails its checksum) or of its length field (``"length"``:
    the framing breaks, nothing after it can be read)."""
    assert field in ("data", "length")

    def flip(data, offset, length):
        data[offset + 12 + length // 2 if field == "data" else offset] ^= 0xFF

    _damage_record_of_step(path, step, flip)


def replace_in_record(path, step, old, new):
    """Replaces the bytes ``old`` by ``new`` (same length) inside the record of ``step`` (see
    `_damage_record_of_step`): on-disk damage of known values, as a bit flip leaves it."""
    assert len(old) == len(new)

    def replace(data, offset, length):
        at = bytes(data[offset + 12: offset + 12 + length]).index(old)
        data[offset + 12 + at: offset + 12 + at + len(old)] = new

    _damage_record_of_step(path, step, replace)


def append_record(path, record, valid_checksum=True):
    """Appends one framed record (its length checksum always valid) to an event file."""
    import struct

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    header = struct.pack("<Q", len(record))
    data_crc = masked_crc32c(record) ^ (0 if valid_checksum else 1)
    with open(path, "ab") as f:
        f.write(header + struct.pack("<I", masked_crc32c(header)) + record
                + struct.pack("<I", data_crc))


def natural_key(name):
    """A sort key for natural order, as the tab lists runs: "run2" before "run10"."""
    import re

    return [(0, int(part), "") if part.isdigit() else (1, 0, part.lower())
            for part in re.split(r"(\d+)", name) if part]


def boxes_overlap(a, b):
    """Whether two Playwright bounding boxes share any area."""
    return (a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
            and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"])


def ink_runs(pixels, max_gap):
    """``[(first, last), ...]`` pixel columns of a canvas with any ink (alpha > 0), a blank gap of
    at most ``max_gap`` columns joining two runs: on an axis, one run per label when the labels
    are further apart than the gaps inside one."""
    inked = np.flatnonzero(pixels[..., 3].max(axis=0) > 0)
    runs = []
    for x in inked.tolist():
        if runs and x - runs[-1][1] - 1 <= max_gap:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return [tuple(run) for run in runs]


def open_every_finding(tab):
    """Opens every finding of a `Tab`'s alerts panel that holds several alerts, so that each of
    its alerts is on the page (`[data-testid=alert]`, in the panel's order)."""
    tab.page.locator("details.alert-group > summary").evaluate_all(
        "(summaries) => summaries.forEach((summary) => summary.click())")
