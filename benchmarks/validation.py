"""Validation set of the diagnosis: real models, healthy and sick, with their expected findings.

Each case builds a network from a real package's code or config (Keras applications with
``weights=None``, `transformers.GPT2Config`, torchvision's ResNet-18 layout), trains it on seeded
synthetic data (nothing is downloaded) and logs every step with the project's own monitors
(`tensorboard_gradients.keras.GradientMonitor`, `tensorboard_gradients.torch.GradientMonitor`).
The logdir is read back with `tensorboard_gradients.read_logdir` and judged by
`tensorboard_gradients.analysis.diagnose`, the code path of the tab and the CLI.

Scoring. Alerts of severity warning or critical are scored (info alerts are counted apart). An
alert is a true positive when it matches one of the case's expected findings (`Expect`): one of
its kinds, a subject matching its regex, and its steps overlapping the finding's step range when
one is given; otherwise it is a false positive. A healthy case expects nothing, so every scored
alert there is false. An expected finding marked ``required`` is recalled when some alert
matches it; the others (``required=False``) only excuse secondary alerts that are true but not
the point (the layers before a dead layer also get zero gradients). Precision = TP / (TP + FP)
over every case, recall = recalled required findings / required findings.

Usage::

    python benchmarks/validation.py [--quick] [--cases a,b] [--keep DIR] [--list]

``--keep DIR`` keeps each case's logdir under ``DIR/<case>`` (``tensorboard --logdir DIR``).
"""

import argparse
import collections
import dataclasses
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from typing import Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # validation_models, _common

import _common  # noqa: E402

# ----------------------------------------------------------------------------- what is scored
# Kind sets are data: edit them when the rules' kinds change.
SCORED_SEVERITIES = ("critical", "warning")
EXPLODING = ("exploding", "spike")  # an absolute explosion, or a jump against the running median
VANISHING = ("vanishing",)
DEAD = ("dead",)
NONFINITE = ("nonfinite",)
NEVER_UPDATED = ("never_updated",)
MODEL = "(model)"  # the subject of whole-model alerts (the global norm), for patterns


@dataclasses.dataclass(frozen=True)
class Expect:
    """One expected finding: an alert of one of ``kinds`` whose subject (its variable, else its
    layer, else ``(model)``) matches the regex ``subject`` (`re.search`), at steps overlapping
    ``steps`` (first, last; None = open) when given."""

    kinds: Tuple[str, ...]
    subject: str
    steps: Optional[Tuple[Optional[int], Optional[int]]] = None
    required: bool = True  # False: excuses matching alerts, is not itself counted for recall

    def describe(self):
        steps = "" if self.steps is None else (
            f" at steps {self.steps[0] or 1}-{self.steps[1] or 'end'}")
        return f"{'/'.join(self.kinds)} on /{self.subject}/{steps}"

    def matches(self, alert):
        if alert.kind not in self.kinds or not re.search(self.subject, subject_of(alert)):
            return False
        if self.steps is None:
            return True
        first, last = self.steps
        return ((first is None or alert.last_step >= first)
                and (last is None or alert.first_step <= last))


def subject_of(alert):
    return alert.variable or alert.layer or MODEL


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    framework: str  # "keras" (TensorFlow backend) or "torch"
    trainer: str  # a function of validation_models.<framework>_cases
    built_from: str  # the real package code or config it comes from
    what: str  # the network, optimizer and, for a sick case, the fault
    steps: int  # logged optimizer steps in the full set
    quick_steps: Optional[int] = None  # None: not in the quick set
    expect: Tuple[Expect, ...] = ()  # empty: a healthy case
    options: Tuple[Tuple[str, object], ...] = ()  # extra keyword arguments of the trainer

    @property
    def healthy(self):
        return not self.expect


