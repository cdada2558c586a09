"""Latency of the plugin's HTTP routes in a real `tensorboard`, against TensorBoard's scalars route.

For each size (variables x logged steps) and each loader (``--load_fast=true``: the Rust data
server; ``false``: the Python multiplexer) this starts ``python -m tensorboard.main`` on a
generated logdir, waits until the run is loaded, then times over HTTP (a new connection per
request, ``Accept-Encoding: gzip`` as a browser sends it, until the last byte of the body):

* ``heatmap?stat=l2_norm&max_steps=1000&encoding=base64`` (what the tab asks for; ``--encoding
  json`` for the JSON lists): the first call ("cold": it pays the read through the data
  provider, the classification, the build and the encoding) and the median of ``--repeats``
  later calls ("warm": the series and its classes are cached, and the plugin keeps
  the gzipped answer of a repeated query); "new stat": a heatmap of another stat each round
  (series and classes cached, the matrix built and encoded: what switching the stat costs);
* ``runs`` (after the heatmap, so its series is cached), ``alerts`` (cold = first call, it pays
  `analysis.diagnose`; warm = median) and ``series`` of one variable (first call, median);
* TensorBoard's own ``/data/plugin/scalars/scalars?run&tag`` for ``--scalar_tags`` tags of the
  same number of steps (a second run in the same logdir, so the same process serves both, and
  the warm calls of both are interleaved round by round). The Scalars dashboard asks for one tag
  per request, so the time for the same number of points as one heatmap stat (variables x steps)
  is the sum over ``variables`` tags; with fewer scalar tags than variables it is the measured sum
  scaled by ``variables / scalar_tags`` (printed as ``scaled``).

Nothing is sampled at load: our plugin keeps every step by default, and the scalars plugin gets
``--samples_per_plugin scalars=<steps + 1>`` (NOT ``scalars=0``: TensorBoard 2.21 passes 0 on to
the scalars route's read, which then returns no points, with either loader). One exception is
inherent: the Rust data server answers a read in one gRPC message of at most 256 MiB, so a tag
bigger than that (1,000 variables x 11 stats x 10,000 steps of float32 = 440 MB) is read by the
plugin as a sampled subset; the ``steps served`` column shows it.

"Loaded" = a marker scalar written after the last step of each run is visible through the scalars
route (the loaders ingest a file in order), so the plugin's routes are not called before the
timed cold call. ``--reload_interval 0`` (load once) by default, so no reload competes with the
requests.

Data: ``block_{i}/dense/kernel`` variables, float32 ``[variables, 11]`` matrices written with
`GradientWriter.write_statistics`: per-variable log-normal ``l2_norm`` around a base scale drawn
from 1e-2..3, the other columns consistent with it, ``size`` finite, a few exploding spikes.
Generated once under ``--workdir`` (kept, reused by later runs) or a temporary folder.

The plugin is imported as Python finds it (TensorBoard does the same): to benchmark a fixed
version while the checkout changes, put an exported copy first on ``PYTHONPATH``; the report
says which one was used.

Run by hand (about 10 minutes for everything on a 2-core VM), or through `run.py`::

    python benchmarks/route_latency.py                                  # everything
    python benchmarks/route_latency.py --quick                          # what run.py --quick runs
    python benchmarks/route_latency.py --sizes 100x1000 --loaders false  # smoke run
"""

import argparse
import gzip
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from tensorboard_gradients.format import columns, metadata
from tensorboard_gradients.format.layout import Layout
from tensorboard_gradients.format.writer import GradientWriter

import _common

GRADIENT_RUN = "gradients_run"
SCALAR_RUN = "scalars_run"
TAG = metadata.DEFAULT_NAME
MARKER_KEY = "benchmark_loaded"  # written by write_scalars as "<name>/benchmark_loaded"
SCALAR_NAME = "scalars"
STAT = "l2_norm"
MAX_STEPS = 1000
FULL = dict(
    sizes=((100, 1000), (100, 10000), (1000, 1000), (1000, 10000)),
    loaders=("true", "false"),
    workdir=None,
    repeats=5,
    scalar_tags=100,
    reload_interval=0,
    load_timeout=3600.0,
    request_timeout=600.0,
    accept_gzip=True,
    encoding="base64",  # what the tab asks for
)
QUICK = dict(FULL, sizes=((100, 1000),), repeats=2)

