"""Long runs and big models (issue 16): 1,000 tensors x 100,000 steps, no spike ever sampled away.

    python benchmarks/long_run.py [--quick] [--variables N] [--steps N] [--skip-tensorboard]
        [--workdir DIR] [--output PATH]

Writes ONE run of V variables x S steps with `GradientWriter.write_statistics` (statistics every
step, histograms every 100th) in which 20 one-step spikes (the gradient x1,000 at random
variables and steps >= 200) and one NaN step (``nan_count`` 3) are planted, listed in
``planted.json`` next to the event file, then measures it against the targets of issue 16:

* writing: steps/s of the writer (data generated in vectorised chunks of 1,000 steps), and bytes
  on disk per tensor-step (one variable at one step): the statistics alone (target <= 64 B, from
  the sizes of the records of steps without histograms) and everything (the event file's size);
* ``tensorboard-gradients diagnose LOGDIR --json`` in a subprocess: wall time (target < 30 s),
  peak resident memory (< 4 GiB), and whether every planted spike has an alert of kind
  ``spike`` by the spike rule and the NaN one of kind ``nonfinite``, each naming the planted
  variable with the planted step inside its ``[first_step, last_step]``;
* a real ``tensorboard`` on each loader (``--load_fast=true``: the Rust data server; ``false``:
  the Python multiplexer). Once it has read the run (a marker scalar written after the last step
  is served by the scalars route: the loaders ingest a file in order, see route_latency.py), it
  times the first overview heatmap (``max_steps=4000``, packed as the tab asks; target < 1 s), a
  zoom to 2,000 steps around a planted spike at full resolution (< 1 s) and the alerts (< 2 s);
  it reads TensorBoard's resident memory (TensorBoard and its data server; < 2 GiB) and checks
  that every plant shows in the overview (the column holding its step has class ``spike`` /
  ``nonfinite`` in its variable's row), in the zoom and in the alerts (no plant lost on either
  loader). Then the run grows: a new writer appends 1,000 steps (a new event file, as a
  restarted job writes), and once TensorBoard serves them the next heatmap and alerts requests
  are timed: the refresh should cost in proportion to the new steps, not to the whole run.

Every wait has a timeout (a request: 120 s) and reports "timeout" instead of hanging; each
request's failure is recorded on its own and the others still run; a watch kills the measured
process when the machine has less than 1.5 GiB of memory left. The plugin of today is expected
to miss several targets at the full size: this benchmark measures by how much.

The run (about 4.7 GB at the full size) is generated under ``--workdir`` (kept, and reused by a
later invocation with the same settings) or a temporary folder (removed). Each loader serves a
copy made of hard links, so the steps appended for the refresh never reach the original. Every
step's statistics are log-normal around a per-variable level (1e-3..1 in L2 norm, 0.07 decades
of noise), the other statistics consistent with it, ``size`` = the variable's entries.

Run by hand (the full size takes long and needs ~5 GB of disk and a machine with memory to
spare), or through ``run.py --only long_run``::

    python benchmarks/long_run.py                                     # 1,000 x 100,000
    python benchmarks/long_run.py --variables 50 --steps 3000          # a smoke run
    python benchmarks/long_run.py --quick --skip-tensorboard           # writing and the CLI only
"""

import argparse
import base64
import http.client
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import NamedTuple

import numpy as np

from tensorboard_gradients import analysis
from tensorboard_gradients.format import columns, metadata
from tensorboard_gradients.format.layout import Layout
from tensorboard_gradients.format.writer import GradientWriter
from tensorboard_gradients.server.store.event_scan import EventFileIntegrity

import _common
import route_latency  # the TensorBoard process, HTTP requests, memory and the loaded marker
from route_latency import _g, _loader, _s  # the same cells as its tables

