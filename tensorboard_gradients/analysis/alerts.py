"""`Alert` and how the rules build them: one message layout, one sort order for every rule."""

import dataclasses
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

SEVERITIES = ("critical", "warning", "info")  # sort order of alerts: most urgent first


@dataclasses.dataclass(frozen=True)
class Alert:
    """One finding. ``variable``/``layer`` are None for whole-model findings (the global norm).

    ``raised_step``: the first step at which the analysis fed the run step by step, with no
    look-ahead, reports this finding as it stands (from ``first_step``): ``first_step`` for a
    rule that judges each step on the steps up to it, the step that completes the stretch for a
    sustained one (``sustain_steps`` logged steps later), the step where the run's median left
    the band for the update-ratio rule. What a monitor could have told during training.
    """

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
    raised_step: int = -1  # -1 only in alerts from before it was recorded (`Alert.from_json`)
    # A whole-model finding that names the variable whose gradient moved first (a loss spike):
    # {"variable", "layer", "from_step"}: the tab outlines its cells from that step on.
    moved_first: Optional[Dict] = None

    def to_json(self) -> Dict:
        return dataclasses.asdict(self)


def flagged_columns(mask: np.ndarray) -> np.ndarray:
    """Columns (variables or layers) of ``[steps, columns]`` with at least one flagged step."""
    return np.flatnonzero(mask.any(axis=0))


@dataclasses.dataclass(frozen=True)
class Finding:
    """What one rule found for one subject over some steps: an `Alert` before its message.

    Findings of the same rule and subject over different steps (the rounds of a stream, see
    `analysis.stream`) `merge` into the finding over all those steps. A finding whose
    ``describe`` is a `Wording` and whose reducers are in `REDUCERS` is plain data
    (`to_data`, `from_data`): a stream's state can be written and taken up again.
    """

    kind: str
    rule: str
    severity: str
    variable: Optional[str]
    layer: Optional[str]
    first_step: int
    last_step: int
    steps: int
    value: float
    threshold: float
    worst: Callable  # reduces values to the reported one (np.max, np.min, ...)
    describe: Callable  # describe(value) or, with a detail, describe(value, detail)
    detail: Optional[float] = None  # a second measure the message reports (reduced by worst)
    detail_worst: Optional[Callable] = None
    # When it is raised (`Alert.raised_step`): at its hit number ``raised_at_hit`` (0: its first
    # step; ``sustain_steps - 1``: the step completing a sustained stretch); ``first_hits`` are
    # the steps of its first ``raised_at_hit + 1`` hits, all that merging rounds needs.
    # ``raised_step`` set: a rule that knows it otherwise (the update-ratio rule's median).
    raised_at_hit: int = 0
    first_hits: Tuple[int, ...] = ()
    raised_step: Optional[int] = None
    # Tells apart findings of one rule and subject that are separate events (a loss spike
    # episode: its first step); None for a rule with one finding per subject.
    episode: Optional[int] = None

    @property
    def key(self):
        return (self.kind, self.rule, self.variable, self.layer, self.episode)

    @property
    def raised(self) -> int:
        """`Alert.raised_step` (the last step while fewer hits than it needs were fed)."""
        if self.raised_step is not None:
            return self.raised_step
        if len(self.first_hits) > self.raised_at_hit:
            return self.first_hits[self.raised_at_hit]
        return self.last_step

    def merge(self, later: "Finding") -> "Finding":
        """This finding and one over later steps as one (the earlier one's message wording,
        the more urgent severity)."""
        return dataclasses.replace(
            self,
            severity=min(self.severity, later.severity, key=SEVERITIES.index),
            last_step=later.last_step,
            steps=self.steps + later.steps,
            first_hits=(self.first_hits + later.first_hits)[:self.raised_at_hit + 1],
            raised_step=(self.raised_step if self.raised_step is not None
                         else later.raised_step),
            value=_reduced(self.worst, [self.value, later.value]),
            detail=(None if self.detail is None
                    else _reduced(self.detail_worst, [self.detail, later.detail])),
        )

    def to_data(self) -> Dict:
        """This finding as JSON-able data (`from_data` reads it back)."""
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data.update(worst=_REDUCER_NAMES[self.worst], describe=self.describe.to_data(),
                    first_hits=list(self.first_hits),
                    detail_worst=(None if self.detail_worst is None
                                  else _REDUCER_NAMES[self.detail_worst]))
        return data

    @classmethod
    def from_data(cls, data: Dict) -> "Finding":
        """The finding `to_data` gave. Raises ValueError (KeyError, TypeError) for anything
        else: data read from a file is checked, and a wording renders before it is taken."""
        data = dict(data)
        data["worst"] = REDUCERS[data["worst"]]
        data["describe"] = Wording.from_data(data["describe"])
        data["first_hits"] = tuple(data["first_hits"])
        if data["detail_worst"] is not None:
            data["detail_worst"] = REDUCERS[data["detail_worst"]]
        finding = cls(**data)
        for name in ("first_step", "last_step", "steps", "raised_at_hit"):
            if type(getattr(finding, name)) is not int:
                raise ValueError(f"a finding's {name} is not an integer")
        for name in ("raised_step", "episode"):
            if getattr(finding, name) is not None and type(getattr(finding, name)) is not int:
                raise ValueError(f"a finding's {name} is not an integer")
        if not all(type(step) is int for step in finding.first_hits):
            raise ValueError("a finding's first hits are not steps")
        for name in ("value", "threshold", "detail"):
            value = getattr(finding, name)
            if type(value) not in (int, float) and not (name == "detail" and value is None):
                raise ValueError(f"a finding's {name} is not a number")
        if ((finding.detail is None) != (finding.detail_worst is None)
                or finding.severity not in SEVERITIES
                or not all(isinstance(getattr(finding, name), str) for name in ("kind", "rule"))):
            raise ValueError("a finding's fields do not go together")
        finding.alert()  # renders, or an error now
        return finding

    def alert(self) -> Alert:
        if self.first_step == self.last_step:
            span = f"at step {self.first_step}"
        else:
            span = f"at {self.steps} logged steps from step {self.first_step} to {self.last_step}"
        subject = self.variable or (f"layer {self.layer}" if self.layer else "whole model")
        described = (self.describe(self.value) if self.detail_worst is None
                     else self.describe(self.value, self.detail))
        raised = self.raised
        if raised != self.first_step:  # a sustained stretch, a run's median: told later
            span += f", raised at step {raised}"
        return Alert(
            kind=self.kind, rule=self.rule, variable=self.variable, layer=self.layer,
            first_step=self.first_step, last_step=self.last_step, steps=self.steps,
            value=self.value, threshold=self.threshold, severity=self.severity,
            message=f"{subject}: {described} {span}.", raised_step=self.raised,
            moved_first=self._moved_first(),
        )

    def _moved_first(self) -> Optional[Dict]:
        params = getattr(self.describe, "params", {})
        if "mover" not in params:
            return None
        return {"variable": params["mover"], "layer": params.get("mover_layer"),
                "from_step": params["since"]}