ABOUT = """\
Latency of the plugin's HTTP routes in a real `tensorboard` process, on both loaders
(`--load_fast=true`: the Rust data server; `false`: the Python multiplexer), for generated runs of
V variables x S logged steps, against TensorBoard's own scalars route serving the same number of
points (V tags x S steps, one request per tag, as the Scalars dashboard asks). One TensorBoard
serves both runs; requests go as a browser sends them (a new connection, `Accept-Encoding: gzip`)
and are timed to the last byte. Cold = the first call after the run is loaded (it reads the run
through the data provider and analyses it); warm = median of the interleaved rounds (a repeated
query is served from the plugin's memoised body); new stat = a heatmap of a stat not asked before
(series cached, matrix built and encoded: what switching the stat costs)."""

HOW_TO_READ = """\
How to read this: the first table is how long TensorBoard takes to have each run in memory and
what the TensorBoard process tree holds (peak = sum of each process's peak, an upper bound); "steps
served" below S means the loader sampled the run. The second table is ms per request; the last
three columns divide our heatmap's time by the time TensorBoard's scalars route takes for the same
V x S points (0.05x = 20 times less). That is a points-for-points yardstick, not what the Scalars
dashboard does by default (it samples 1,000 points per tag and fetches charts as they scroll into
view); with more variables than timed scalar tags the sum is scaled (marked). The Rust loader adds
a ~45 ms floor to every route that lists or reads tags, TensorBoard's own included. Target: a
1,000 x 10,000 heatmap under 1 s once the run is loaded; the first request on such a run is a
known miss, see [NOTES.md](NOTES.md#route-latency) for why and for the history."""


# ----------------------------------------------------------------------------- data


def _stats_matrix(rng, base, sizes, step, spikes):
    """One step's ``[variables, 11]`` float32 matrix, columns in `columns.GRADIENT_STATS` order."""
    n = len(base)
    norm = base * np.exp(rng.normal(0.0, 0.25, n)) * (1.0 + 1.0 / (1.0 + step / 100.0))
    hit = spikes.get(step)
    if hit is not None:
        norm[hit] *= 1e4
    std = norm / np.sqrt(sizes)
    mean = std * rng.normal(0.0, 0.05, n)
    abs_max = std * rng.uniform(3.5, 5.0, n)
    by_name = {
        "l2_norm": norm,
        "mean": mean,
        "std": std,
        "min": -abs_max * rng.uniform(0.8, 1.0, n),
        "max": abs_max,
        "abs_max": abs_max,
        "mean_abs": std * 0.8,
        "zero_fraction": np.zeros(n),
        "nan_count": np.zeros(n),
        "inf_count": np.zeros(n),
        "size": sizes,
    }
    return np.stack([by_name[s] for s in columns.GRADIENT_STATS], axis=1).astype(np.float32)


def write_gradient_run(directory, variables, steps, seed=0):
    rng = np.random.default_rng(seed)
    names = [f"block_{i}/dense/kernel" for i in range(variables)]
    shapes = [(64 * (1 + i % 4), 256) for i in range(variables)]
    sizes = np.array([a * b for a, b in shapes], dtype=np.float64)
    layout = Layout.create(names, shapes, with_weights=False)
    base = 10.0 ** rng.uniform(-2.0, 0.5, variables)
    first = min(100, steps // 2)  # after some history, so the spike rule can see them
    spike_steps = rng.choice(np.arange(first, steps), size=min(5, steps - first), replace=False)
    spikes = {int(s): int(rng.integers(variables)) for s in spike_steps}
    with GradientWriter(directory) as writer:
        for step in range(steps):
            writer.write_statistics(step, layout, _stats_matrix(rng, base, sizes, step, spikes))
        writer.write_scalars(steps - 1, {MARKER_KEY: 1.0})
    return names


def write_scalar_run(directory, tags, steps, seed=1):
    """`tags` scalars-plugin tags ``scalars/v{i}`` of `steps` points each, then the marker."""
    rng = np.random.default_rng(seed)
    with GradientWriter(directory, name=SCALAR_NAME) as writer:
        for step in range(steps):
            values = rng.lognormal(-2.0, 0.5, tags)
            writer.write_scalars(step, {f"v{i}": float(v) for i, v in enumerate(values)})
        writer.write_scalars(steps - 1, {MARKER_KEY: 1.0})


def logdir_for(workdir, variables, steps, scalar_tags):
    """``<workdir>/logs_<V>x<S>_k<tags>`` with both runs (reused once a previous run completed it).

    Changing the data generation keeps the old folders: use a new ``--workdir``.
    """
    logdir = os.path.join(workdir, f"logs_{variables}x{steps}_k{scalar_tags}")
    done = os.path.join(logdir, ".complete")
    if os.path.exists(done):
        return logdir, 0.0
    shutil.rmtree(logdir, ignore_errors=True)
    start = time.perf_counter()
    scalars_source = os.path.join(workdir, f"scalars_{scalar_tags}x{steps}")
    if not os.path.exists(os.path.join(scalars_source, ".complete")):
        shutil.rmtree(scalars_source, ignore_errors=True)
        write_scalar_run(os.path.join(scalars_source, SCALAR_RUN), scalar_tags, steps)
        open(os.path.join(scalars_source, ".complete"), "w").close()
    shutil.copytree(os.path.join(scalars_source, SCALAR_RUN), os.path.join(logdir, SCALAR_RUN))
    write_gradient_run(os.path.join(logdir, GRADIENT_RUN), variables, steps)
    open(done, "w").close()
    return logdir, time.perf_counter() - start


def _tree_bytes(path):
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
    )


