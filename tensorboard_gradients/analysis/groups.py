"""Alerts read as findings: `group` gathers the alerts of one rule over one stretch of steps
("17 of 18 tensors exploded at steps 31-32, first dense_00/kernel"), most urgent first.

A diverging run raises one alert per tensor per rule; the tab's panel, the CLI and users of
`diagnose` read its groups first and expand one to its alerts. Pure: it needs the alerts and
how many variables and layers the model has.
"""

import dataclasses
from typing import Dict, List, Sequence

from tensorboard_gradients.analysis.alerts import SEVERITIES, Alert

# What each rule's alerts say together, in the plural ("17 of 18 tensors <phrase>"), with
# their ``threshold``. Keyed by (kind, rule), as `Alert` names them; a rule missing here reads
# "were flagged by the <rule> rule".
_PHRASES = {
    ("nonfinite", "count"): "had NaN/Inf entries",
    ("exploding", "absolute"): "exploded (norm above {threshold:g})",
    ("spike", "spike"): "spiked against their running median (robust z-score above "
                        "{threshold:g})",
    ("vanishing", "absolute"): "vanished (norm below {threshold:g})",
    ("vanishing", "depth"): "vanished (below {threshold:g}x the output-side layers' norm)",
    ("dead", "zero_fraction"): "were dead (at least {threshold:.0%} of their gradient entries "
                               "exactly zero)",
    ("never_updated", "no_gradient"): "never received a gradient",
    ("update_ratio", "update/weight"): "had a median update/weight ratio outside the healthy "
                                       "band",
    # Whole-model findings: one per episode, never several subjects.
    ("loss_spike", "precursor"): "had the loss climbing with the gradient",
    ("loss_spike", "update"): "had the optimizer's update jump above its running median",
    ("loss_spike", "sustained"): "had the loss above its band with the gradient raised for several "
                                 "steps",
    ("loss_spike", "jump"): "had a gradient jump the loss felt",
    ("loss_spike", "spike"): "had a loss spike",
}


@dataclasses.dataclass(frozen=True)
class AlertGroup:
    """The alerts of one rule whose steps overlap: one finding about several subjects.

    ``alerts`` are indices into the list `group` was given; ``subjects`` how many variables
    (or layers, or the whole model) they name, of ``of`` in the model; ``first`` the subject
    hit first (model order breaks ties); ``raised_step`` the earliest of their
    `Alert.raised_step`: when a monitor watching the run could first have told.
    """

    kind: str
    rule: str
    severity: str
    first_step: int
    last_step: int
    subjects: int
    of: int
    unit: str  # "tensor", "layer" or "model"
    first: str
    message: str
    alerts: List[int]
    raised_step: int

    def to_json(self) -> Dict:
        return dataclasses.asdict(self)


def group(alerts: Sequence[Alert], variables: Sequence[str],
          layers: Sequence[str]) -> List[AlertGroup]:
    """The groups of ``alerts`` (sorted as `diagnose` sorts them: a group's first alert is
    its earliest), most urgent first.

    Alerts of the same kind, rule and severity belong together while their step ranges
    overlap one another's (in first-step order): a NaN from step 33 on every tensor is one
    group; spikes at steps 300 and 777 are two. Groups sort by severity, then first step, then
    the order of their first alert.
    """
    ordered = sorted(range(len(alerts)), key=lambda i: (
        alerts[i].kind, alerts[i].rule, alerts[i].severity, alerts[i].first_step, i))
    clusters: List[List[int]] = []
    for index in ordered:
        alert = alerts[index]
        if clusters:
            last = alerts[clusters[-1][0]]
            reach = max(alerts[i].last_step for i in clusters[-1])
            if ((last.kind, last.rule, last.severity) == (alert.kind, alert.rule, alert.severity)
                    and alert.first_step <= reach):
                clusters[-1].append(index)
                continue
        clusters.append([index])
    found = [_group(alerts, sorted(cluster), len(set(variables)), len(dict.fromkeys(layers)))
             for cluster in clusters]
    rank = {severity: i for i, severity in enumerate(SEVERITIES)}
    return sorted(found, key=lambda g: (rank[g.severity], g.first_step, g.alerts[0]))


def subject_name(unit: str, name: str) -> str:
    """A group's subject as its message names it: a tensor by its name, a layer as "layer
    <name>", as each alert's own message names it (an ``nn.Sequential``'s layers are "0", "1"...:
    "first 0." read as a number)."""
    return f"layer {name}" if unit == "layer" else name


def _group(alerts, members, variable_count, layer_count) -> AlertGroup:
    chosen = [alerts[i] for i in members]
    head = chosen[0]  # `diagnose` order: the earliest, then model order
    if head.variable is not None:
        unit, of = "tensor", variable_count
    elif head.layer is not None:
        unit, of = "layer", layer_count
    else:
        unit, of = "model", 1
    first_step, last_step = head.first_step, max(a.last_step for a in chosen)
    first_name = head.variable or head.layer or "whole model"
    if len(chosen) == 1:
        message = head.message
    else:
        phrase = _PHRASES.get((head.kind, head.rule), "were flagged by the {rule} rule").format(
            threshold=head.threshold, rule=head.rule)
        steps = (f"at step {first_step}" if first_step == last_step
                 else f"at steps {first_step}-{last_step}")
        message = (f"{len(chosen)} of {of} {unit}s {phrase} {steps}, "
                   f"first {subject_name(unit, first_name)}.")
    return AlertGroup(
        kind=head.kind, rule=head.rule, severity=head.severity, first_step=first_step,
        last_step=last_step, subjects=len(chosen), of=of, unit=unit, first=first_name,
        message=message, alerts=list(members), raised_step=min(a.raised_step for a in chosen),
    )
