"""Runs every benchmark and rewrites RESULTS.md: machine, versions, one section per benchmark.

    python benchmarks/run.py [--quick] [--only NAME[,NAME]] [--output PATH] [--workdir DIR]

With ``--only``, an existing report keeps its other sections: the benchmarks rerun replace
their own sections (each then says when and on what it was rerun). Each benchmark runs in a
fresh process, so TensorFlow's state, memory and a crash of one stay out
of the others; a benchmark that fails is reported in its section and the others still run, and the
exit status is 1. `--quick` takes each benchmark's quick settings (small sizes, few rounds: a
smoke run of a few minutes whose numbers are noisy); the same settings are `--quick` of each
script run alone. The hand-written background lives in NOTES.md, which RESULTS.md links.
"""

import argparse
import importlib
import multiprocessing
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import NamedTuple

import _common

HERE = os.path.dirname(os.path.abspath(__file__))
NOTES = os.path.join(HERE, "NOTES.md")
# Run in this order; the titles head the sections of RESULTS.md.
BENCHMARKS = {
    "summary_overhead": "Summary op overhead per training step (TF custom loop)",
    "keras_overhead": "Keras `GradientMonitor` in `model.fit`",
    "keras_first_fit": "Keras `GradientMonitor`: the first `model.fit`, tracing included",
    "torch_overhead": "PyTorch `GradientMonitor` in an eager training loop",
    "sharded_overhead": "PyTorch `GradientMonitor` under FSDP2 (2 CPU ranks)",
    "transformer_overhead": "Transformer-shaped models: cost per tensor, against the one-pass floor",
    "route_latency": "Route latency in a real TensorBoard",
    "long_run": "Long runs and big models: 1,000 tensors x 100,000 steps",
    "bucket_reads": "A long run in a bucket: S3 and GCS on loopback against the directory",
    "many_tags": "Many tags: the first `runs` answer at 2,000 tags",
    "frontend_paint": "Gradients tab in Chromium",
    "validation": "Diagnosis validation set: real models, healthy and sick",
    "early_warning": "Early warning: loss spikes warned ahead, healthy runs left alone",
}


def run_benchmark(name, quick, workdir):
    """In the benchmark's own process: (section body in markdown, errors of failed rows)."""
    module = importlib.import_module(name)
    settings = dict(module.QUICK if quick else module.FULL)
    if "workdir" in settings:  # the benchmarks that generate logdirs share them
        settings["workdir"] = workdir
    result = module.collect(settings)
    errors = [row["error"] for row in result["rows"] if "error" in row]
    return "\n\n".join([module.ABOUT, module.render(result), module.HOW_TO_READ]), errors