RUN = "long"
TAG = route_latency.TAG
STAT = "l2_norm"
PLUGIN = "/data/plugin/gradients/"
SPIKE = analysis.CLASSES[analysis.SPIKE]  # a planted spike's heatmap class and alert kind
NONFINITE = analysis.CLASSES[analysis.NONFINITE]  # the NaN's
PLANTED_JSON = "planted.json"
WRITTEN_JSON = "written.json"  # the write's measurements; written last, so it marks a whole run
CHUNK_STEPS = 1000  # steps generated at once: 1,000 x 1,000 variables x 11 stats = 44 MB
FIRST_PLANT_STEP = 200  # plants come after some history, so the spike rule has a median to beat
SPIKE_FACTOR = 1000.0
NAN_COUNT = 3
NOISE_DECADES = 0.07  # step-to-step noise of the norm: far inside the spike rule's 10x floor
HISTOGRAM_SPREAD_DECADES = 0.5  # log10|g| of the entries around the mean |g|
LAYERS_PER_BLOCK = 4
WIDTHS = (128, 256, 512)  # a block's layer width, in turn
# Columns that scale with the gradient: a spike multiplies them all.
SCALED_STATS = ("l2_norm", "mean", "std", "min", "max", "abs_max", "mean_abs")
MEMORY_FLOOR_GIB = 1.5
FULL = dict(
    variables=1000,
    steps=100_000,
    histogram_every=100,
    spikes=20,
    seed=0,
    skip_tensorboard=False,
    loaders=("true", "false"),
    workdir=None,
    overview_columns=4000,
    zoom_steps=2000,
    append_steps=1000,
    reload_interval=5,  # TensorBoard's default: the growing run is picked up by reloads
    request_timeout=120.0,
    load_timeout=1800.0,
    diagnose_timeout=900.0,
)
QUICK = dict(FULL, variables=100, steps=5000)

ABOUT = """\
Issue 16's long run: one run of V variables x S steps (statistics every step, histograms every
100th) with one-step spikes (the gradient x1,000) and one NaN step planted at random cells, all
after step 200. Measured: the writer's speed and bytes on disk per tensor-step (one variable at
one step); `tensorboard-gradients diagnose --json` (time, peak memory, every plant alerted); and
a real `tensorboard` on both loaders once it has read the run: the first overview heatmap (4,000
columns, packed), a zoom to 2,000 steps around a plant at full resolution, the alerts, its
memory, whether every plant shows in the overview, the zoom and the alerts, and the refresh of a
growing run (1,000 steps appended by a new writer, then the next heatmap and alerts)."""

HOW_TO_READ = """\
How to read this: times in seconds, memory in GiB. Targets of issue 16 at 1,000 x 100,000:
statistics <= 64 B per tensor-step on disk; `diagnose` < 30 s and < 4 GiB; first heatmap < 1 s,
zoom (<= 2,000 steps) < 1 s, alerts < 2 s and TensorBoard under 2 GiB on either loader; a
refresh costing in proportion to the new steps (compare it with the first heatmap, which reads
the whole run); no plant lost anywhere ("found" columns: spikes, then the NaN; plants that were
missed are listed below the tables). "loaded" is from TensorBoard's start until it serves the
last step; "first answer" is a heatmap asked right then ("partial": the plugin was still
reading the long run from its event files, and the answer said how far it got); "plugin read"
is from TensorBoard's start until the plugin's answers no longer say so, and the heatmap, zoom
and alerts columns are measured after it; "refresh heatmap" is the first heatmap once
TensorBoard serves the appended steps ("partial": the plugin's background pass was reading
them, and the answer said how many are left), "new steps in the heatmap after" the time from
then until an answer holds them all (asked again every 0.25 s, as the tab does every few
seconds); "peak" sums each process's peak (TensorBoard + data server), an upper bound. A
"timeout" or "failed" cell is a request that did not answer; the reasons and the end of
TensorBoard's log follow the tables."""


# ----------------------------------------------------------------------------- data


class Model(NamedTuple):
    layout: Layout
    sizes: np.ndarray  # entries of each variable
    levels: np.ndarray  # each variable's typical gradient L2 norm