# ----------------------------------------------------------------------------- the cases
CASES = (
    # Healthy: no warning or critical alert is right.
    Case("keras_mobilenet_v3_small", "keras", "mobilenet_v3_small",
         "keras.applications.MobileNetV3Small(weights=None)",
         "32x32x3, 10 classes, batch norm, hard-swish, SE blocks; Adam(1e-3)", 100, 40),
    Case("keras_mobilenet_v2", "keras", "mobilenet_v2",
         "keras.applications.MobileNetV2(weights=None, alpha=0.35)",
         "32x32x3, 10 classes, inverted residuals + batch norm; Adam(1e-3)", 100),
    Case("keras_resnet50_v2", "keras", "resnet50_v2",
         "keras.applications.ResNet50V2(weights=None)",
         "32x32x3, 10 classes, pre-activation residual blocks + batch norm; SGD(0.01, m=0.9)",
         60),
    Case("keras_lstm_text", "keras", "lstm_text",
         "keras.layers.Embedding + LSTM + Dense",
         "text classifier on synthetic keyword tokens (vocabulary 2000, 40 tokens); Adam(1e-3)",
         200, 60),
    Case("torch_resnet18", "torch", "resnet18",
         "torchvision's resnet18 definition (written out, see validation_models/torch_cases.py)",
         "32x32x3, 10 classes; SGD(0.05, m=0.9, wd=5e-4)", 60, 30),
    Case("torch_gpt2", "torch", "gpt2",
         "transformers.GPT2Config / GPT2LMHeadModel",
         "2 blocks, width 64, LayerNorm, tied embeddings, next-token loss on a Markov text; "
         "AdamW(6e-4, wd 0.1), warm-up + cosine, clip 1.0", 200, 60),
    Case("torch_lstm_text", "torch", "lstm_text",
         "torch.nn.Embedding + LSTM + Linear",
         "the Keras LSTM text classifier's twin; Adam(1e-3)", 200, 60),
    # Sick: the findings that must be there (and the secondary ones that are right too).
    Case("keras_deep_sigmoid", "keras", "deep_sigmoid", "keras.layers.Dense(activation='sigmoid')",
         "12 sigmoid layers, Glorot, SGD(0.1): input-side gradients vanish", 60, 30,
         expect=(Expect(VANISHING, r"^sig_0(/|$)"),
                 Expect(VANISHING, r"^sig_1(/|$)"),
                 Expect(VANISHING, r"^sig_([0-9]|10)(/|$)", required=False))),
    Case("torch_deep_sigmoid", "torch", "deep_sigmoid", "torch.nn.Linear + nn.Sigmoid",
         "12 sigmoid layers, PyTorch default init, SGD(0.1): input-side gradients vanish", 60, 30,
         expect=(Expect(VANISHING, r"^fc0(\.|$)"),
                 Expect(VANISHING, r"^fc1(\.|$)"),
                 Expect(VANISHING, r"^fc([0-9]|10)(\.|$)", required=False))),
    # 50 quick steps: the monitor logs the zero fraction at every 10th logged step (its default
    # cadence), and the dead rule needs 5 of them (steps 0-40).
    Case("torch_dead_relu", "torch", "dead_relu", "torch.nn.Linear + nn.ReLU",
         "4-layer ReLU MLP, fc1's bias starts at -10: all its units dead; Adam(1e-3)", 60, 50,
         expect=(Expect(DEAD, r"^fc1\.weight$"),
                 Expect(DEAD, r"^fc1\.bias$"),
                 # Behind a dead layer the gradient is zero too (fc0), and fc2 sees only zeros.
                 Expect(DEAD, r"^(fc0\.|fc2\.weight$)", required=False),
                 Expect(VANISHING, r"^(fc0|fc1|fc2)(\.|$)", required=False))),
    Case("torch_scaled_loss", "torch", "scaled_loss", "torch.nn.Linear + nn.ReLU",
         "4-layer ReLU MLP trained on loss x 1e6 (a loss scale never undone); Adam(1e-3)",
         60, 30,
         expect=(Expect(EXPLODING, r"^\(model\)$"),
                 Expect(EXPLODING, r"^fc0\.weight$"),
                 Expect(EXPLODING, r"^fc3\.weight$"),
                 Expect(EXPLODING, r".", required=False))),
    Case("torch_diverging_lr", "torch", "diverging_lr", "torch.nn.Linear + nn.ReLU",
         "6-layer ReLU MLP, SGD(0.01, m=0.9); from step 40 a broken schedule multiplies the "
         "learning rate by 300: norms climb, then NaN/Inf", 80, 60,
         expect=(Expect(EXPLODING, r".", steps=(40, None)),
                 Expect(NONFINITE, r".", steps=(40, None)),
                 Expect(EXPLODING + NONFINITE, r".", steps=(40, None), required=False))),
    Case("keras_disconnected_branch", "keras", "disconnected_branch",
         "keras.Model (functional) + keras.ops.stop_gradient",
         "two-branch MLP whose second branch reaches the head only through stop_gradient: "
         "branch_a, branch_b never get a gradient; Adam(1e-3)", 60, 30,
         expect=(Expect(NEVER_UPDATED, r"^branch_a/kernel$"),
                 Expect(NEVER_UPDATED, r"^branch_a/bias$"),
                 Expect(NEVER_UPDATED, r"^branch_b/kernel$"),
                 Expect(NEVER_UPDATED, r"^branch_b/bias$"))),
    Case("torch_disconnected_branch", "torch", "resnet18",
         "torchvision's resnet18 definition + an auxiliary classifier never called",
         "ResNet-18 whose aux_classifier (built, never used by forward) gets no gradient; "
         "SGD(0.05, m=0.9, wd=5e-4)", 30, None,
         expect=(Expect(NEVER_UPDATED, r"^aux_classifier\.weight$"),
                 Expect(NEVER_UPDATED, r"^aux_classifier\.bias$")),
         options=(("aux_head", True),)),
)
BY_NAME = {case.name: case for case in CASES}
QUICK_CASES = tuple(case.name for case in CASES if case.quick_steps is not None)

