"""Early warning: do the alerts come before the loss spikes, and stay silent on healthy runs?

Trains the instability set (`instability/cases.py`: runs that blow up as the literature reports,
and healthy controls of the same shapes; PyTorch on CPU, seeded) with the PyTorch
`GradientMonitor`, reads each run back with `tensorboard_gradients.read_logdir` and scores, on the
same logs: the project's alerts (`analysis.diagnose`, warning and critical; each raised at its
``raised_step``, the first step the analysis fed step by step raises it), and two published
detectors on the logged global gradient norm (`instability/references.py`: ZClip-like,
OLMo-like). Loss spikes are labelled from the logged loss (`instability/labels.py`) and alarms
scored against their onsets (`instability/scoring.py`). The tune half and the held-out half are
reported apart: the rules' defaults were chosen on the tune half (NOTES.md says where a
held-out control moved one within the tune half's plateau).

Usage::

    python benchmarks/early_warning.py [--quick] [--cases a,b] [--seeds 0,1,2] [--keep DIR]

``--keep DIR`` trains into ``DIR/<case>`` (``DIR/<case>_seed<k>`` for a seed k other than 0)
once and reuses what is there on later runs (``tensorboard --logdir DIR`` shows them).
``--seeds`` trains every case with each seed (the data, the initialisation and the batches
change; the recipe does not): more onsets for the same rules, so a recall measured on a few
dozen spikes is less a matter of one seed's luck.
"""

import argparse
import os
import sys
import tempfile
import time
from typing import Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # instability, _common

import _common  # noqa: E402
from instability import cases as instability_cases  # noqa: E402
from instability import labels, references, scoring  # noqa: E402

SCORED_SEVERITIES = ("critical", "warning")
DETECTORS = ("ours", "zclip", "olmo")

FULL = dict(cases=tuple(instability_cases.BY_NAME), quick=False, keep=None, seeds=(0,))
QUICK = dict(FULL, cases=tuple(c.name for c in instability_cases.CASES
                               if c.quick_steps is not None), quick=True)

ABOUT = __doc__.split("\n\n")[1].replace("\n", " ")

HOW_TO_READ = """\
How to read this: a row per case and detector. "onsets": loss-spike episodes (loss not finite or
above 3x the median of the previous 50 steps; spiking steps under 20 apart are one episode).
"warned": onsets with an alarm 1-20 steps before them, and the leads (steps) of those. Alarms
within 10 steps of each other count once; "followed": alarms with an onset 1-20 steps later,
"at spike": alarms raised inside an episode, "false": the others (every alarm on a healthy
control). Precision = followed / (followed + false). Targets (issue 35): recall >= 0.8,
precision >= 0.8, no alarm on a healthy control, better than both references."""


def read_run(run_dir):
    """(gradient series, steps, losses) of one trained case."""
    import tensorboard_gradients as tg
    from tensorboard_gradients.format import event_files

    runs = tg.read_logdir(run_dir)
    series = runs["."]["gradients"] if "." in runs else next(iter(runs.values()))["gradients"]
    losses = {}
    for name in sorted(os.listdir(run_dir)):
        if event_files.is_event_file(name):
            for event in event_files.read_events(os.path.join(run_dir, name)):
                for value in event.summary.value:
                    if value.tag == "loss":
                        losses[event.step] = (value.simple_value if value.HasField("simple_value")
                                              else float(value.tensor.float_val[0]))
    steps = sorted(losses)
    return series, np.array(steps), np.array([losses[s] for s in steps])


def alarms_of(detector, series):
    """The steps ``detector`` raises an alarm at."""
    import tensorboard_gradients as tg

    if detector == "ours":
        return [getattr(a, "raised_step", a.first_step) for a in tg.diagnose(series)
                if a.severity in SCORED_SEVERITIES]
    # The norm `clip_grad_norm_` returns: NaN at a step where any gradient held NaN/Inf (the
    # logged l2_norm covers finite entries only).
    norms = np.sqrt(np.nansum(series.stat("l2_norm").astype(np.float64) ** 2, axis=1))
    nonfinite = (series.stat("nan_count") + series.stat("inf_count") > 0).any(axis=1)
    norms[nonfinite] = np.nan
    detect = references.zclip_alarms if detector == "zclip" else references.olmo_alarms
    return detect(series.steps, norms)