def make_model(variables, seed):
    """Kernel and bias of ``variables / 2`` dense layers in blocks of `LAYERS_PER_BLOCK`
    (``block_003/layer_1/kernel``), each variable's norm level log-uniform in 1e-3..1."""
    names, shapes = [], []
    for i in range(variables):
        block, layer = divmod(i // 2, LAYERS_PER_BLOCK)
        width = WIDTHS[block % len(WIDTHS)]
        kind, shape = ("kernel", (width, width)) if i % 2 == 0 else ("bias", (width,))
        names.append(f"block_{block:03d}/layer_{layer}/{kind}")
        shapes.append(shape)
    levels = 10.0 ** np.random.default_rng(seed).uniform(-3.0, 0.0, variables)
    sizes = np.array([math.prod(shape) for shape in shapes], dtype=np.float64)
    return Model(Layout.create(names, shapes, with_weights=False), sizes, levels)


def plant(model, steps, spikes, seed):
    """``[{"step", "variable", "kind"}]``: `spikes` spikes and one NaN at distinct steps from
    `FIRST_PLANT_STEP` on, on distinct variables while there are enough, in step order."""
    count = spikes + 1
    if steps - FIRST_PLANT_STEP < count:
        raise ValueError(f"{count} plants need at least {FIRST_PLANT_STEP + count} steps")
    rng = np.random.default_rng([seed, 1])
    names = model.layout.variables
    rows = rng.choice(len(names), count, replace=len(names) < count)
    at = rng.choice(np.arange(FIRST_PLANT_STEP, steps), count, replace=False)
    kinds = [SPIKE] * spikes + [NONFINITE]
    planted = [{"step": int(step), "variable": names[row], "kind": kind}
               for step, row, kind in zip(at, rows, kinds)]
    return sorted(planted, key=lambda p: p["step"])


def generate(model, rng, first, count, histogram_every, planted):
    """Steps ``first .. first + count - 1``: the statistics ``[count, variables, stats]``
    (float32) with the plants among them applied, and ``{step: histogram counts}`` of the steps
    with histograms."""
    stats_names = model.layout.stats
    norm = model.levels * 10.0 ** rng.normal(0.0, NOISE_DECADES, (count, len(model.levels)))
    rms = norm / np.sqrt(model.sizes)
    abs_max = 4.0 * rms
    by_name = {
        "l2_norm": norm, "mean": rms * rng.normal(0.0, 0.05, norm.shape), "std": rms,
        "min": -0.9 * abs_max, "max": abs_max, "abs_max": abs_max, "mean_abs": 0.8 * rms,
        "zero_fraction": 0.0, "nan_count": 0.0, "inf_count": 0.0, "size": model.sizes,
    }
    stats = np.empty(norm.shape + (len(stats_names),), dtype=np.float32)
    for column, name in enumerate(stats_names):
        stats[:, :, column] = by_name[name]
    scaled = [columns.position(stats_names, name) for name in SCALED_STATS]
    for p in planted:
        if first <= p["step"] < first + count:
            cell = stats[p["step"] - first, model.layout.variables.index(p["variable"])]
            if p["kind"] == SPIKE:
                cell[scaled] *= SPIKE_FACTOR
            else:
                cell[columns.position(stats_names, "nan_count")] = NAN_COUNT
    logged = [s for s in range(first, first + count) if s % histogram_every == 0]
    counts = histogram_counts(stats[np.array(logged, dtype=np.int64) - first], stats_names)
    return stats, dict(zip(logged, counts))


def histogram_counts(stats, stats_names):
    """``[..., variables, HISTOGRAM_BINS]`` float32 counts for statistics ``[..., variables,
    stats]``: the finite entries' log10|g| normal around log10(mean |g|), the NaN entries in
    their bin; every row adds up to ``size``."""
    mean_abs = stats[..., columns.position(stats_names, "mean_abs")].astype(np.float64)
    nan = stats[..., columns.position(stats_names, "nan_count")]
    finite = stats[..., columns.position(stats_names, "size")] - nan
    edges = np.asarray(columns.HISTOGRAM_LOG10_EDGES)
    centres = (edges[:-1] + edges[1:]) / 2
    weights = np.exp(-0.5 * ((centres - np.log10(mean_abs)[..., None])
                             / HISTOGRAM_SPREAD_DECADES) ** 2)
    cumulative = np.cumsum(weights, axis=-1)
    # Rounded cumulative counts: whole numbers that add up to exactly `finite`.
    totals = np.round(cumulative / cumulative[..., -1:] * finite[..., None])
    counts = np.zeros(mean_abs.shape + (columns.HISTOGRAM_BINS,), dtype=np.float32)
    counts[..., columns.HIST_FIRST_LOG_BIN:columns.HIST_ABOVE] = np.diff(totals, prepend=0.0)
    counts[..., columns.HIST_NAN] = nan
    return counts


def _write_steps(writer, model, rng, first, count, histogram_every, planted=()):
    """Writes steps ``first .. first + count - 1`` chunk by chunk, then the loaded marker at the
    last one; returns the bytes a step without histograms adds to the run (the median: the
    writer's digest records land in whichever step is being written when they are ready)."""
    stats_only_bytes = []
    size = route_latency._tree_bytes(writer.logdir)
    for start in range(first, first + count, CHUNK_STEPS):
        chunk = min(CHUNK_STEPS, first + count - start)
        stats, histograms = generate(model, rng, start, chunk, histogram_every, planted)
        for i, step in enumerate(range(start, start + chunk)):
            writer.write_statistics(step, model.layout, stats[i], histograms.get(step))
            previous, size = size, route_latency._tree_bytes(writer.logdir)
            if step not in histograms:
                stats_only_bytes.append(size - previous)
    writer.write_scalars(first + count - 1, {route_latency.MARKER_KEY: 1.0})
    return float(np.median(stats_only_bytes))


def _digest_bytes(directory):
    """(bytes of the writer's digest records in the run, their number): each record is its
    8-byte length, 4 bytes of checksum, the data and 4 more bytes of checksum."""
    located = EventFileIntegrity(os.path.dirname(directory)).located(
        os.path.basename(directory), metadata.digest_tag(metadata.DEFAULT_NAME))
    total = 0
    for path, offset, _ in located.locations:
        with open(path, "rb") as file:
            file.seek(offset)
            total += 16 + int.from_bytes(file.read(8), "little")
    return total, len(located.steps)


def write_long_run(directory, variables=1000, steps=100_000, histogram_every=100, spikes=20,
                   seed=0):
    """Writes the run into the new run directory `directory`, with ``planted.json`` (the plants)
    and ``written.json`` (what the write measured) next to its event file.

    Returns the measurements with ``planted``: ``[{"step", "variable", "kind"}]``, kind
    ``spike`` for a spike, ``nonfinite`` for the NaN.
    """
    model = make_model(variables, seed)
    planted = plant(model, steps, spikes, seed)
    start = time.perf_counter()
    with GradientWriter(directory) as writer:
        stats_step_bytes = _write_steps(
            writer, model, np.random.default_rng([seed, 2]), 0, steps, histogram_every, planted)
    write_s = time.perf_counter() - start
    run_bytes = route_latency._tree_bytes(directory)
    digest_bytes, digest_records = _digest_bytes(directory)
    written = {
        "write_s": write_s,
        "steps_per_s": steps / write_s,
        "run_bytes": run_bytes,
        "bytes_per_tensor_step": run_bytes / (variables * steps),
        # The statistics and what the writer adds for speed (its digest), per tensor-step.
        "stats_bytes_per_tensor_step": (stats_step_bytes / variables
                                        + digest_bytes / (variables * steps)),
        "digest_bytes_per_tensor_step": digest_bytes / (variables * steps),
        "digest_records": digest_records,
    }
    with open(os.path.join(directory, PLANTED_JSON), "w") as f:
        json.dump(planted, f, indent=1)
    with open(os.path.join(directory, WRITTEN_JSON), "w") as f:
        json.dump(written, f, indent=1)
    return dict(written, planted=planted)


def append_steps(directory, first_step, count, variables, histogram_every=100, seed=0):
    """Grows the run: `count` healthy steps from `first_step` on, by a new writer (a new event
    file in the run, as a restarted job writes), then the loaded marker."""
    model = make_model(variables, seed)
    with GradientWriter(directory) as writer:
        _write_steps(writer, model, np.random.default_rng([seed, 3, first_step]), first_step,
                     count, histogram_every)


def long_run_for(workdir, settings):
    """(run directory, `write_long_run`'s result) under `workdir`: reused when an earlier
    invocation with the same settings completed it (then ``"reused": True``).

    Changing the data generation keeps the old folders: use a new ``--workdir``.
    """
    s = settings
    name = (f"long_run_{s['variables']}x{s['steps']}_h{s['histogram_every']}_p{s['spikes']}"
            f"_s{s['seed']}")
    run_dir = os.path.join(workdir, name, RUN)
    if os.path.exists(os.path.join(run_dir, WRITTEN_JSON)):
        with open(os.path.join(run_dir, WRITTEN_JSON)) as f:
            written = json.load(f)
        with open(os.path.join(run_dir, PLANTED_JSON)) as f:
            # Runs written before spikes were a class of their own labelled them "exploding".
            planted = [dict(p, kind=SPIKE if p["kind"] == "exploding" else p["kind"])
                       for p in json.load(f)]
            return run_dir, dict(written, planted=planted, reused=True)
    shutil.rmtree(os.path.dirname(run_dir), ignore_errors=True)
    return run_dir, write_long_run(run_dir, s["variables"], s["steps"], s["histogram_every"],
                                   s["spikes"], s["seed"])


# ----------------------------------------------------------------------------- checks


def missed_in_heatmap(heatmap, planted):
    """The plants whose cell does not show their class in a packed heatmap answer: the column
    holding the plant's step, in its variable's row."""
    codes = np.frombuffer(base64.b64decode(heatmap["classes"]), np.uint8)
    codes = codes.reshape(heatmap["shape"])
    rows = {name: i for i, name in enumerate(heatmap["variables"])}
    missed = []
    for p in planted:
        column = int(np.searchsorted(heatmap["steps"], p["step"], side="right")) - 1
        inside = column >= 0 and p["step"] <= heatmap["last_steps"][column]
        if not inside or heatmap["class_names"][codes[rows[p["variable"]], column]] != p["kind"]:
            missed.append(p)
    return missed


def missed_in_alerts(alerts, planted):
    """The plants without an alert of their own: their kind (a spike by the spike rule, the one
    that judges a step against the variable's history), their variable, their step in its span."""
    def covers(alert, p):
        return (alert["kind"] == p["kind"] and alert["variable"] == p["variable"]
                and (p["kind"] != SPIKE or alert["rule"] == "spike")
                and alert["first_step"] <= p["step"] <= alert["last_step"])

    return [p for p in planted if not any(covers(alert, p) for alert in alerts)]


# ----------------------------------------------------------------------------- processes


class MemoryWatch:
    """While a process group runs: the peak resident memory of its tree (sampled sum of each
    process's peak), and a guard that kills the group when the machine is down to
    `MEMORY_FLOOR_GIB` available, so a measurement that would exhaust it reports that instead."""

    def __init__(self, pid):
        self.pid = pid
        self.peak_gib = 0.0
        self.killed = None  # why the group was killed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()

    def _watch(self):
        while not self._stop.wait(0.25):
            self.peak_gib = max(self.peak_gib, route_latency.tree_memory_gib(self.pid)[1])
            available = _common.meminfo_gib("MemAvailable")
            if available < MEMORY_FLOOR_GIB and self.killed is None:
                self.killed = f"killed when the machine had {available:.1f} GiB of memory left"
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def measure_diagnose(logdir, planted, timeout, workdir):
    """`tensorboard-gradients diagnose LOGDIR --json` in its own process group: wall time, peak
    resident memory, and the plants its alerts miss."""
    row = {"measurement": "diagnose"}
    # --fail-on none: the planted NaN is a finding, not a failure of the measurement.
    command = [sys.executable, "-m", "tensorboard_gradients", "diagnose", logdir, "--json",
               "--fail-on", "none"]
    start = time.perf_counter()
    # cwd: not the checkout, whose package `python -m` would put first on sys.path.
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=workdir, start_new_session=True)
    with MemoryWatch(process.pid) as watch:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            row["error"] = f"timeout after {timeout:g} s"
    row["wall_s"] = time.perf_counter() - start
    row["peak_gib"] = watch.peak_gib
    row["exit"] = process.returncode
    if watch.killed:
        row["error"] = watch.killed
    if "error" not in row and process.returncode != 0:
        row["error"] = f"exit status {process.returncode}"
    if "error" not in row:
        try:
            alerts = json.loads(out)["alerts"]
        except (ValueError, KeyError) as error:
            row["error"] = f"unexpected output ({type(error).__name__}: {error})"
    if "error" in row:
        row["stderr_tail"] = err.decode("utf-8", "replace")[-3000:]
        return row
    row["alerts"] = len(alerts)
    row["alerts_missed"] = missed_in_alerts(alerts, planted)
    return row


