"""The first `runs` answer of a run with 2,000 tags, on both loaders (issue 34).

    python benchmarks/many_tags.py [--quick] [--tags N[,N]] [--layouts one_file,file_per_tag]
        [--loaders true,false] [--workdir DIR]

When the plugin listed its tags through TensorBoard's data provider, a run of 2,000 tags took
the Rust loader 89 s to list the first time (0.5 s on the Python loader). For a local logdir the
plugin now lists them from its own scan of the event files (`server/store/event_scan.py`),
without waiting for TensorBoard to load the logdir. Target: that first answer in under 1 s on
either loader.

One run of N stats tags of one variable, ``steps`` logged steps each, in one of two layouts:

* ``one_file``: one `GradientWriter`, each tag a variable set of its own (``gradients``,
  ``gradients_varset2``, ...: `layout.LayoutTags`), all in one event file: the cheapest way to
  write many tags (`tests/test_local_reader_cases.py` writes its run of 2,000 tags so);
* ``file_per_tag``: N writers, one per summary name (``layer<i>``), each with its own event
  file, as N writers of one run leave it. Each writes in a staging directory and its file is
  moved into the run: a writer joining a run reads the files already there first
  (`writer._tags_in_run`), so written in place the N-th would read N - 1 files.

For each layout, size and loader a fresh ``python -m tensorboard.main`` serves the run (with
TensorBoard's default ``--reload_interval 5``). As soon as the plugin answers at all (its
``thresholds`` route, which reads no logdir), the first ``runs`` is asked and timed to its last
byte, and checked to list every tag with its steps; then ``runs`` again, ``repeats`` times
(median). A request that does not answer within ``request_timeout`` is reported as a timeout
(TensorBoard is then stopped), never waited for.

Runs are generated once under ``--workdir`` (kept, reused) or a temporary folder (removed). Run
by hand (about 8 minutes on a 2-core VM), or through `run.py`::

    python benchmarks/many_tags.py                       # 200 and 2,000 tags, both layouts
    python benchmarks/many_tags.py --quick               # 200 tags
    python benchmarks/many_tags.py --tags 2000 --layouts one_file --loaders true
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import time

import numpy as np

from tensorboard_gradients.format.layout import Layout
from tensorboard_gradients.format.writer import GradientWriter

import _common
import route_latency  # the TensorBoard process and the HTTP requests
from route_latency import _loader, _s  # the same cells as its tables

RUN = "many"
PLUGIN = "/data/plugin/gradients/"
TARGET_S = 1.0
LAYOUTS = ("one_file", "file_per_tag")
WRITTEN_JSON = "written.json"  # the write's measurements; written last, so it marks a whole run
FULL = dict(
    tags=(200, 2000),
    steps=3,
    layouts=LAYOUTS,
    loaders=("true", "false"),
    workdir=None,
    repeats=3,
    reload_interval=5,  # TensorBoard's default
    request_timeout=120.0,
    start_timeout=300.0,
)
QUICK = dict(FULL, tags=(200,), repeats=2)

ABOUT = """\
Issue 34: a run of N stats tags (one variable, 3 logged steps each) in a real `tensorboard` on
both loaders (`--load_fast=true`: the Rust data server; `false`: the Python multiplexer). As soon
as the plugin answers at all, the first `runs` is asked (it must list every tag with its steps,
read by the plugin's own scan of the event files, not by TensorBoard), then `runs` again. Two
layouts: `one_file` (one writer, each tag a variable set of its own, all in one event file) and
`file_per_tag` (N writers by summary name, one event file each)."""

HOW_TO_READ = """\
How to read this: seconds to the last byte of the answer. "up" is from TensorBoard's start
until the plugin answers at all; "first runs" is the first `runs` asked right then, "again"
the median of the later ones. Target: the first `runs` under 1 s on either loader ("/ target":
the first runs over 1 s; "Rust / Python": the loaders side by side, each with its own
TensorBoard process). "timeout" is a request that did not answer within the request timeout
(TensorBoard went on computing it until stopped); "listed k of N" an answer missing tags or
steps. The reasons and the end of TensorBoard's log follow the tables."""


# ----------------------------------------------------------------------------- data


def _gradient_of_one(layout):
    """The statistics row of the one-entry gradient ``[1.0]`` in ``layout``'s columns."""
    zero = ("std", "zero_fraction", "nan_count", "inf_count")
    return np.array([[0.0 if stat in zero else 1.0 for stat in layout.stats]], np.float32)


def write_one_file(run_dir, tags, steps):
    """``tags`` stats tags in one event file of ``run_dir`` (the ``one_file`` layout): one
    writer, each tag a variable set of its own. Returns the tags."""
    layouts = [Layout.create([f"layer{i}/kernel"], [(1,)], with_weights=False)
               for i in range(tags)]
    stats = _gradient_of_one(layouts[0])
    # strict: written on this thread, every step; the background queue drops steps when it
    # waits over 0.2 s (a stalled disk), which a loaded machine can take 6,000 quick writes for.
    with GradientWriter(run_dir, strict=True) as writer:
        for step in range(steps):
            written = [writer.write_statistics(step, layout, stats) for layout in layouts]
    return written


def write_file_per_tag(run_dir, tags, steps):
    """``tags`` writers by summary name ``layer<i>``, one event file each, in ``run_dir`` (the
    ``file_per_tag`` layout; each staged apart, see the module). Returns the tags."""
    layout = Layout.create(["kernel"], [(1,)], with_weights=False)
    stats = _gradient_of_one(layout)
    stage = run_dir + ".stage"
    os.makedirs(stage)
    os.makedirs(run_dir)
    written = []
    for i in range(tags):
        with GradientWriter(stage, name=f"layer{i}", strict=True) as writer:
            for step in range(steps):
                tag = writer.write_statistics(step, layout, stats)
        written.append(tag)
        for name in os.listdir(stage):
            os.rename(os.path.join(stage, name), os.path.join(run_dir, name))
    os.rmdir(stage)
    return written


WRITERS = {"one_file": write_one_file, "file_per_tag": write_file_per_tag}


def logdir_for(workdir, layout, tags, steps):
    """``(logdir, written)``: ``<workdir>/many_tags_<layout>_<tags>x<steps>`` holding the run,
    and the write's measurements (reused when an earlier invocation completed it)."""
    logdir = os.path.join(workdir, f"many_tags_{layout}_{tags}x{steps}")
    done = os.path.join(logdir, WRITTEN_JSON)
    if os.path.exists(done):
        with open(done) as f:
            return logdir, dict(json.load(f), reused=True)
    shutil.rmtree(logdir, ignore_errors=True)
    run_dir = os.path.join(logdir, RUN)
    start = time.perf_counter()
    written_tags = WRITERS[layout](run_dir, tags, steps)
    files = os.listdir(run_dir)
    written = {
        "write_s": time.perf_counter() - start,
        "tags": sorted(written_tags),
        "files": len(files),
        "bytes": sum(os.path.getsize(os.path.join(run_dir, name)) for name in files),
    }
    with open(done, "w") as f:
        json.dump(written, f)
    return logdir, written


# ----------------------------------------------------------------------------- measurement


def _ask(tb, route, timeout):
    """``(seconds, decoded JSON)`` of one of the plugin's routes; `RouteError` unless 200."""
    seconds, _, body = route_latency._checked(route_latency.get(tb.base, PLUGIN + route, timeout),
                                              route)
    return seconds, json.loads(body)


def _failure(error, timeout):
    timed_out = (isinstance(error, TimeoutError)
                 or isinstance(getattr(error, "reason", None), TimeoutError))
    return f"timeout after {timeout:g} s" if timed_out else f"{type(error).__name__}: {error}"


def _wait_until_up(tb, timeout):
    """Seconds from TensorBoard's start until the plugin's ``thresholds`` answers."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if tb.process.poll() is not None:
            raise route_latency.RouteError(f"tensorboard exited with {tb.process.returncode}")
        try:
            _ask(tb, "thresholds", 5)
            return time.perf_counter() - tb.started
        except (route_latency.RouteError, OSError):
            time.sleep(0.1)
    raise route_latency.RouteError(f"the plugin did not answer within {timeout:g} s")


def _listed(answer, tags, steps):
    """How many of ``tags`` the ``runs`` answer lists with ``steps`` logged steps."""
    listed = answer.get(RUN, {})
    return sum(listed.get(tag, {}).get("steps") == steps for tag in tags)


def measure(settings, workdir, layout, tags, load_fast):
    logdir, written = logdir_for(workdir, layout, tags, settings["steps"])
    row = {"layout": layout, "tags": tags, "load_fast": load_fast, "written": written}
    timeout = settings["request_timeout"]
    log_path = os.path.join(workdir, f"tensorboard_many_tags_{layout}_{tags}_fast-{load_fast}.log")
    # "scalars=1000" is TensorBoard's own default: it changes nothing here.
    with route_latency.TensorBoard(logdir, load_fast, "scalars=1000", settings["reload_interval"],
                                   log_path) as tb:
        try:
            row["up_s"] = _wait_until_up(tb, settings["start_timeout"])
            row["first_s"], answer = _ask(tb, "runs", timeout)
            row["listed"] = _listed(answer, written["tags"], settings["steps"])
            row["again_s"] = statistics.median(
                _ask(tb, "runs", timeout)[0] for _ in range(settings["repeats"]))
        except (route_latency.RouteError, OSError) as error:
            row["error"] = _failure(error, timeout)
            row["log_tail"] = tb.log_tail()
    return row


def collect(settings):
    """{"config", "rows": one per layout, size and loader}; a failed row has an ``"error"``."""
    config, workdir = _common.started(settings, "many_tags")
    print(f"many tags: workdir {workdir}; plugin from {config['plugin']}", flush=True)
    rows = []
    try:
        for layout in settings["layouts"]:
            for tags in settings["tags"]:
                for load_fast in settings["loaders"]:
                    print(f"-- {layout}, {tags:,} tags, load_fast={load_fast} ...", flush=True)
                    rows.append(measure(settings, workdir, layout, tags, load_fast))
                    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                                      for k, v in rows[-1].items()
                                      if k not in ("log_tail", "written")}), flush=True)
    finally:
        if not settings["workdir"]:
            shutil.rmtree(workdir, ignore_errors=True)
    return {"config": config, "rows": rows}


# ----------------------------------------------------------------------------- report


def render(result):
    c, rows = result["config"], result["rows"]
    return "\n".join([
        f"{c['steps']} logged steps per tag; `--reload_interval {c['reload_interval']}`; "
        f"{c['repeats']} later `runs` per loader; request timeout {c['request_timeout']:g} s; "
        f"{c['available_gib']:.1f} GiB memory available at the start; plugin from "
        f"{c['plugin']}.",
        "",
        "The runs as written (`GradientWriter.write_statistics`):",
        "",
        _written_table(rows),
        "",
        "The plugin's `runs`, s (each loader in its own TensorBoard process):",
        "",
        _runs_table(rows),
    ] + [_common.error_details(f"{r['layout']}, {r['tags']:,} tags, {_loader(r)}", r["error"],
                               r.get("log_tail", ""))
         for r in rows if "error" in r])


def _by_case(rows):
    """``{(layout, tags): {load_fast: row}}`` in the order measured."""
    cases = {}
    for r in rows:
        cases.setdefault((r["layout"], r["tags"]), {})[r["load_fast"]] = r
    return cases


def _written_table(rows):
    cells = []
    for (layout, tags), by_loader in _by_case(rows).items():
        w = next(iter(by_loader.values()))["written"]
        write = _s(w["write_s"]) + (" (reused)" if w.get("reused") else "")
        cells.append([layout, f"{tags:,}", f"{w['files']:,}", f"{w['bytes'] / 1e6:.1f}", write])
    return _common.table(["layout", "tags", "event files", "MB", "write s"], cells,
                         text_columns=1)


def _runs_table(rows):
    headers = ["layout", "tags"]
    for name in ("Rust", "Python"):
        headers += [f"{name}: up", f"{name}: first runs", f"{name}: again",
                    f"{name}: first / target"]
    headers.append("first runs: Rust / Python")
    cells = []
    for (layout, tags), by_loader in _by_case(rows).items():
        line = [layout, f"{tags:,}"]
        for load_fast in ("true", "false"):
            r = by_loader.get(load_fast, {})
            first = r.get("first_s")
            line += [_s2(r.get("up_s")), _first_cell(r), _s2(r.get("again_s")),
                     _common.ratio(first, TARGET_S)]
        line.append(_common.ratio(by_loader.get("true", {}).get("first_s"),
                                  by_loader.get("false", {}).get("first_s")))
        cells.append(line)
    return _common.table(headers, cells, text_columns=1)


def _first_cell(r):
    if "first_s" not in r:
        return "timeout" if r.get("error", "").startswith("timeout") else (
            "failed" if r else "-")
    cell = _s2(r["first_s"])
    tags = r["tags"]
    return cell if r["listed"] == tags else f"{cell} (listed {r['listed']:,} of {tags:,})"


def _s2(x):
    return "-" if x is None else f"{x:.2f}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tags", type=_common.parse_ints, help="comma-separated tag counts")
    parser.add_argument("--steps", type=int, help="logged steps per tag")
    parser.add_argument("--layouts", type=_common.parse_words,
                        help=f"comma-separated, of {','.join(LAYOUTS)}")
    parser.add_argument("--loaders", type=_common.parse_words,
                        help="--load_fast values: true (Rust data server), false (Python)")
    parser.add_argument("--workdir",
                        help="where runs are generated and kept (default: a temp dir, removed)")
    parser.add_argument("--repeats", type=int, help="later `runs` requests per loader")
    parser.add_argument("--reload_interval", type=int, help="TensorBoard --reload_interval")
    parser.add_argument("--request_timeout", type=float, help="s per request")
    parser.add_argument("--start_timeout", type=float, help="s for the plugin to answer at all")
    args = _common.parse_args(parser, FULL, QUICK)
    # `kill` of this script unwinds through the `with TensorBoard` blocks (which kill the group).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