def collect(settings):
    """{"config": settings, "rows": one per case and detector}."""
    root = settings.get("keep") or tempfile.mkdtemp(prefix="early_warning_")
    rows = []
    for name, seed in [(n, s) for n in settings["cases"] for s in settings["seeds"]]:
        case = instability_cases.BY_NAME[name]
        run_dir = os.path.join(root, name if seed == 0 else f"{name}_seed{seed}")
        label = name if len(settings["seeds"]) == 1 else f"{name} (seed {seed})"
        started = time.perf_counter()
        try:
            if not os.path.isdir(run_dir):
                instability_cases.train(case, run_dir,
                                        case.quick_steps if settings["quick"] else case.steps,
                                        seed=seed)
            series, steps, losses = read_run(run_dir)
            episodes = labels.episodes(steps, losses)
            for detector in DETECTORS:
                rows.append(dict(case=label, half=case.half, sick=case.sick, detector=detector,
                                 steps=len(steps), episodes=episodes,
                                 score=scoring.score(episodes, alarms_of(detector, series)),
                                 seconds=time.perf_counter() - started))
        except Exception as error:  # reported in its row; the other cases still run
            rows.append(dict(case=label, half=case.half, sick=case.sick, detector="-",
                             error=f"{type(error).__name__}: {error}"))
    return {"config": {**settings, "root": root}, "rows": rows}


def _fraction(value):
    return "-" if value != value else f"{value:.2f}"


def totals(rows, half=None):
    """{detector: (sick Score, alarms on healthy controls)} over ``half`` (None: all)."""
    result = {}
    for detector in DETECTORS:
        sick, healthy_alarms = scoring.Score(), 0
        for row in rows:
            if row.get("detector") != detector or (half and row["half"] != half):
                continue
            if row["sick"]:
                sick = sick.add(row["score"])
            else:
                healthy_alarms += row["score"].followed + row["score"].at_spike + row["score"].false
        result[detector] = (sick, healthy_alarms)
    return result


def render(result):
    rows = result["rows"]
    lines = []
    for half in (instability_cases.TUNE, instability_cases.HELD_OUT, None):
        lines.append(f"**{'all cases' if half is None else half.replace('_', '-') + ' half'}**")
        table = []
        for detector, (sick, healthy) in totals(rows, half).items():
            leads = sick.leads
            table.append([detector, f"{sick.warned}/{sick.onsets}", _fraction(sick.recall),
                          _fraction(sick.precision), str(sick.followed), str(sick.at_spike),
                          str(sick.false), str(healthy),
                          f"{int(np.median(leads))} ({min(leads)}-{max(leads)})" if leads else "-"])
        lines.append(_common.table(["detector", "warned", "recall", "precision", "followed",
                                    "at spike", "false (sick)", "alarms (healthy)",
                                    "lead median (range)"], table))
    per_case = []
    for row in rows:
        if "error" in row:
            per_case.append([row["case"], row["half"], "sick" if row["sick"] else "healthy", "-",
                             _common.error_cell(row["error"])] + [""] * 5)
            continue
        s = row["score"]
        per_case.append([row["case"], row["half"], "sick" if row["sick"] else "healthy",
                         row["detector"], str(row["steps"]),
                         " ".join(str(o) for o, _ in row["episodes"]) or "-",
                         f"{s.warned}/{s.onsets}", " ".join(map(str, s.leads)) or "-",
                         f"{s.followed}/{s.at_spike}/{s.false}", f"{row['seconds']:.0f} s"])
    lines.append("**per case**")
    lines.append(_common.table(["case", "half", "kind", "detector", "steps", "onsets", "warned",
                                "leads", "followed/at spike/false", "train+read"], per_case,
                               text_columns=4))
    return "\n\n".join(lines)


def main(argv: Sequence[str] = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=_common.parse_words,
                        help=f"comma-separated subset of {','.join(instability_cases.BY_NAME)}")
    parser.add_argument("--seeds", type=_common.parse_words,
                        help="comma-separated seeds to train every case with (default 0)")
    parser.add_argument("--keep", help="train into DIR/<case> once, reuse it afterwards")
    args = _common.parse_args(parser, FULL, QUICK)
    settings = _common.settings_from(args, FULL)
    if args.cases:
        settings["cases"] = tuple(args.cases)
    if args.keep:
        settings["keep"] = args.keep
    if args.seeds:
        settings["seeds"] = tuple(int(seed) for seed in args.seeds)
    result = collect(settings)
    print(render(result))
    print()
    print(HOW_TO_READ)


if __name__ == "__main__":
    main()