FULL = dict(cases=tuple(BY_NAME), quick=False, keep=None)
QUICK = dict(FULL, cases=QUICK_CASES, quick=True)

ABOUT = """\
Whether the diagnosis (`tensorboard_gradients.analysis.diagnose`, the rules of the tab and the
CLI) is right on real models: healthy networks built from real packages (Keras applications'
MobileNetV2/V3Small and ResNet50V2 with `weights=None`, torchvision's ResNet-18 definition, a
small GPT-2 from `transformers.GPT2Config` trained with AdamW, LSTM text classifiers in Keras
and PyTorch) must get no warning or critical alert; sick ones (deep sigmoid, dead ReLUs, a loss
scaled by 1e6, a learning rate raised 300x mid-run, branches that never get a gradient) must be
flagged at the right variables and steps. Every case trains on seeded synthetic data, logged
every step by the project's own monitors (`GradientMonitor` for Keras and for PyTorch), and its
logdir is read back with `read_logdir`. The cases and their expected findings are the `CASES`
list of `benchmarks/validation.py`."""

HOW_TO_READ = """\
How to read this: a row per case; "expected" is what must be found (an expected finding is a
kind, a regex on the alert's variable, else its layer, else `(model)` for whole-model alerts,
and a step range when given). "alerts" counts the warning and critical alerts by kind; each is a
true positive (TP) when it matches an expected finding, a false positive (FP) otherwise, so every
alert on a healthy case is an FP. "missed" counts required findings that no alert matched (FN).
Info alerts (update ratios) are not scored; they are counted in their own column and listed
below the tables. Precision = TP / all scored alerts; recall = required findings found / all
required findings. The false positives and missed findings are listed with their messages so the
rules can be tuned on them; `python benchmarks/validation.py --keep DIR` keeps the logdirs for
`tensorboard --logdir DIR`."""


# ----------------------------------------------------------------------------- scoring