def _wait_for_step(tb, last_step, timeout):
    """Until TensorBoard serves the marker written after `last_step`; `RouteError` if it exits
    or after `timeout` seconds."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if tb.process.poll() is not None:
            raise route_latency.RouteError(f"tensorboard exited with {tb.process.returncode}")
        if route_latency._marker_loaded(tb, RUN, TAG, last_step + 1):
            return
        time.sleep(0.5)
    raise route_latency.RouteError(f"step {last_step} not served after {timeout:g} s")


def _wait_until_read(tb, row, settings):
    """Until the plugin has read the long run (its answers no longer say it is reading):
    ``row["read_s"]``, seconds from TensorBoard's start."""
    deadline = time.perf_counter() + settings["load_timeout"]
    while time.perf_counter() < deadline:
        answer = _ask(tb, row, "read_poll", "alerts", settings["request_timeout"],
                      run=RUN, tag=TAG)
        if answer is not None and answer["sampled"] is None:
            row["read_s"] = time.perf_counter() - tb.started
            return
        time.sleep(1)
    row["failed"]["reading"] = f"still reading after {settings['load_timeout']:g} s"


def _ask(tb, row, label, route, timeout, **params):
    """The JSON answer of the plugin's `route`, its seconds in ``row[label]``; None when it
    fails, with why in ``row["failed"][label]``."""
    try:
        seconds, _, body = route_latency._checked(
            route_latency.get(tb.base, PLUGIN + route, timeout, **params), label)
        answer = json.loads(body)
    except (route_latency.RouteError, OSError, http.client.HTTPException, ValueError) as error:
        timed_out = (isinstance(error, TimeoutError)
                     or isinstance(getattr(error, "reason", None), TimeoutError))
        row["failed"][label] = (f"timeout after {timeout:g} s" if timed_out
                                else f"{type(error).__name__}: {error}")
        return None
    row[label] = seconds
    return answer