class Wording:
    """A rule's message as a template of this package (named, registered in `WORDINGS`) and
    the parameters it was given (`bound`): calling it with the finding's value (and detail)
    renders the message. Data (`to_data`) that names a template, never holds one: a template
    read from a file could reach any attribute through `str.format`."""

    def __init__(self, name: str, template: str, params: Optional[Dict] = None):
        self.name, self.template, self.params = name, template, dict(params or {})

    @classmethod
    def define(cls, name: str, template: str) -> "Wording":
        """A template ``template`` (fields ``{value}``, ``{detail}`` and parameters) named
        ``name``, registered in `WORDINGS`."""
        if name in WORDINGS:
            raise ValueError(f"wording {name!r} is defined twice")
        WORDINGS[name] = cls(name, template)
        return WORDINGS[name]

    def bound(self, **params) -> "Wording":
        return Wording(self.name, self.template, params)

    def __call__(self, value, detail=None) -> str:
        return self.template.format(value=value, detail=detail, **self.params)

    def to_data(self) -> Dict:
        return {"name": self.name, "params": self.params}

    @classmethod
    def from_data(cls, data: Dict) -> "Wording":
        params = data["params"]
        if not isinstance(params, dict) or not all(
                isinstance(value, (str, bool, int, float)) for value in params.values()):
            raise ValueError("a wording's parameters are not plain values")
        wording = WORDINGS[data["name"]].bound(**params)
        wording(1.0, 1.0)  # renders, or raises now
        return wording


WORDINGS: Dict[str, Wording] = {}
# How findings reduce the values of their steps to the reported one, by name.
REDUCERS = {"max": np.max, "min": np.min}
_REDUCER_NAMES = {function: name for name, function in REDUCERS.items()}


