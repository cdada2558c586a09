"""What counts as vanishing, exploding, non-finite, dead or badly scaled: the one source of truth.

Pure numpy (no TensorBoard, no TensorFlow). The plugin (heatmap cell classes and alerts), users of
`read_logdir` and the ``tensorboard-gradients diagnose`` CLI all call this package, so a cell drawn
red in the browser, an alert in the panel and a failing CI gate always agree.

Inputs are `GradientSeries` (``values[step, variable, stat]`` in model order, input side first).
Entry points:

* `classify(series, thresholds)` -> ``int8[steps, variables]`` of `CLASSES` codes, one per cell
  (``missing``, ``ok``, ``vanishing``, ``exploding``, ``nonfinite``; later = worse);
* `diagnose(series, **thresholds)` -> ``list[Alert]`` sorted by severity, then first step;
* `analyze(series, thresholds)` -> both at once (the rules run once);
* `AnalysisStream(series, thresholds)` -> the same for a series fed a few steps at a time
  (long and growing runs), in memory bounded by the rules' windows; `analyze` is one feed;
* `lacking(series)` -> the rules that cannot judge it for want of a stat its writer did not
  log (the dead rule needs ``zero_fraction``), and those stats.

The rules and their sources are in `Thresholds`; every threshold can be overridden per call
(``diagnose(series, exploding_norm=100)``) and per HTTP request (``...&exploding_norm=100``).
`PARAMETERS` describes each threshold for a form; `CLASS_DESCRIPTIONS` each class for a tooltip.

Layout. Each rule is one module of ``rules/``: its `Parameter`s (default, label, rationale and
source), the cells it gives a class (`Rule.cells`) and its alerts (`Rule.alerts`), behind the
small interface of ``rule.py``. ``rules/__init__.py`` lists the rules in order; `Thresholds` is
assembled from their parameters (``thresholds.py``). A rule sees the series through an
`Evidence` (``evidence.py``), which computes what rules share once and lets a rule ask for
another's findings (the spike rule leaves vanishing cells out of its history). To add a rule:
a new ``rules/<name>.py`` and one line in ``rules/__init__.py``.

Where to change what:

======================================================  =========================================
to change                                               edit
======================================================  =========================================
a default, its rationale, its form label                the rule's module (its `Parameter`)
what a rule flags or what its alerts say                the rule's module (`cells`, `alerts`)
a new rule (or a new alert kind)                        ``rules/<name>.py`` + ``rules/__init__.py``
the order of rules, kinds and fields                    ``rules/__init__.py``
shared per-series quantities (norms, global norm)       ``evidence.py``
rolling median, z-scores, sustained runs                ``window.py``
alert fields, message layout, sort order                ``alerts.py``
feeding a run in pieces, what each round keeps          ``stream.py`` (rules `keep` their history)
cell classes, their tooltip texts                       ``classes.py`` (and the tab's colours)
threshold validation, parsing, the generated docstring  ``rule.py`` (`Parameter`), ``thresholds.py``
======================================================  =========================================
"""

import dataclasses
from typing import List, Optional

import numpy as np

from tensorboard_gradients.analysis.alerts import SEVERITIES, Alert
from tensorboard_gradients.analysis.classes import (
    CLASS_DESCRIPTIONS, CLASSES, EXPLODING, MISSING, NONFINITE, OK, SPIKE, VANISHING,
)
from tensorboard_gradients.analysis.rule import Parameter, Rule
from tensorboard_gradients.analysis.rules import KINDS, PARAMETERS, RULES, RULES_REVISION, lacking
from tensorboard_gradients.analysis.stream import AnalysisStream
from tensorboard_gradients.analysis.thresholds import Thresholds

__all__ = [
    "CLASSES", "CLASS_DESCRIPTIONS", "MISSING", "OK", "VANISHING", "SPIKE", "EXPLODING",
    "NONFINITE",
    "SEVERITIES", "KINDS", "PARAMETERS", "RULES", "RULES_REVISION", "Parameter", "Rule", "Thresholds", "Alert",
    "Analysis", "AnalysisStream", "classify", "diagnose", "analyze", "lacking",
]


def classify(series, thresholds: Optional[Thresholds] = None) -> np.ndarray:
    """``int8[steps, variables]``: the `CLASSES` code of every logged cell.

    ``nonfinite`` (any NaN/Inf entry) > ``exploding`` (norm above ``exploding_norm``, or a spike
    against the running median) > ``vanishing`` (norm below ``vanishing_norm``, or the variable's
    layer ``depth_ratio`` below the output side, for ``sustain_steps``, until the layer itself
    recovers) > ``ok``; ``missing`` =
    no gradient at that step. See `Thresholds` for the rules' sources.
    """
    return analyze(series, thresholds).classes


def diagnose(series, thresholds: Optional[Thresholds] = None, **overrides) -> List[Alert]:
    """Every finding in one logged series, most urgent first.

    Args:
      series: a `GradientSeries` (from `read_logdir`, or the plugin's data provider).
      thresholds: a `Thresholds` to start from (default: the documented defaults).
      **overrides: `Thresholds` fields to change, e.g. ``diagnose(series, exploding_norm=100)``.

    Returns:
      `Alert` objects sorted by severity (critical, warning, info), then first step, then model
      order. Kinds: ``nonfinite`` (critical; every variable with NaN/Inf, and the message of those
      hit at the run's first non-finite step says so), ``exploding`` (absolute and global norm:
      critical; spikes: warning), ``vanishing`` (absolute floor per variable, depth profile per
      layer: warning), ``dead`` (warning), ``update_ratio`` (info).

    Raises:
      ValueError: an unknown or invalid threshold.
    """
    return analyze(series, thresholds, **overrides).alerts


@dataclasses.dataclass(frozen=True)
class Analysis:
    """`classify` and `diagnose` of one series, computed together (the rules run once)."""

    classes: np.ndarray
    alerts: List[Alert]


def analyze(series, thresholds: Optional[Thresholds] = None, **overrides) -> Analysis:
    """Cell classes and alerts at once: what the plugin serves for the heatmap and the panel.

    The whole series is one feed of an `AnalysisStream` (which a long or growing run is fed a
    few steps at a time, with equal results)."""
    stream = AnalysisStream(series, _limits(thresholds, overrides))
    classes = stream.feed_rows(series, last=True)
    return Analysis(classes, stream.alerts())


def _limits(thresholds, overrides) -> Thresholds:
    try:
        return dataclasses.replace(thresholds or Thresholds(), **overrides)
    except TypeError as error:  # an unknown field name
        raise ValueError(f"{error}; known thresholds: {', '.join(Thresholds.names())}") from None