def score(case, alerts):
    """{"tp": [alert], "fp": [alert], "info": [alert], "missed": [Expect], "required": n}."""
    scored = [a for a in alerts if a.severity in SCORED_SEVERITIES]
    tp = [a for a in scored if any(e.matches(a) for e in case.expect)]
    fp = [a for a in scored if not any(e.matches(a) for e in case.expect)]
    required = [e for e in case.expect if e.required]
    missed = [e for e in required if not any(e.matches(a) for a in scored)]
    return {"tp": tp, "fp": fp, "missed": missed, "required": len(required),
            "info": [a for a in alerts if a.severity not in SCORED_SEVERITIES]}


def totals(rows):
    """Overall TP, FP, found and required findings, precision and recall over scored rows."""
    rows = [r for r in rows if "error" not in r]
    tp = sum(len(r["tp"]) for r in rows)
    fp = sum(len(r["fp"]) for r in rows)
    required = sum(r["required"] for r in rows)
    found = required - sum(len(r["missed"]) for r in rows)
    return {"tp": tp, "fp": fp, "found": found, "required": required,
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": found / required if required else None,
            "healthy_clean": sum(1 for r in rows if r["healthy"] and not r["fp"]),
            "healthy": sum(1 for r in rows if r["healthy"])}


# ----------------------------------------------------------------------------- running


def trainer(case):
    """The case's training function (imports its framework on first use)."""
    if case.framework == "keras":
        from validation_models import keras_cases as module
    elif case.framework == "torch":
        from validation_models import torch_cases as module
    else:
        raise ValueError(f"unknown framework {case.framework!r}")
    return getattr(module, case.trainer)


def read_series(log_dir):
    """The one gradients series the case wrote under ``log_dir``."""
    import tensorboard_gradients as tg

    found = [series for tags in tg.read_logdir(log_dir).values()
             for tag, series in tags.items() if tag == "gradients"]
    if len(found) != 1:
        raise RuntimeError(f"expected one 'gradients' series under {log_dir}, found {len(found)}")
    return found[0]


def run_case(case, log_dir, quick=False):
    """Trains, reads back and diagnoses one case: its row (see `score`), alerts included."""
    from tensorboard_gradients.analysis import diagnose

    steps = case.quick_steps if quick and case.quick_steps else case.steps
    start = time.perf_counter()
    info = trainer(case)(log_dir, steps, **dict(case.options))
    trained = time.perf_counter() - start
    series = read_series(log_dir)
    alerts = diagnose(series)
    row = {"case": case.name, "framework": case.framework, "healthy": case.healthy,
           "steps": len(series.steps), "variables": len(series.variables),
           "parameters": info.get("parameters"), "loss": info.get("loss"),
           "seconds": trained, "alerts": alerts}
    row.update(score(case, alerts))
    return row