def _reduced(worst: Callable, values) -> float:
    """``worst`` of the non-NaN ``values`` (NaN when there are none)."""
    values = np.asarray(values)
    finite = values[~np.isnan(values)]
    return float(worst(finite)) if finite.size else float("nan")


def merged_findings(*groups: Dict) -> Dict:
    """``{key: Finding}`` of several groups over successive steps, merged per rule and subject."""
    result = {}
    for group in groups:
        for key, finding in group.items():
            result[key] = result[key].merge(finding) if key in result else finding
    return result


def by_urgency(alerts: List[Alert], variables, layers) -> List[Alert]:
    """The alerts sorted by severity, then first step, then model order (whole-model ones
    first, a layer's with its last variable); ties keep the order they were added in, which
    is rule order."""
    severity_rank = {s: i for i, s in enumerate(SEVERITIES)}
    order = {name: i for i, name in enumerate(variables)}
    layer_order = {name: i for i, name in enumerate(layers)}
    return sorted(
        alerts,
        key=lambda a: (
            severity_rank[a.severity],
            a.first_step,
            order.get(a.variable, layer_order.get(a.layer, -1)),
        ),
    )


class AlertBuilder:
    """Collects the findings of one series (or of one round of a stream: only rows
    ``rows[0]:rows[2]`` count, those from ``rows[1]`` on are provisional, see
    `analysis.stream`); `by_urgency` returns them as alerts in the documented order."""

    def __init__(self, series, rows=None):
        self.series = series
        self.steps = np.asarray(series.steps)
        count = len(self.steps)
        self.rows = (0, count, count) if rows is None else rows
        self.findings: Dict = {}  # {key: Finding} over rows[0]:rows[1]
        self.provisional: Dict = {}  # over rows[1]:rows[2]

    def add(self, kind: str, rule: str, severity: str, mask: np.ndarray, values: np.ndarray,
            worst: Callable, threshold: float, describe: Callable, row=None, layer=None,
            detail=None, raised_at_hit: int = 0, raised_step: Optional[int] = None,
            episode: Optional[int] = None, escalated=None) -> None:
        """One finding for the steps where ``mask`` (1-D over steps) holds, if any.

        ``value`` is ``worst`` of the non-NaN ``values`` at those steps; the message is
        ``"<subject>: <describe(value)> <steps>."``. ``row`` names a variable (its layer comes
        along); ``layer`` alone a whole layer; neither the whole model. ``detail = (values,
        worst)``: a second measure over the same steps, passed as ``describe(value, detail)``.
        ``raised_at_hit``, ``raised_step``, ``episode``: see `Finding` (``raised_at_hit``: how
        many more flagged steps than the first the rule needed to flag it, e.g.
        ``sustain_steps - 1`` for a sustained stretch). ``escalated = (severity, mask)``: the
        finding has that severity instead when one of its steps is in ``mask``.
        """
        low, split, high = self.rows
        for findings, part in ((self.findings, slice(low, split)),
                               (self.provisional, slice(split, high))):
            hits = np.flatnonzero(mask[part]) + part.start
            if hits.size == 0:
                continue
            variable = None if row is None else self.series.variables[row]
            urgent = escalated is not None and escalated[1][hits].any()
            finding = Finding(
                kind=kind, rule=rule, severity=escalated[0] if urgent else severity,
                variable=variable,
                layer=self.series.layers[row] if row is not None else layer,
                first_step=int(self.steps[hits[0]]), last_step=int(self.steps[hits[-1]]),
                steps=int(hits.size), value=_reduced(worst, values[hits]),
                threshold=float(threshold), worst=worst, describe=describe,
                detail=None if detail is None else _reduced(detail[1], detail[0][hits]),
                detail_worst=None if detail is None else detail[1],
                raised_at_hit=int(raised_at_hit),
                first_hits=tuple(int(s) for s in self.steps[hits[:raised_at_hit + 1]]),
                raised_step=None if raised_step is None else int(raised_step), episode=episode,
            )
            findings[finding.key] = finding

    @property
    def alerts(self) -> List[Alert]:
        """Every finding as an alert, in the order added."""
        return [f.alert() for f in merged_findings(self.findings, self.provisional).values()]

    def by_urgency(self) -> List[Alert]:
        return by_urgency(self.alerts, self.series.variables, self.series.layers)