def _linked_copy(source, destination):
    """The run directory `source` as hard links under `destination` (no data copied)."""
    os.makedirs(destination)
    for name in os.listdir(source):
        os.link(os.path.join(source, name), os.path.join(destination, name))


def measure_tensorboard(settings, workdir, run_dir, planted, load_fast):
    """One loader: the routes' latency, memory, plants found, and the growing run's refresh."""
    row = {"measurement": "tensorboard", "load_fast": load_fast, "failed": {}}
    logdir = os.path.join(workdir, f"long_run_tensorboard_{load_fast}")
    shutil.rmtree(logdir, ignore_errors=True)
    _linked_copy(run_dir, os.path.join(logdir, RUN))
    log_path = os.path.join(workdir, f"tensorboard_long_run_fast-{load_fast}.log")
    try:
        # "scalars=1000" is TensorBoard's own default: it changes nothing (the marker has 2 points).
        with route_latency.TensorBoard(logdir, load_fast, "scalars=1000",
                                       settings["reload_interval"], log_path) as tb, \
                MemoryWatch(tb.process.pid) as watch:
            try:
                _wait_for_step(tb, settings["steps"] - 1, settings["load_timeout"])
            except route_latency.RouteError as error:
                row["failed"]["loading"] = str(error)
            else:
                row["loaded_s"] = time.perf_counter() - tb.started
                # The first answer as TensorBoard has read the run: the plugin may still be
                # reading it (the answer then says how far it got).
                early = _ask(tb, row, "early_heatmap", "heatmap", settings["request_timeout"],
                             run=RUN, tag=TAG, stat=STAT, encoding="base64",
                             max_steps=settings["overview_columns"])
                row["early_partial"] = bool(early and early["sampled"])
                _wait_until_read(tb, row, settings)
                _measure_routes(tb, row, settings, planted)
                row["rss_gib"] = route_latency.tree_memory_gib(tb.process.pid)[0]
                _measure_refresh(tb, row, settings, os.path.join(logdir, RUN))
        row["peak_gib"] = watch.peak_gib
        if watch.killed:
            row["failed"]["memory"] = watch.killed
        if row["failed"]:
            row["error"] = "; ".join(f"{label}: {why}" for label, why in row["failed"].items())
            row["log_tail"] = tb.log_tail()
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return row


