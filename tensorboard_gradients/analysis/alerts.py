"""`Alert` and how the rules build them: one message layout, one sort order for every rule."""

import dataclasses
from typing import Callable, Dict, List, Optional

import numpy as np

SEVERITIES = ("critical", "warning", "info")  # sort order of alerts: most urgent first


@dataclasses.dataclass(frozen=True)
class Alert:
    """One finding. ``variable``/``layer`` are None for whole-model findings (the global norm)."""

    kind: str  # one of KINDS
    rule: str  # which rule of the kind fired: e.g. "absolute", "spike", "global", "depth"
    variable: Optional[str]
    layer: Optional[str]
    first_step: int
    last_step: int
    steps: int  # how many logged steps met the rule
    value: float  # the worst measured value (see `message` for its unit)
    threshold: float
    severity: str  # one of SEVERITIES
    message: str

    def to_json(self) -> Dict:
        return dataclasses.asdict(self)


def flagged_columns(mask: np.ndarray) -> np.ndarray:
    """Columns (variables or layers) of ``[steps, columns]`` with at least one flagged step."""
    return np.flatnonzero(mask.any(axis=0))


class AlertBuilder:
    """Collects the alerts of one series; `by_urgency` returns them in the documented order."""

    def __init__(self, series):
        self.series = series
        self.steps = np.asarray(series.steps)
        self.alerts: List[Alert] = []

    def add(self, kind: str, rule: str, severity: str, mask: np.ndarray, values: np.ndarray,
            worst: Callable, threshold: float, describe: Callable[[float], str], row=None,
            layer=None) -> None:
        """One alert for the steps where ``mask`` (1-D over steps) holds, if any.

        ``value`` is ``worst`` of the non-NaN ``values`` at those steps; the message is
        ``"<subject>: <describe(value)> <steps>."``. ``row`` names a variable (its layer comes
        along); ``layer`` alone a whole layer; neither the whole model.
        """
        hits = np.flatnonzero(mask)
        if hits.size == 0:
            return
        picked = values[hits]
        finite = picked[~np.isnan(picked)]
        value = float(worst(finite)) if finite.size else float("nan")
        variable = None if row is None else self.series.variables[row]
        if row is not None:
            layer = self.series.layers[row]
        first, last = int(self.steps[hits[0]]), int(self.steps[hits[-1]])
        if first == last:
            span = f"at step {first}"
        else:
            span = f"at {hits.size} logged steps from step {first} to {last}"
        subject = variable or (f"layer {layer}" if layer else "whole model")
        self.alerts.append(
            Alert(
                kind=kind,
                rule=rule,
                variable=variable,
                layer=layer,
                first_step=first,
                last_step=last,
                steps=int(hits.size),
                value=value,
                threshold=float(threshold),
                severity=severity,
                message=f"{subject}: {describe(value)} {span}.",
            )
        )

    def by_urgency(self) -> List[Alert]:
        """The alerts sorted by severity, then first step, then model order (whole-model ones
        first, a layer's with its last variable); ties keep the order they were added in, which
        is rule order."""
        severity_rank = {s: i for i, s in enumerate(SEVERITIES)}
        order = {name: i for i, name in enumerate(self.series.variables)}
        layer_order = {name: i for i, name in enumerate(self.series.layers)}
        return sorted(
            self.alerts,
            key=lambda a: (
                severity_rank[a.severity],
                a.first_step,
                order.get(a.variable, layer_order.get(a.layer, -1)),
            ),
        )