def collect(settings):
    """{"config": settings, "rows": one per case (an "error" row when a case failed)}."""
    keep = settings.get("keep")
    root = keep or tempfile.mkdtemp(prefix="validation_")
    rows = []
    start = time.perf_counter()
    try:
        for name in settings["cases"]:
            case = BY_NAME[name]
            log_dir = os.path.join(root, name)
            shutil.rmtree(log_dir, ignore_errors=True)
            try:
                row = run_case(case, log_dir, quick=settings["quick"])
            except Exception:  # one broken case is reported, the others still run
                rows.append({"case": name, "framework": case.framework,
                             "healthy": case.healthy, "error": traceback.format_exc()})
                print(f"{name}: ERROR\n{rows[-1]['error']}", flush=True)
                continue
            rows.append(row)
            print(f"{name}: {row['steps']} steps in {row['seconds']:.0f} s; TP {len(row['tp'])}, "
                  f"FP {len(row['fp'])}, missed {len(row['missed'])}, info "
                  f"{len(row['info'])}", flush=True)
            for alert in row["fp"]:
                print(f"    FP {alert.severity} {alert.kind}/{alert.rule}: {alert.message}",
                      flush=True)
            for expect in row["missed"]:
                print(f"    missed: {expect.describe()}", flush=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    config = {key: value for key, value in settings.items() if key != "keep"}
    config["seconds"] = time.perf_counter() - start
    return {"config": config, "rows": rows}


# ----------------------------------------------------------------------------- report


def _by_kind(alerts):
    counts = collections.Counter(a.kind for a in alerts)
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "-"


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _percent(value):
    return "-" if value is None else f"{value:.1%}"


def _alert_line(case, alert):
    return (f"- `{case}` {alert.severity} `{alert.kind}`/`{alert.rule}`: "
            f"{_cell(alert.message)}")


def render(result):
    c = result["config"]
    rows = result["rows"]
    t = totals(rows)
    intro = (
        f"{'Quick' if c['quick'] else 'Full'} settings: {len(rows)} cases, "
        f"{_seconds(c['seconds'])}"
        " in all (training, reading back and diagnosis). Scored: warning and critical alerts; "
        f"**precision {_percent(t['precision'])}** ({t['tp']} true of {t['tp'] + t['fp']} "
        f"alerts), **recall {_percent(t['recall'])}** ({t['found']} of {t['required']} required "
        f"findings); {t['healthy_clean']} of {t['healthy']} healthy cases without a scored "
        "alert.")
    headers = ["case", "built from", "what", "steps", "expected", "alerts (warning+)", "TP",
               "FP", "missed", "info alerts", "loss first -> last", "train s"]
    cells = []
    for r in rows:
        case = BY_NAME[r["case"]]
        expected = ("nothing (healthy)" if case.healthy else
                    "; ".join(e.describe() for e in case.expect if e.required))
        if "error" in r:
            cells.append([r["case"], _cell(case.built_from), _cell(case.what), "-",
                          _cell(expected),
                          _cell(_common.error_cell(r["error"].strip().splitlines()[-1])),
                          "-", "-", "-", "-", "-", "-"])
            continue
        loss = r.get("loss")
        cells.append([
            f"`{r['case']}`", _cell(f"`{case.built_from}`"), _cell(case.what), r["steps"],
            _cell(expected), _by_kind(r["tp"] + r["fp"]), len(r["tp"]), len(r["fp"]),
            len(r["missed"]), _by_kind(r["info"]),
            "-" if not loss else f"{loss[0]:.3g} -> {loss[1]:.3g}", f"{r['seconds']:.0f}"])
    parts = [intro, _common.table(headers, cells, text_columns=6)]
    fps = [_alert_line(r["case"], a) for r in rows if "error" not in r for a in r["fp"]]
    parts.append("**False positives** (scored alerts that match no expected finding):\n\n"
                 + ("\n".join(fps) if fps else "none"))
    missed = [f"- `{r['case']}`: {e.describe()}" for r in rows if "error" not in r
              for e in r["missed"]]
    parts.append("**Missed findings** (required, matched by no alert):\n\n"
                 + ("\n".join(missed) if missed else "none"))
    info = [_alert_line(r["case"], a) for r in rows if "error" not in r for a in r["info"]]
    parts.append("**Info alerts** (not scored):\n\n" + ("\n".join(info) if info else "none"))
    errors = [f"`{r['case']}`:\n\n```text\n{r['error'].strip()}\n```" for r in rows
              if "error" in r]
    if errors:
        parts.append("**Failed cases:**\n\n" + "\n\n".join(errors))
    return "\n\n".join(parts)


def _seconds(seconds):
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def main(argv: Sequence[str] = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=_common.parse_words,
                        help=f"comma-separated subset of {','.join(BY_NAME)}")
    parser.add_argument("--keep", help="keep each case's logdir under KEEP/<case>")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = _common.parse_args(parser, FULL, QUICK)
    if args.list:
        for case in CASES:
            print(f"{case.name:28} {'healthy' if case.healthy else 'sick':8} "
                  f"{case.steps:4} steps, quick {case.quick_steps or '-'}: {case.built_from}")
        return
    unknown = [name for name in args.cases if name not in BY_NAME]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    _common.run_alone(args, FULL, collect, render)


if __name__ == "__main__":
    main()