def _measure_routes(tb, row, settings, planted):
    timeout, steps = settings["request_timeout"], settings["steps"]
    heatmap_params = dict(run=RUN, tag=TAG, stat=STAT, encoding="base64")
    overview = _ask(tb, row, "heatmap", "heatmap", timeout,
                    max_steps=settings["overview_columns"], **heatmap_params)
    if overview is not None:
        row["heatmap_missed"] = missed_in_heatmap(overview, planted)
    runs = _ask(tb, row, "runs", "runs", timeout)
    overview_info = (runs or {}).get(RUN, {}).get(TAG)
    if overview_info is not None:
        row["steps_served"] = overview_info["steps"]
        row["sampled"] = overview_info["sampled"]
    # A zoom around a spike picked at random, the spike somewhere in the window.
    rng = np.random.default_rng([settings["seed"], 4])
    spikes = [p for p in planted if p["kind"] == SPIKE]
    spike = spikes[rng.integers(len(spikes))]
    zoom = min(settings["zoom_steps"], steps)
    first = int(min(max(spike["step"] - rng.integers(zoom), 0), steps - zoom))
    last = first + zoom - 1
    zoomed = _ask(tb, row, "zoom", "heatmap", timeout, max_steps=zoom, first_step=first,
                  last_step=last, **heatmap_params)
    if zoomed is not None:
        row["zoom_columns"] = len(zoomed["steps"])
        row["zoom_planted"] = [p for p in planted if first <= p["step"] <= last]
        row["zoom_missed"] = missed_in_heatmap(zoomed, row["zoom_planted"])
    alerts = _ask(tb, row, "alerts", "alerts", timeout, run=RUN, tag=TAG)
    if alerts is not None:
        row["alerts_missed"] = missed_in_alerts(alerts["alerts"], planted)