# ----------------------------------------------------------------------------- processes


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid):
    """`pid` and every process below it (from /proc)."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    result, todo = [], [pid]
    while todo:
        p = todo.pop()
        result.append(p)
        todo.extend(children.get(p, ()))
    return result


def _memory_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_memory_gib(pid):
    """(current RSS, sum of each process's peak RSS) of the TensorBoard process tree, GiB."""
    pids = _descendants(pid)
    rss = sum(_memory_kib(p, "VmRSS") for p in pids)
    hwm = sum(_memory_kib(p, "VmHWM") for p in pids)
    return rss / 2**20, hwm / 2**20


class TensorBoard:
    """A `tensorboard` subprocess in its own process group, killed as a group on exit."""

    def __init__(self, logdir, load_fast, samples, reload_interval, log_path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.started = time.perf_counter()
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
                "--host", "127.0.0.1", "--port", str(self.port), f"--load_fast={load_fast}",
                "--reload_interval", str(reload_interval), "--samples_per_plugin", samples,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
            # Not the caller's directory: `python -m` puts the cwd first on sys.path, which would
            # shadow a plugin copy given on PYTHONPATH with a checkout's own package.
            cwd=os.path.dirname(os.path.abspath(log_path)),
            start_new_session=True,  # its own process group: the data server dies with it
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def stop(self):
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # stragglers of the group (the data server) even if the leader is gone
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()

    def log_tail(self, chars=3000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")[-chars:]
        except OSError:
            return ""


def get(base, route, timeout, accept_gzip=True, **params):
    """(seconds to the last byte, HTTP status, body as sent, decoded body)."""
    url = base + route + ("?" + urllib.parse.urlencode(params) if params else "")
    headers = {"Accept-Encoding": "gzip"} if accept_gzip else {}
    request = urllib.request.Request(url, headers=headers)
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
            status = response.status
            encoding = response.headers.get("Content-Encoding")
    except urllib.error.HTTPError as error:
        body = error.read()
        status = error.code
        encoding = error.headers.get("Content-Encoding")
    seconds = time.perf_counter() - start
    return seconds, status, body, gzip.decompress(body) if encoding == "gzip" else body


class RouteError(RuntimeError):
    pass


def _checked(result, what):
    """(seconds, bytes sent, decoded body); `RouteError` unless 200."""
    seconds, status, sent, body = result
    if status != 200:
        raise RouteError(f"{what} answered {status}: {body[:2000].decode('utf-8', 'replace')}")
    return seconds, len(sent), body


def _marker_loaded(tb, run, name, steps):
    try:
        _, status, _, body = get(
            tb.base, "/data/plugin/scalars/scalars", 30, run=run, tag=f"{name}/{MARKER_KEY}"
        )
    except OSError:
        return False
    if status != 200:
        return False
    points = json.loads(body)
    return bool(points) and points[-1][1] == steps - 1


def wait_loaded(tb, steps, timeout):
    """Seconds from start until each run's marker is visible: {"up", GRADIENT_RUN, SCALAR_RUN}."""
    times = {}
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if tb.process.poll() is not None:
            raise RouteError(f"tensorboard exited with {tb.process.returncode}:\n{tb.log_tail()}")
        available = _common.meminfo_gib("MemAvailable")
        if available < 1.5:
            raise RouteError(f"machine memory nearly exhausted ({available:.1f} GiB left)")
        if "up" not in times:
            try:
                get(tb.base, "/data/environment", 5)
                times["up"] = time.perf_counter() - tb.started
            except OSError:
                time.sleep(0.25)
                continue
        for run, name in ((GRADIENT_RUN, TAG), (SCALAR_RUN, SCALAR_NAME)):
            if run not in times and _marker_loaded(tb, run, name, steps):
                times[run] = time.perf_counter() - tb.started
        if GRADIENT_RUN in times and SCALAR_RUN in times:
            return times
        time.sleep(0.5)
    raise RouteError(f"not loaded after {timeout} s (have {times}):\n{tb.log_tail()}")


# ----------------------------------------------------------------------------- measurement


def measure(tb, variables, steps, scalar_tags, settings):
    base = tb.base
    heatmap_params = dict(run=GRADIENT_RUN, tag=TAG, stat=STAT, max_steps=MAX_STEPS)
    if settings["encoding"] != "json":
        heatmap_params["encoding"] = settings["encoding"]
    alerts_params = dict(run=GRADIENT_RUN, tag=TAG)
    series_params = dict(run=GRADIENT_RUN, tag=TAG, variable="block_0/dense/kernel")
    r = {}

    def call(route, what, **params):
        return _checked(get(base, route, settings["request_timeout"], settings["accept_gzip"],
                            **params), what)

    seconds, sent, body = call("/data/plugin/gradients/heatmap", "heatmap (cold)", **heatmap_params)
    r["heatmap_cold"], r["heatmap_sent_bytes"], r["heatmap_json_bytes"] = seconds, sent, len(body)
    heatmap = json.loads(body)
    r["heatmap_columns"] = len(heatmap["steps"])
    r["heatmap_rows"] = heatmap["shape"][0] if "shape" in heatmap else len(heatmap["values"])
    r["sampled"] = heatmap["sampled"]
    del heatmap, body

    seconds, _, body = call("/data/plugin/gradients/runs", "runs")
    r["runs_first"] = seconds
    info = json.loads(body)[GRADIENT_RUN][TAG]
    r["steps_served"] = info["steps"]
    r["variables_served"] = info["variables"]

    seconds, _, body = call("/data/plugin/gradients/alerts", "alerts (cold)", **alerts_params)
    r["alerts_cold"] = seconds
    r["alerts_count"] = len(json.loads(body)["alerts"])

    seconds, r["series_sent_bytes"], _ = call(
        "/data/plugin/gradients/series", "series (first)", **series_params)
    r["series_first"] = seconds

    seconds, r["scalar_sent_bytes"], body = call(
        "/data/plugin/scalars/scalars", "scalars", run=SCALAR_RUN, tag=f"{SCALAR_NAME}/v0")
    scalar_points = len(json.loads(body))
    if scalar_points != steps:
        raise RouteError(f"scalars route served {scalar_points} points of {steps}")
    r["scalar_first"] = seconds

    warm = {k: [] for k in ("heatmap", "heatmap_new_stat", "runs", "alerts", "series",
                            "scalars_sum", "scalar_tag")}
    other_stats = [s for s in columns.GRADIENT_STATS if s != STAT]
    # Interleaved rounds: machine noise hits every route alike.
    for round_ in range(settings["repeats"]):
        warm["heatmap"].append(
            call("/data/plugin/gradients/heatmap", "heatmap", **heatmap_params)[0])
        # A stat not asked before: the series and classes are cached, the matrix is not.
        warm["heatmap_new_stat"].append(call(
            "/data/plugin/gradients/heatmap", "heatmap (new stat)",
            **dict(heatmap_params, stat=other_stats[round_ % len(other_stats)]))[0])
        warm["runs"].append(call("/data/plugin/gradients/runs", "runs")[0])
        warm["alerts"].append(call("/data/plugin/gradients/alerts", "alerts", **alerts_params)[0])
        warm["series"].append(call("/data/plugin/gradients/series", "series", **series_params)[0])
        total = 0.0
        for i in range(scalar_tags):
            seconds = call("/data/plugin/scalars/scalars", "scalars", run=SCALAR_RUN,
                           tag=f"{SCALAR_NAME}/v{i}")[0]
            warm["scalar_tag"].append(seconds)
            total += seconds
        warm["scalars_sum"].append(total)
    for key, values in warm.items():
        r[key + "_warm"] = statistics.median(values)
    r["scalars_equiv"] = r["scalars_sum_warm"] * variables / scalar_tags
    return r


def run_one(settings, workdir, variables, steps, load_fast):
    scalar_tags = min(variables, settings["scalar_tags"])
    logdir, generate_s = logdir_for(workdir, variables, steps, scalar_tags)
    row = {
        "variables": variables, "steps": steps, "load_fast": load_fast,
        "scalar_tags": scalar_tags, "generate_s": generate_s,
        "gradient_run_mb": _tree_bytes(os.path.join(logdir, GRADIENT_RUN)) / 1e6,
        "scalar_run_mb": _tree_bytes(os.path.join(logdir, SCALAR_RUN)) / 1e6,
    }
    samples = f"scalars={steps + 1}"
    log_path = os.path.join(workdir, f"tensorboard_{variables}x{steps}_fast-{load_fast}.log")
    with TensorBoard(logdir, load_fast, samples, settings["reload_interval"], log_path) as tb:
        try:
            loaded = wait_loaded(tb, steps, settings["load_timeout"])
            row["up_s"] = loaded["up"]
            row["load_s"] = loaded[GRADIENT_RUN]
            row["scalar_load_s"] = loaded[SCALAR_RUN]
            row["rss_loaded_gib"], _ = tree_memory_gib(tb.process.pid)
            row.update(measure(tb, variables, steps, scalar_tags, settings))
        except (RouteError, OSError) as error:
            row["error"] = f"{type(error).__name__}: {error}"
            row["log_tail"] = tb.log_tail()
        finally:
            row["rss_end_gib"], row["peak_gib"] = tree_memory_gib(tb.process.pid)
    return row



def collect(settings, json_path=None):
    """{"config": settings and the plugin's source, "rows": one per size and loader}.

    Logdirs are generated under ``settings["workdir"]`` (kept, reused) or a temporary folder
    (removed). With `json_path` the raw rows are rewritten there after each row, so a long run
    that dies keeps what it measured.
    """
    config, workdir = _common.started(settings, "route_latency")
    print(f"route latency: workdir {workdir}; plugin from {config['plugin']}", flush=True)
    rows = []
    try:
        for variables, steps in settings["sizes"]:
            for load_fast in settings["loaders"]:
                print(f"-- {variables} x {steps}, load_fast={load_fast} ...", flush=True)
                rows.append(run_one(settings, workdir, variables, steps, load_fast))
                brief = {k: (round(v, 4) if isinstance(v, float) else v)
                         for k, v in rows[-1].items() if k != "log_tail"}
                print(json.dumps(brief), flush=True)
                if json_path:
                    with open(json_path, "w") as f:
                        json.dump(rows, f, indent=1)
    finally:
        if not settings["workdir"]:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"config": config, "rows": rows}


# ----------------------------------------------------------------------------- report


def render(result):
    c = result["config"]
    heatmap_query = f"stat={STAT}&max_steps={MAX_STEPS}" + (
        "" if c["encoding"] == "json" else f"&encoding={c['encoding']}")
    rows = result["rows"]
    return "\n".join([
        f"{c['repeats']} warm rounds; heatmap `{heatmap_query}`; Accept-Encoding gzip: "
        f"{c['accept_gzip']}; `--reload_interval {c['reload_interval']}`; up to "
        f"{c['scalar_tags']} scalar tags timed per size; {c['available_gib']:.1f} GiB memory "
        f"available at the start; plugin from {c['plugin']}.",
        "",
        "Load and memory (seconds from process start; GiB = TensorBoard + data server):",
        "",
        _load_table(rows),
        "",
        "Route latency, ms (cold = first call after load; warm = median of the interleaved "
        "rounds; the last three columns: our time / the scalars route's time for the same "
        "points):",
        "",
        _latency_table(rows),
    ] + _row_notes(rows))


def _load_table(rows):
    headers = ["size (vars x steps)", "loader", "run on disk MB", "HTTP up s",
               "gradients run loaded s", "scalars run loaded s", "RSS loaded GiB", "RSS end GiB",
               "peak GiB", "steps served"]
    cells = []
    for r in rows:
        served = r.get("steps_served")
        served = "-" if served is None else (
            f"{served:,}" + (" (sampled)" if r.get("sampled") else ""))
        cells.append([
            _size(r), _loader(r), f"{r['gradient_run_mb']:.0f}", _s(r.get("up_s")),
            _s(r.get("load_s")), _s(r.get("scalar_load_s")), _g(r.get("rss_loaded_gib")),
            _g(r.get("rss_end_gib")), _g(r.get("peak_gib")), served])
    return _common.table(headers, cells, text_columns=2)


def _latency_table(rows):
    headers = ["size", "loader", "heatmap cold", "heatmap warm", "heatmap, new stat",
               "heatmap MB JSON / sent", "runs", "alerts cold", "alerts warm", "series first",
               "series warm", "scalars: 1 tag", "scalars: vars x steps", "heatmap cold / scalars",
               "new stat / scalars", "heatmap warm / scalars"]
    cells = []
    for r in rows:
        if "heatmap_warm" not in r:
            cells.append([_size(r), _loader(r), _common.error_cell(r["error"])])
            continue
        scaled = ("" if r["scalar_tags"] == r["variables"]
                  else f" (scaled from {r['scalar_tags']} tags)")
        ms = _common.ms
        cells.append([
            _size(r), _loader(r), ms(r["heatmap_cold"]), ms(r["heatmap_warm"]),
            ms(r["heatmap_new_stat_warm"]),
            f"{r['heatmap_json_bytes'] / 1e6:.1f} / {r['heatmap_sent_bytes'] / 1e6:.1f}",
            ms(r["runs_warm"]), ms(r["alerts_cold"]), ms(r["alerts_warm"]), ms(r["series_first"]),
            ms(r["series_warm"]), ms(r["scalar_tag_warm"]), ms(r["scalars_equiv"]) + scaled,
            _common.ratio(r["heatmap_cold"], r["scalars_equiv"]),
            _common.ratio(r["heatmap_new_stat_warm"], r["scalars_equiv"]),
            _common.ratio(r["heatmap_warm"], r["scalars_equiv"])])
    return _common.table(headers, cells, text_columns=2)


def _row_notes(rows):
    """The sampling message and any error with the end of TensorBoard's log, per row."""
    notes = []
    for r in rows:
        if r.get("sampled"):
            notes.append(f"\n{_size(r)}, {_loader(r)}: sampled: {r['sampled']}")
        if "error" in r:
            notes.append(_common.error_details(f"{_size(r)}, {_loader(r)}", r["error"],
                                               r.get("log_tail", "")))
    return notes


def _size(r):
    return f"{r['variables']:,} x {r['steps']:,}"


def _loader(r):
    return "Rust (load_fast=true)" if r["load_fast"] == "true" else "Python (load_fast=false)"


def _s(x):
    return "-" if x is None else f"{x:.1f}"


def _g(x):
    return "-" if x is None else f"{x:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=_common.parse_sizes, help="comma-separated VARIABLESxSTEPS")
    parser.add_argument("--loaders", type=_common.parse_words,
                        help="--load_fast values: true (Rust data server), false (Python)")
    parser.add_argument("--workdir",
                        help="where logdirs are generated and kept (default: a temp dir, removed)")
    parser.add_argument("--repeats", type=int, help="warm rounds per route")
    parser.add_argument("--scalar_tags", type=int,
                        help="scalar tags actually logged and timed (capped at the variables)")
    parser.add_argument("--reload_interval", type=int,
                        help="TensorBoard --reload_interval (0: load once)")
    parser.add_argument("--load_timeout", type=float, help="s to wait for loading")
    parser.add_argument("--request_timeout", type=float, help="s per request")
    parser.add_argument("--no_gzip", dest="accept_gzip", action="store_false",
                        help="do not send Accept-Encoding: gzip (browsers do)")
    parser.add_argument("--encoding", choices=("json", "base64"),
                        help="the heatmap route's encoding parameter (the tab asks for base64)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = _common.parse_args(parser, FULL, QUICK)
    # `kill` of this script unwinds through the `with TensorBoard` blocks (which kill the group).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    _common.run_alone(args, FULL, collect, render, json_path=args.json)


if __name__ == "__main__":
    main()