def run_isolated(name, quick, workdir):
    """`run_benchmark` in a fresh interpreter (spawn: nothing of this process is inherited)."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(run_benchmark, name, quick, workdir).result()


class Section(NamedTuple):
    name: str
    status: str
    took: str
    failed: bool
    text: str


def section(name, quick, workdir):
    """Runs one benchmark; its section of RESULTS.md, failed or not."""
    print(f"== {name}{' (quick)' if quick else ''} ...", flush=True)
    start = time.perf_counter()
    try:
        body, errors = run_isolated(name, quick, workdir)
        failed = bool(errors)
        status = f"{len(errors)} measurement(s) failed, see below" if errors else "ok"
    except Exception as error:  # an exception in the benchmark, or its process died
        failed = True
        body = f"**Failed:**\n\n```text\n{_traceback(error).strip()}\n```"
        status = f"failed: {type(error).__name__}"
    took = _duration(time.perf_counter() - start)
    print(f"== {name}: {status} ({took})", flush=True)
    text = f"## {BENCHMARKS[name]}\n\n`benchmarks/{name}.py`, took {took}.\n\n{body}"
    return Section(name, status, took, failed, text)


def _traceback(error):
    """The benchmark process's own traceback (it arrives as the cause), else this process's."""
    if isinstance(error, BrokenProcessPool):
        return (f"{error}\nThe benchmark's process died (a crash, or killed: out of memory?); "
                "its last output is in this run's log.")
    remote = getattr(error.__cause__, "tb", None)
    if remote:
        return remote.strip().strip('"')  # concurrent.futures wraps it in triple quotes
    return "".join(traceback.format_exception(error))


def header(env, quick, took, sections, notes_link):
    kind = ("**Quick run**: small sizes and few rounds, a smoke run whose numbers are noisy; "
            "the full run is `python benchmarks/run.py`." if quick else
            "Full run (`--quick` gives a few-minute smoke run).")
    return "\n\n".join([
        "# Benchmark results",
        f"Written by `benchmarks/run.py` on {env['date']} in {_duration(took)}; do not edit by "
        f"hand, rerun it (the sections below come from each benchmark's script). {kind} "
        f"Background, optimisation history and known misses: [NOTES.md]({notes_link}).",
        "## Machine and versions",
        _common.render_environment(env) + f"\n- Command: `{_command_line()}`"
        + f" ({'quick' if quick else 'full'} run)",
        _common.table(["benchmark", "result", "took"],
                      [[s.name, s.status, s.took] for s in sections], text_columns=2),
    ])


def spliced(report, sections, env, quick):
    """``report`` (an earlier RESULTS.md) with ``sections`` (benchmarks rerun alone with
    ``--only``) in place of theirs, or appended; each says when, on what and how it was rerun,
    and the table at the top points to it. The other sections stay as they were."""
    for rerun in sections:
        heading = f"## {BENCHMARKS[rerun.name]}\n"
        title, body = rerun.text.split("\n\n", 1)
        text = "\n\n".join([
            title,
            f"_Rerun alone ({'quick' if quick else 'full'} settings): `{_command_line()}`, "
            "on this machine:_",
            _common.render_environment(env),
            body,
        ]) + "\n\n"
        start = report.find(heading)
        if start < 0:
            report = report.rstrip("\n") + "\n\n" + text
        else:
            end = report.find("\n## ", start + len(heading))
            report = report[:start] + text + ("" if end < 0 else report[end + 1:])
        line = (f"| {rerun.name} | {rerun.status} (rerun alone {env['date']}, see its "
                f"section) | {rerun.took} |")
        row = re.compile(rf"^\| {re.escape(rerun.name)} \|.*$", re.M)
        if row.search(report):
            report = row.sub(line, report, count=1)
        else:  # a benchmark newer than the report: a row at the end of the table at the top
            table = re.search(r"^\| benchmark \| result \| took \|\n(?:\|.*\n)*", report, re.M)
            if table:
                report = report[:table.end()] + line + "\n" + report[table.end():]
    return report


def _command_line():
    return " ".join(shlex.quote(a) for a in ["python"] + sys.argv)


def _duration(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def _selected(only):
    if not only:
        return list(BENCHMARKS)
    names = _common.parse_words(only)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(
            f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return [n for n in BENCHMARKS if n in names]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds (minutes)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    parser.add_argument("--output", default=os.path.join(HERE, "RESULTS.md"),
                        help="the report to (re)write (default: benchmarks/RESULTS.md)")
    parser.add_argument("--workdir", help="generated logdirs are kept here and reused "
                                          "(default: a temporary folder, removed)")
    args = parser.parse_args()
    names = _selected(args.only)
    env = _common.environment()  # first, so its load average is what else keeps the CPUs busy
    workdir = args.workdir or tempfile.mkdtemp(prefix="benchmarks_")
    start = time.perf_counter()
    try:
        sections = [section(name, args.quick, workdir) for name in names]
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    # The sections link NOTES.md relative to benchmarks/; keep the links right elsewhere too.
    notes_link = os.path.relpath(NOTES, os.path.dirname(os.path.abspath(args.output)))
    sections = [s._replace(text=s.text.replace("](NOTES.md", f"]({notes_link}"))
                for s in sections]
    if args.only and os.path.exists(args.output):
        with open(args.output) as f:
            text = spliced(f.read(), sections, env, args.quick)
    else:
        text = "\n\n".join(
            [header(env, args.quick, time.perf_counter() - start, sections, notes_link)]
            + [s.text for s in sections])
    with open(args.output, "w") as f:
        f.write(text.rstrip("\n") + "\n")
    failed = [s.name for s in sections if s.failed]
    print(f"wrote {args.output}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