def _measure_refresh(tb, row, settings, run_dir):
    """Appends steps with a new writer, waits until TensorBoard serves them, then times the
    next overview heatmap and alerts."""
    steps, added = settings["steps"], settings["append_steps"]
    start = time.perf_counter()
    append_steps(run_dir, steps, added, settings["variables"], settings["histogram_every"],
                 settings["seed"])
    row["append_s"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
        _wait_for_step(tb, steps + added - 1, settings["load_timeout"])
    except route_latency.RouteError as error:
        row["failed"]["refresh"] = str(error)
        return
    row["refresh_seen_s"] = time.perf_counter() - start
    timeout = settings["request_timeout"]
    params = dict(run=RUN, tag=TAG, stat=STAT, encoding="base64",
                  max_steps=settings["overview_columns"])
    heatmap = _ask(tb, row, "refresh_heatmap", "heatmap", timeout, **params)
    # An answer given while the plugin's background pass reads the new steps says how many are
    # still to read, and the tab asks again: so does this, until they are read.
    row["refresh_partial"] = heatmap is not None and heatmap["steps_to_read"] > 0
    deadline = time.perf_counter() + timeout
    while heatmap is not None and heatmap["steps_to_read"] and time.perf_counter() < deadline:
        time.sleep(0.25)
        heatmap = _ask(tb, row, "refresh_reread", "heatmap", timeout, **params)
    row["refresh_read_s"] = time.perf_counter() - start
    if heatmap is not None and heatmap["last_steps"][-1] != steps + added - 1:
        row["failed"]["refresh"] = (f"the heatmap after the refresh ends at step "
                                    f"{heatmap['last_steps'][-1]}, not {steps + added - 1}")
    _ask(tb, row, "refresh_alerts", "alerts", timeout, run=RUN, tag=TAG)


def collect(settings):
    """{"config", "write": the write's measurements, "planted", "rows": diagnose, then one per
    loader}. A failed measurement is an ``"error"`` in its row; the others still run."""
    config, workdir = _common.started(settings, "long_run")
    print(f"long run: {settings['variables']:,} x {settings['steps']:,} in {workdir}; plugin "
          f"from {config['plugin']}", flush=True)
    try:
        run_dir, written = long_run_for(workdir, settings)
        planted = written.pop("planted")
        print(json.dumps(written), flush=True)
        rows = [measure_diagnose(os.path.dirname(run_dir), planted,
                                 settings["diagnose_timeout"], workdir)]
        print(_brief(rows[-1]), flush=True)
        for load_fast in () if settings["skip_tensorboard"] else settings["loaders"]:
            print(f"-- tensorboard --load_fast={load_fast} ...", flush=True)
            rows.append(measure_tensorboard(settings, workdir, run_dir, planted, load_fast))
            print(_brief(rows[-1]), flush=True)
    finally:
        if not settings["workdir"]:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"config": config, "write": written, "planted": planted, "rows": rows}


def _brief(row):
    return json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                       for k, v in row.items() if k not in ("log_tail", "zoom_planted")})


# ----------------------------------------------------------------------------- report


def render(result):
    c, w, planted = result["config"], result["write"], result["planted"]
    diagnose = [r for r in result["rows"] if r["measurement"] == "diagnose"]
    loaders = [r for r in result["rows"] if r["measurement"] == "tensorboard"]
    reused = (" The run was reused from an earlier invocation (its write as measured then)."
              if w.get("reused") else "")
    lines = [
        f"{c['variables']:,} variables x {c['steps']:,} steps "
        f"({c['variables'] * c['steps']:,} tensor-steps), histograms every {c['histogram_every']} "
        f"steps; planted: {c['spikes']} one-step spikes (x{SPIKE_FACTOR:,.0f}) and 1 NaN step; "
        f"seed {c['seed']}; overview {c['overview_columns']:,} columns, zoom "
        f"{c['zoom_steps']:,} steps, refresh +{c['append_steps']:,} steps; "
        f"`--reload_interval {c['reload_interval']}`; request timeout "
        f"{c['request_timeout']:g} s; {c['available_gib']:.1f} GiB memory available at the "
        f"start; plugin from {c['plugin']}.{reused}",
        "",
        "Writing (`GradientWriter.write_statistics`) and disk, bytes per tensor-step:",
        "",
        _common.table(
            ["write s", "steps/s", "run on disk MB", "statistics B", "of which digest B",
             "digest records", "with histograms B"],
            [[f"{w['write_s']:.1f}", f"{w['steps_per_s']:,.0f}", f"{w['run_bytes'] / 1e6:,.0f}",
              f"{w['stats_bytes_per_tensor_step']:.1f}",
              f"{w.get('digest_bytes_per_tensor_step', 0):.2f}", f"{w.get('digest_records', 0)}",
              f"{w['bytes_per_tensor_step']:.1f}"]],
            text_columns=0),
        "",
        "`tensorboard-gradients diagnose LOGDIR --json`:",
        "",
        _diagnose_table(diagnose, planted),
    ]
    if loaders:
        lines += ["", "A real `tensorboard` per loader (s; GiB = TensorBoard + data server):",
                  "", _tensorboard_table(loaders, planted)]
    return "\n".join(lines + _notes(result["rows"]))


