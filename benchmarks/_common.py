"""What the benchmarks share: the machine and versions header, settings, markdown tables, formats.

Imports neither TensorFlow nor the plugin, so `run.py` can describe the machine without loading
either (each benchmark runs in its own process).
"""

import argparse
import datetime
import importlib.metadata
import importlib.util
import math
import multiprocessing
import os
import platform
import random
import shutil
import statistics
import subprocess
import tempfile
import time

# ----------------------------------------------------------------------------- settings


def parse_args(parser, full, quick):
    """Parse with `full` as the defaults, or `quick` under --quick; flags given explicitly win.

    `full` and `quick` are the benchmark's settings dicts (keys = argparse destinations), the same
    ones `run.py` uses, so a script run alone and the report agree on what "quick" means.
    """
    parser.add_argument("--quick", action="store_true", help="the settings of `run.py --quick`")
    parser.set_defaults(**full)
    if parser.parse_known_args()[0].quick:
        parser.set_defaults(**quick)
    return parser.parse_args()


def settings_from(args, full):
    return {key: getattr(args, key) for key in full}


def parse_sizes(text):
    """``"100x1000,1000x10000"`` -> ``((100, 1000), (1000, 10000))`` (variables x steps)."""
    return tuple(tuple(int(n) for n in item.lower().split("x")) for item in text.split(","))


def parse_ints(text):
    return tuple(int(n) for n in text.split(","))


def parse_words(text):
    return tuple(word.strip() for word in text.split(","))


# ----------------------------------------------------------------------------- machine