def _diagnose_table(rows, planted):
    headers = ["wall s", "peak GiB", "alerts", "found: spikes, NaN", "exit status"]
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([_s(r["wall_s"]), _common.error_cell(r["error"])])
            continue
        cells.append([_s(r["wall_s"]), f"{r['peak_gib']:.2f}", f"{r['alerts']:,}",
                      _found(planted, r["alerts_missed"]), r["exit"]])
    return _common.table(headers, cells, text_columns=0)


def _tensorboard_table(rows, planted):
    headers = ["loader", "loaded s", "first answer s", "plugin read s", "steps served",
               "first heatmap s", "zoom s", "zoom columns",
               "alerts s", "RSS GiB", "peak GiB", "overview found", "zoom found", "alerts found",
               "append s", "new steps served after s", "refresh heatmap s",
               "new steps in the heatmap after s", "refresh alerts s"]
    cells = []
    for r in rows:
        if "loaded_s" not in r:
            cells.append([_loader(r), _common.error_cell(r["error"])])
            continue
        served = "-" if "steps_served" not in r else (
            f"{r['steps_served']:,}" + (" (sampled)" if r["sampled"] else ""))
        early = _timed(r, "early_heatmap") + (" (partial)" if r.get("early_partial") else "")
        cells.append([
            _loader(r), _s(r["loaded_s"]), early, _s(r.get("read_s")), served,
            _timed(r, "heatmap"), _timed(r, "zoom"),
            f"{r['zoom_columns']:,}" if "zoom_columns" in r else "-", _timed(r, "alerts"),
            _g(r.get("rss_gib")), _g(r.get("peak_gib")),
            _found(planted, r.get("heatmap_missed")),
            _found(r.get("zoom_planted", []), r.get("zoom_missed")),
            _found(planted, r.get("alerts_missed")), _s(r.get("append_s")),
            _s(r.get("refresh_seen_s")),
            _timed(r, "refresh_heatmap") + (" (partial)" if r.get("refresh_partial") else ""),
            _s(r.get("refresh_read_s")), _timed(r, "refresh_alerts")])
    return _common.table(headers, cells, text_columns=1)


def _notes(rows):
    """Per row: the plants it missed, why TensorBoard sampled, its errors with the end of
    TensorBoard's log or of the CLI's stderr."""
    notes = []
    for r in rows:
        label = _loader(r) if r["measurement"] == "tensorboard" else "diagnose"
        for where in ("heatmap", "zoom", "alerts"):
            missed = r.get(f"{where}_missed")
            if missed:
                listed = ", ".join(f"{p['kind']} at step {p['step']} of {p['variable']}"
                                   for p in missed[:5])
                more = f" and {len(missed) - 5} more" if len(missed) > 5 else ""
                notes.append(f"\n{label}: {where} missed {listed}{more}.")
        if r.get("sampled"):
            notes.append(f"\n{label}: sampled: {r['sampled']}")
        if "log_tail" in r:
            notes.append(_common.error_details(label, r["error"], r["log_tail"]))
        elif "error" in r:
            stderr = r.get("stderr_tail", "").strip()
            notes.append(f"\n{label}: {r['error']}"
                         + (f"\n\n```\n--- stderr tail ---\n{stderr}\n```" if stderr else ""))
    return notes


def _found(planted, missed):
    """"spikes found/planted, NaN found/planted"; "-" when not measured."""
    if missed is None:
        return "-"
    counts = []
    for kind in (SPIKE, NONFINITE):
        total = sum(p["kind"] == kind for p in planted)
        counts.append(f"{total - sum(p['kind'] == kind for p in missed)}/{total}")
    return ", ".join(counts)


def _timed(row, label):
    if label in row:
        return f"{row[label]:.3f}"
    why = row["failed"].get(label, "")
    return "timeout" if why.startswith("timeout") else ("failed" if why else "-")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variables", type=int, help="tensors in the run (default 1,000)")
    parser.add_argument("--steps", type=int, help="logged steps (default 100,000)")
    parser.add_argument("--skip-tensorboard", dest="skip_tensorboard", action="store_true",
                        help="only write the run and run the CLI")
    parser.add_argument("--workdir", help="where the run is generated and kept, reused by a later "
                                          "invocation (default: a temporary folder, removed)")
    parser.add_argument("--output", help="also write the markdown section to this file")
    args = _common.parse_args(parser, FULL, QUICK)
    # `kill` of this script unwinds through the `with` blocks (which kill TensorBoard's group).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    environment = _common.render_environment(_common.environment())
    print(environment + "\n", flush=True)
    section = render(collect(_common.settings_from(args, FULL)))
    print(section)
    if args.output:
        with open(args.output, "w") as f:
            f.write("\n\n".join([ABOUT, environment, section, HOW_TO_READ]) + "\n")


if __name__ == "__main__":
    main()