def _proc_field(path, prefix):
    """The rest of the first line of `path` starting with `prefix`, or None (not Linux)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefix):
                    return line[len(prefix):].strip(" \t:\n")
    except OSError:
        pass
    return None


def meminfo_gib(field):
    """A /proc/meminfo field (MemTotal, MemAvailable) in GiB; inf where there is no /proc."""
    value = _proc_field("/proc/meminfo", field)
    return int(value.split()[0]) / 2**20 if value else float("inf")


def cpu_model():
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def operating_system():
    try:
        name = platform.freedesktop_os_release()["PRETTY_NAME"]
    except (OSError, KeyError):
        name = platform.system()
    return f"{name}, kernel {platform.release()}, {platform.machine()}"


def gpus():
    """GPU names from nvidia-smi, or "none" (the TensorFlow benchmarks also list TF's devices)."""
    if not shutil.which("nvidia-smi"):
        return "none"
    names = _command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    return ", ".join(names.splitlines()) if names else "none (nvidia-smi lists no GPU)"


def chromium_executable():
    """Debian's Chromium, which the frontend benchmark drives (Playwright downloads no browser)."""
    return shutil.which("chromium")


def chromium_version():
    executable = chromium_executable()
    if not executable:
        return "not installed"
    # Debian's wrapper script prints shell noise on stderr; the version is the stdout line.
    return _command_output([executable, "--version"]) or "unknown"


def _command_output(command):
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def package_version(*distributions):
    """Version of the first installed distribution of `distributions`, with its name if not the
    first (``tensorflow`` may be installed as ``tensorflow-cpu``)."""
    for name in distributions:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return version if name == distributions[0] else f"{version} ({name})"
    return "not installed"


def started(settings, name):
    """(a benchmark's config: ``settings`` with where the plugin comes from and the memory
    available; its working folder: ``settings["workdir"]``, made if new, or a new temporary
    folder named after the benchmark)."""
    config = dict(settings, plugin=plugin_source(), available_gib=meminfo_gib("MemAvailable"))
    workdir = settings["workdir"] or tempfile.mkdtemp(prefix=f"{name}_")
    os.makedirs(workdir, exist_ok=True)
    return config, workdir


def plugin_source():
    """Where `tensorboard_gradients` is imported from (TensorBoard imports it the same way), with
    its git commit and whether the package differs from it, when it is a git checkout."""
    spec = importlib.util.find_spec("tensorboard_gradients")
    if spec is None:
        return "not installed"
    package = os.path.dirname(os.path.abspath(spec.origin))
    try:
        commit = subprocess.run(["git", "-C", package, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", package, "status", "--porcelain", "."],
                               capture_output=True, text=True, check=True).stdout.strip()
        return f"{package} (git {commit}{', with uncommitted changes' if dirty else ''})"
    except (OSError, subprocess.CalledProcessError):
        return package


def environment():
    """Date, machine and versions, as `render_environment` prints them."""
    load_1min = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": meminfo_gib("MemTotal"),
        "gpu": gpus(),
        "os": operating_system(),
        "load_1min": load_1min,
        "python": platform.python_version(),
        "tensorflow": package_version("tensorflow", "tensorflow-cpu", "tensorflow-macos"),
        "keras": package_version("keras"),
        "torch": package_version("torch"),
        "jax": package_version("jax"),
        "tensorboard": package_version("tensorboard"),
        "data_server": package_version("tensorboard-data-server"),
        "numpy": package_version("numpy"),
        "playwright": package_version("playwright"),
        "chromium": chromium_version(),
        "plugin": plugin_source(),
    }


def render_environment(env):
    load = "" if env["load_1min"] is None else f"; load average {env['load_1min']:.2f} at the start"
    return "\n".join([
        f"- Date: {env['date']}",
        f"- Machine: {env['cpu']}, {env['cores']} cores, {env['memory_gib']:.1f} GiB memory, "
        f"GPU: {env['gpu']}{load}",
        f"- OS: {env['os']}",
        f"- Versions: Python {env['python']}, TensorFlow {env['tensorflow']}, "
        f"Keras {env['keras']}, PyTorch {env['torch']}, JAX {env['jax']}, "
        f"TensorBoard {env['tensorboard']} (data server {env['data_server']}), "
        f"numpy {env['numpy']}, Playwright {env['playwright']}, {env['chromium']}",
        f"- Plugin: {env['plugin']}",
    ])


# ----------------------------------------------------------------------------- tables


def table(headers, rows, text_columns=1):
    """A markdown table; the first `text_columns` columns left-aligned, numbers right-aligned."""
    rule = ["---" if i < text_columns else "---:" for i in range(len(headers))]
    lines = [headers, rule] + [[str(cell) for cell in row] for row in rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def ms(seconds):
    """Seconds as milliseconds with about three significant digits: 1,927 / 45.5 / 2.61."""
    if seconds is None:
        return "-"
    value = seconds * 1e3
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def ratio(value, baseline):
    """`value / baseline` with three significant digits and no exponent: 1.18x, 0.0361x, 215x."""
    if value is None or not baseline:
        return "-"
    x = value / baseline
    if x <= 0:
        return f"{x:.3g}x"
    decimals = max(0, 2 - math.floor(math.log10(x)))
    return f"{x:,.{decimals}f}x"


def ratio_range(ratios):
    """Per-round ratios as "min-max" (the spread says how much of a difference is noise)."""
    return f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else f"{ratios[0]:.2f}"


def error_cell(error):
    """An error's first line, fit for a table cell."""
    return "ERROR: " + error.splitlines()[0][:200].replace("|", "\\|")


def error_details(label, error, log_tail):
    """A failed row's full error and the end of its TensorBoard log, under the tables."""
    return f"\n{label}: {error}\n\n```\n--- tensorboard log tail ---\n{log_tail}\n```"


def run_alone(args, full, collect, render, **collect_options):
    """A benchmark script run by itself: the machine header, then its tables."""
    print(render_environment(environment()) + "\n", flush=True)
    print(render(collect(settings_from(args, full), **collect_options)))


# ----------------------------------------------------------------------------- step-time benchmarks
# summary_overhead.py and torch_overhead.py: variants of one training step, timed per batch size.


def rotated(items, round_index):
    """``items`` (a sequence of variants) in this round's order: each round starts one later,
    so no variant always runs first (after the previous round's last one) or last. With a
    fixed order the plain step, timed first, read slower than the one-pass floor, which does
    more (2026-12-06: floor/none 0.93x at the median of 15 rounds)."""
    items = list(items)
    start = round_index % len(items)
    return items[start:] + items[:start]


def writer_settle(monitor):
    """``settle`` for a round of a monitor's variant (`interleaved_step_times`): the jobs its
    writer queued run before the round's clock stops. Its background thread runs them every
    second, longer than a round of 10 steps: they would run in the next variant's round and
    spread one variant's cost over the others (NOTES.md, "Clip and norms below the clip
    recipe")."""
    return lambda: monitor._writer and monitor._writer.flush(upload=False)


def interleaved_step_times(trainers, rounds, steps_per_round, warmup_steps=3,
                           synchronize=lambda: None, settle=None):
    """{name: [seconds per step of each round]} of ``trainers`` ({name: one training step}),
    each warmed up, then timed round by round in turn (`rotated`), so machine noise hits them
    alike. ``synchronize`` waits for the work queued on an accelerator
    (``torch.cuda.synchronize``): called before and after each timed round. ``settle``
    ({name: callable}) finishes a trainer's background work inside its own round (a writer's
    queued jobs, which would otherwise run during the next trainer's round)."""
    settle = settle or {}
    for train_step in trainers.values():
        for _ in range(warmup_steps):
            train_step()
    times = {name: [] for name in trainers}
    for round_index in range(rounds):
        for name, train_step in rotated(trainers.items(), round_index):
            synchronize()
            start = time.perf_counter()
            for _ in range(steps_per_round):
                train_step()
            settle.get(name, lambda: None)()
            synchronize()
            times[name].append((time.perf_counter() - start) / steps_per_round)
    return times


def in_fresh_processes(processes, measure, *args):
    """``measure(*args)`` ({name: [seconds per round]}; picklable, e.g. a `functools.partial`
    of a module's function) run in ``processes`` fresh Python processes one after another, their
    rounds joined in order. Two identical variants of the PyTorch benchmark, each training its
    own copy of one model, read up to 1.2% apart in one process and by another amount in the
    next (each model keeps its memory placement for the life of the process): a ratio near a
    2% target needs the rounds of several processes (NOTES.md, "Clip and norms below the clip
    recipe")."""
    joined = {}
    for _ in range(processes):
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            times = pool.apply(measure, args)
        for name, seconds in times.items():
            joined.setdefault(name, []).extend(seconds)
    return joined


def rows_per_batch(settings, measure, pairs=(), processes=1):
    """Per batch size: the median seconds per step of each variant, ours/none per round and,
    for each ``(variant, baseline)`` of ``pairs``, both one's seconds per step in each round
    (``"pairs"``: ``[[variant, baseline], ...]``).

    `measure(width, batch, features, rounds, steps_per_round)` -> {variant: [seconds per round]},
    with at least the variants "none" and "ours". ``processes`` > 1: the rounds are split among
    that many fresh processes (`in_fresh_processes`; ``"processes"`` in each row).
    """
    rows = []
    for batch in settings["batch"]:
        sizes = (settings["width"], batch, settings["features"],
                 settings["rounds"] // processes, settings["steps_per_round"])
        times = (measure(*sizes) if processes == 1
                 else in_fresh_processes(processes, measure, *sizes))
        rows.append({
            "batch": batch,
            "processes": processes,
            "seconds": {name: statistics.median(t) for name, t in times.items()},
            "ours_per_round": [o / n for o, n in zip(times["ours"], times["none"])],
            "pairs": {f"{a}/{b}": [[x, y] for x, y in zip(times[a], times[b])] for a, b in pairs},
        })
        print(f"batch {batch}: " + ", ".join(
            f"{name} {ms(s)} ms" for name, s in rows[-1]["seconds"].items()), flush=True)
    return rows


def ratio_of_totals(rounds):
    """sum(variant) / sum(baseline) of ``[[variant, baseline], ...]`` seconds per round."""
    return sum(v for v, _ in rounds) / sum(b for _, b in rounds)


def bootstrap_interval(samples, estimate, resamples=2000, seed=0, groups=1):
    """The 90% bootstrap interval of ``estimate(samples)`` (resampled with a fixed seed, so a
    report renders the same twice): how far the estimate itself may be off from noise, where
    the per-round spread says how far one round is. ``groups`` > 1: the samples are that many
    equal runs in a row (processes), resampled first, then the samples within each: a bias
    one run carries through widens the interval."""
    generator = random.Random(seed)
    if groups == 1:
        def resample():
            return generator.choices(samples, k=len(samples))
    else:
        size = len(samples) // groups
        runs = [samples[i:i + size] for i in range(0, len(samples), size)]

        def resample():
            return [sample for run in generator.choices(runs, k=len(runs))
                    for sample in generator.choices(run, k=len(run))]
    estimates = sorted(estimate(resample()) for _ in range(resamples))
    return estimates[int(0.05 * resamples)], estimates[int(0.95 * resamples) - 1]


def target_table(rows, targets):
    """Per batch size and each ``(variant, baseline, target, label)`` of ``targets``: the
    variant's total time over the baseline's (every step counted, so a cadence's rare full and
    histogram steps weigh as they do in training, where the median round would leave out the
    one round in ten that holds a histogram step), its 90% interval (`bootstrap_interval`, the
    processes and their rounds resampled), the median and spread of the per-round ratios, the ratio of totals of
    each process's rounds (`rows_per_batch`'s ``processes``), and whether the target is met:
    "yes" when the whole interval is within it, "estimate only" when the ratio is and the
    interval reaches past it, else "no" (a target None: a ratio reported beside them)."""
    cells = []
    for r in rows:
        for variant, baseline, target, label in targets:
            rounds = r["pairs"][f"{variant}/{baseline}"]
            per_round = [v / b for v, b in rounds]
            overall = ratio_of_totals(rounds)
            low, high = bootstrap_interval(rounds, ratio_of_totals,
                                           groups=r.get("processes", 1))
            each = len(rounds) // r.get("processes", 1)
            per_process = [ratio_of_totals(rounds[i:i + each])
                           for i in range(0, len(rounds), each)]
            cells.append([f"{r['batch']:,}", label, f"{overall:.3f}x",
                          f"{low:.3f}-{high:.3f}", f"{statistics.median(per_round):.3f}x",
                          ratio_range(per_round),
                          ", ".join(f"{ratio:.3f}" for ratio in per_process),
                          "-" if target is None else f"<= {target:.2f}x",
                          "-" if target is None else "yes" if high <= target else
                          "estimate only" if overall <= target else "no"])
    return table(["batch", "what", "all steps", "90% interval", "median round", "per round",
                  "per process", "target", "met"], cells)


def step_time_table(rows, variants, peers, ours=None):
    """Batch, none, each of `variants` {name: header} with its ratio to none, each of `ours`
    {name: label} (default: ``ours``) against each of `peers` {name: header}, and the per-round
    spread of ours/none."""
    ours = ours or {"ours": "ours"}
    headers = (["batch", "none"] + list(variants.values())
               + [f"{label} vs {header}" for label in ours.values() for header in peers.values()]
               + ["ours / none per round"])
    cells = []
    for r in rows:
        s = r["seconds"]
        cells.append(
            [f"{r['batch']:,}", ms(s["none"])]
            + [f"{ms(s[v])} ({ratio(s[v], s['none'])})" for v in variants]
            + [ratio(s[o], s[p]) for o in ours for p in peers]
            + [ratio_range(r["ours_per_round"])])
    return table(headers, cells)


def step_time_parser(description):
    """The options both step-time benchmarks take (None: keep the FULL / QUICK setting)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--width", type=int)
    parser.add_argument("--batch", type=parse_ints, help="comma-separated batch sizes")
    parser.add_argument("--features", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--steps_per_round", type=int)
    return parser
