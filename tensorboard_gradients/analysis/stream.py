"""`AnalysisStream`: the classes and alerts of a series fed a few steps at a time, in memory
bounded by the rules' windows, not by the run's length.

Every rule looks back a bounded number of logged steps (a sustained stretch: ``sustain_steps``;
the spike history: the previous block of ``spike_window`` steps, carried as its median and MAD;
a vanishing-by-depth finding, which lasts until its layer recovers: carried as each layer's
recovery level) and ahead at most ``sustain_steps - 1`` (is this step the start of a sustained stretch?). So
each round re-judges only the rows from the start of the spike block holding the first
undecided row, with ``sustain_steps - 1`` rows of context before it; the rows that no later step
can change become final, and only what the next round needs is kept. The last
``sustain_steps - 1`` rows stay provisional (they are what `analyze` of the series so far says)
until later steps decide them, or until `close` says no step follows. A series with norms-only
steps (format 1.6: every statistic every ``stats_every`` rows) has its dead rule judge the rows
with every statistic, ``sustain_steps`` of them in a row: the context and the provisional rows
are then ``stats_every`` times as many (`context_rows`).

Exactness: the classes and alerts equal `analyze` of the whole series, for any way of cutting
it into feeds (a test checks it on random and crafted series). `analyze` itself is one feed and
a `close`, so there is one implementation of every rule.
"""

import dataclasses
import json
from typing import Dict, List, Optional, Sequence

import numpy as np

from tensorboard_gradients.analysis.alerts import (
    AlertBuilder, Alert, Finding, by_urgency, merged_findings,
)
from tensorboard_gradients.analysis.classes import CLASSES, MISSING, OK
from tensorboard_gradients.analysis.evidence import Evidence
from tensorboard_gradients.analysis.rules import RULES, of_kind
from tensorboard_gradients.analysis.thresholds import Thresholds


@dataclasses.dataclass(frozen=True)
class _Subjects:
    """The steps and variables alerts name, for rules judged on the whole run."""

    steps: np.ndarray
    variables: Sequence[str]
    layers: Sequence[str]


class AnalysisStream:
    """Cell classes and alerts of one series, fed in step order.

    Args:
      like: a `GradientSeries` (any number of steps) whose variables, layers, shapes and stat
        names the fed matrices follow.
      thresholds: the rules' `Thresholds` (default: the documented defaults).

    `feed` returns the classes that became final; `provisional_classes` the rest; `alerts` the
    alerts of everything fed so far (equal to `analyze` of the series so far).
    """

    def __init__(self, like, thresholds: Optional[Thresholds] = None):
        self._like = like
        self.thresholds = thresholds or Thresholds()
        self._context = context_rows(self.thresholds, like.stats_every)
        self._block = self.thresholds.spike_window
        width = (len(like.variables), len(like.stat_names))
        # Kept rows: the run's rows [self._kept_from, self.rows).
        self._steps: List[np.ndarray] = []
        self._wall_times: List[np.ndarray] = []
        self._values: List[np.ndarray] = []
        self._losses: List[np.ndarray] = []  # [rows, 2]: the loss, and 1 where one was logged
        self._width = width
        self._kept_from = 0
        self.rows = 0  # rows fed
        self.gradient_rows = 0  # rows fed in which some variable had a gradient
        self._size_column = like.stat_names.index("size")
        self._last_step = None
        self.final_rows = 0  # rows [0, final_rows) are decided
        self._closed = False
        self._carried = {}
        self._findings = {}
        self._provisional_findings = {}
        self._provisional_classes = np.zeros((0, width[0]), dtype=np.int8)
        self._all_steps: List[np.ndarray] = []  # every fed row's step, for whole-run rules
        self._records = {rule.name: [] for rule in RULES if rule.whole_run}
        self._provisional_records = {}

    def feed(self, steps, wall_times, values, last: bool = False, loss=None,
             loss_logged=None) -> np.ndarray:
        """Adds logged steps (increasing, after every step fed before) and judges them;
        ``last`` also `close`s the stream. ``loss``, ``loss_logged``: the training loss at
        those steps and where one was logged (`GradientSeries.loss`; None: nowhere).

        Returns ``int8[rows, variables]``: the `CLASSES` codes of the rows that became final
        (the run's rows from the previous `final_rows` on, in order)."""
        if self._closed:
            raise ValueError("the stream is closed: no step may follow")
        steps = np.asarray(steps, dtype=np.int64)
        values = np.asarray(values)
        if values.shape != (len(steps),) + self._width:
            raise ValueError(f"values of shape {values.shape} for {len(steps)} steps of "
                             f"{self._width[0]} variables x {self._width[1]} stats")
        if len(steps) and ((np.diff(steps) <= 0).any()
                           or (self._last_step is not None and steps[0] <= self._last_step)):
            raise ValueError("steps must increase from feed to feed")
        if len(steps):
            self._last_step = int(steps[-1])
        self._steps.append(steps)
        self._wall_times.append(np.asarray(wall_times, dtype=np.float64))
        self._values.append(values)
        self._losses.append(_losses(len(steps), loss, loss_logged))
        self._all_steps.append(steps)
        self.rows += len(steps)
        self.gradient_rows += int((~np.isnan(values[:, :, self._size_column])).any(axis=1).sum())
        if last:
            self._closed = True
        elif not len(steps):
            return np.zeros((0, self._width[0]), dtype=np.int8)
        return self._round(closed=last)

    def feed_rows(self, rows, last: bool = False) -> np.ndarray:
        """`feed` of a `GradientSeries` of the next rows, with their losses."""
        return self.feed(rows.steps, rows.wall_times, rows.values, last=last,
                         loss=getattr(rows, "loss", None),
                         loss_logged=getattr(rows, "loss_logged", None))

    def close(self) -> np.ndarray:
        """Says no step follows: returns the classes of the rows still provisional, now final."""
        if self._closed:
            return np.zeros((0, self._width[0]), dtype=np.int8)
        self._closed = True
        return self._round(closed=True)

    def provisional_classes(self) -> np.ndarray:
        """``int8[rows - final_rows, variables]``: the classes of the undecided rows as the
        steps so far give them."""
        return self._provisional_classes

    def alerts(self) -> List[Alert]:
        """The alerts of every step fed so far, most urgent first (see `analysis.diagnose`)."""
        findings = merged_findings(self._findings, self._provisional_findings)
        self._all_steps = _joined(self._all_steps)
        steps = self._all_steps[0] if self._all_steps else np.zeros(0, np.int64)
        rows = _Subjects(steps, self._like.variables, self._like.layers)
        for rule in RULES:
            if rule.whole_run:
                builder = AlertBuilder(rows)
                rule.alerts_on(self._record(rule), self.thresholds, builder)
                findings = merged_findings(findings, builder.findings)
        holding = [finding for finding in findings.values()
                   if all(rule.holds(finding, self.gradient_rows, self.thresholds)
                          for rule in of_kind(finding.kind))]
        return by_urgency([f.alert() for f in holding], rows.variables, rows.layers)

    def _record(self, rule, provisional: bool = True):
        """A whole-run rule's record of every row (``provisional``) or of the final ones; None
        when it records nothing."""
        parts = self._records[rule.name] + ([self._provisional_records[rule.name]]
                                           if provisional and rule.name in
                                           self._provisional_records else [])
        parts = [part for part in parts if part is not None]
        if not parts:
            return None
        name, columns, _ = parts[0]
        return name, columns, np.concatenate([part[2] for part in parts])

    def _round(self, closed: bool) -> np.ndarray:
        first_undecided = self.final_rows
        end = self.rows
        decided = end if closed else max(first_undecided, end - self._context)
        block_start = first_undecided // self._block * self._block
        first_row = max(0, block_start - self._context)
        resume_row = None if closed else decided // self._block * self._block
        series = self._kept_series(first_row)
        evidence = Evidence(series, self.thresholds, RULES, first_row=first_row,
                            fresh=block_start - first_row, previous=self._carried,
                            resume_row=resume_row)
        classes = _classes(evidence)
        low, split, high = (first_undecided - first_row, decided - first_row, end - first_row)
        builder = AlertBuilder(series, rows=(low, split, high))
        for rule in RULES:
            if not rule.whole_run:
                rule.alerts(evidence, builder)
                continue
            record = rule.record(evidence)
            if record is not None:
                name, columns, ratios = record
                self._records[rule.name].append((name, columns, ratios[low:split]))
                self._provisional_records[rule.name] = (name, columns, ratios[split:high])
        self._findings = merged_findings(self._findings, builder.findings)
        self._provisional_findings = builder.provisional
        self._carried = evidence.next
        self._provisional_classes = classes[split:high]
        self.final_rows = decided
        if resume_row is not None:
            self._keep_from(first_kept_row(decided, self.thresholds, self._like.stats_every))
        else:
            self._keep_from(end)
        return classes[low:split]

    def state(self, since_final_rows: int) -> Dict[str, np.ndarray]:
        """What this stream needs, besides its rows, to go on in another process
        (`resumed`), as arrays (a writer's digest record holds them, `analysis.digest`): its
        counts, what the rules carried to the next round, the findings and classes (final and
        provisional), and the whole-run rules' records of the rows that became final since
        ``since_final_rows`` and of the provisional rows."""
        arrays = {
            "stream_rows": np.int64(self.rows), "stream_final_rows": np.int64(self.final_rows),
            "stream_gradient_rows": np.int64(self.gradient_rows),
            "stream_kept_from": np.int64(self._kept_from),
            "stream_last_step": np.int64(-1 if self._last_step is None else self._last_step),
            "stream_findings": _json_array([f.to_data() for f in self._findings.values()]),
            "stream_provisional_findings": _json_array(
                [f.to_data() for f in self._provisional_findings.values()]),
            "stream_provisional_classes": self._provisional_classes,
        }
        for key, value in self._carried.items():
            if isinstance(value, tuple):
                for index, part in enumerate(value):
                    arrays[f"carried.{key}.{index}"] = np.asarray(part)
            else:
                arrays[f"carried.{key}"] = np.int64(value)
        for rule in RULES:
            record = self._record(rule, provisional=False) if rule.whole_run else None
            if record is not None:
                name, columns, ratios = record
                arrays[f"record.{rule.name}.rule"] = _json_array(name)
                arrays[f"record.{rule.name}.columns"] = np.asarray(columns, np.int64)
                arrays[f"record.{rule.name}.values"] = ratios[since_final_rows:]
                provisional = self._provisional_records.get(rule.name)
                if provisional is not None:
                    arrays[f"record.{rule.name}.provisional"] = provisional[2]
        return arrays

    @classmethod
    def resumed(cls, like, thresholds: Thresholds, states: Sequence[Dict], kept,
                all_steps: np.ndarray) -> "AnalysisStream":
        """The stream whose `state` the writer wrote as ``states`` (every record's, in order:
        the last one's counts, carried values, findings and provisional parts; the whole-run
        records of all),
        with its kept rows ``kept`` (a `GradientSeries` of the rows from ``stream_kept_from``
        on, read back) and ``all_steps`` (every row's step). Raises ValueError (KeyError,
        TypeError) when they do not fit together."""
        last = states[-1]
        stream = cls(like, thresholds)
        stream.rows, stream.final_rows = int(last["stream_rows"]), int(last["stream_final_rows"])
        stream._kept_from = int(last["stream_kept_from"])
        stream.gradient_rows = int(last["stream_gradient_rows"])
        step = int(last["stream_last_step"])
        stream._last_step = None if step < 0 else step
        if (len(kept.steps) != stream.rows - stream._kept_from or len(all_steps) != stream.rows
                or not np.array_equal(kept.steps, all_steps[stream._kept_from:])
                or not 0 <= stream.final_rows <= stream.rows
                or not 0 <= stream.gradient_rows <= stream.rows
                or stream._kept_from != first_kept_row(stream.final_rows, thresholds,
                                                       like.stats_every)
                or stream._last_step != (int(all_steps[-1]) if stream.rows else None)):
            raise ValueError("the stream's rows do not match its state")
        stream._steps, stream._wall_times = [kept.steps], [kept.wall_times]
        stream._values = [kept.values]
        stream._losses = [_losses(len(kept.steps), kept.loss, kept.loss_logged)]
        stream._all_steps = [np.asarray(all_steps, np.int64)]
        stream._findings, stream._provisional_findings = (
            {finding.key: finding for finding in map(Finding.from_data, _from_json_array(
                last[name]))} for name in ("stream_findings", "stream_provisional_findings"))
        kinds = {rule.kind for rule in RULES}
        for finding in (*stream._findings.values(), *stream._provisional_findings.values()):
            if (finding.kind not in kinds or finding.variable not in (None, *like.variables)
                    or finding.layer not in (None, *like.layers)):
                raise ValueError("a finding names no rule or variable of this series")
        stream._provisional_classes = np.asarray(last["stream_provisional_classes"], np.int8)
        if stream._provisional_classes.shape != (stream.rows - stream.final_rows,
                                                 len(like.variables)):
            raise ValueError("the stream's provisional classes do not match its state")
        carried = {}
        for name, value in last.items():
            if name.startswith("carried."):
                key, *index = name[len("carried."):].split(".")
                if index:
                    parts = carried.setdefault(key, [])
                    if not isinstance(parts, list):
                        raise ValueError("what the rules carried does not fit this series")
                    parts.append((int(index[0]), value))
                elif key in carried:
                    raise ValueError("what the rules carried does not fit this series")
                else:
                    carried[key] = int(value)
        for value in carried.values():  # what rules keep: ints, or tuples of columns
            if isinstance(value, list) and (
                    sorted(index for index, _ in value) != list(range(len(value)))
                    or any(part.dtype != np.float32 or part.shape not in (
                        (len(like.variables),), (1,)) for _, part in value)):
                raise ValueError("what the rules carried does not fit this series")
        stream._carried = {key: tuple(part for _, part in sorted(value, key=lambda p: p[0]))
                           if isinstance(value, list) else value
                           for key, value in carried.items()}
        for rule in RULES:
            if not rule.whole_run or f"record.{rule.name}.rule" not in last:
                continue
            name = _from_json_array(last[f"record.{rule.name}.rule"])
            columns = np.asarray(last[f"record.{rule.name}.columns"], np.int64)
            values = np.concatenate([state[f"record.{rule.name}.values"] for state in states])
            # What this rule records of this series (its name and columns).
            expected = rule.record(Evidence(kept, thresholds, RULES))
            if (expected is None or name != expected[0]
                    or not np.array_equal(columns, expected[1]) or values.dtype.kind != "f"
                    or values.shape != (stream.final_rows, len(columns))):
                raise ValueError(f"the {rule.name} record does not fit this series")
            stream._records[rule.name] = [(name, columns, values)]
            provisional = last.get(f"record.{rule.name}.provisional")
            if provisional is not None:
                if (provisional.dtype.kind != "f"
                        or provisional.shape != (stream.rows - stream.final_rows, len(columns))):
                    raise ValueError(f"the {rule.name} record does not cover the last rows")
                stream._provisional_records[rule.name] = (name, columns, provisional)
        return stream

    def _kept_series(self, first_row: int):
        """A series of the kept rows from the run's row ``first_row`` on."""
        self._steps, self._wall_times, self._values, self._losses = (
            _joined(self._steps), _joined(self._wall_times), _joined(self._values),
            _joined(self._losses))
        cut = first_row - self._kept_from
        empty = np.zeros((0,) + self._width, dtype=np.float32)
        losses = self._losses[0][cut:] if self._losses else np.zeros((0, 2))
        return dataclasses.replace(
            self._like,
            steps=self._steps[0][cut:] if self._steps else np.zeros(0, np.int64),
            wall_times=self._wall_times[0][cut:] if self._wall_times else np.zeros(0),
            values=self._values[0][cut:] if self._values else empty,
            loss=losses[:, 0], loss_logged=losses[:, 1] > 0,
        )

    def _keep_from(self, row: int):
        cut = row - self._kept_from
        if cut > 0 and self._steps:
            self._steps = [self._steps[0][cut:]]
            self._wall_times = [self._wall_times[0][cut:]]
            self._values = [self._values[0][cut:]]
            self._losses = [self._losses[0][cut:]]
            self._kept_from = row
        self._all_steps = _joined(self._all_steps)


def context_rows(thresholds: Thresholds, stats_every: int = 1) -> int:
    """The rows a round looks back on before its first fresh row, and leaves provisional at the
    end: ``sustain_steps - 1`` rows with every statistic, which are at most ``stats_every``
    rows apart (`GradientSeries.stats_every`). Exact when they are; a series whose rows with
    every statistic are further apart (a crafted file, a dropped write) may have its dead
    findings differ from `analyze`'s, and nothing else."""
    return (thresholds.sustain_steps - 1) * stats_every


def first_kept_row(final_rows: int, thresholds: Thresholds, stats_every: int = 1) -> int:
    """The first row a stream keeps once ``final_rows`` are final: the context before the
    spike block holding the first undecided row, where its next round starts."""
    block_start = final_rows // thresholds.spike_window * thresholds.spike_window
    return max(0, block_start - context_rows(thresholds, stats_every))


def _json_array(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value, separators=(",", ":")).encode("utf-8"), np.uint8)


def _from_json_array(array) -> object:
    return json.loads(np.asarray(array, np.uint8).tobytes().decode("utf-8"))


def _losses(rows: int, loss, logged) -> np.ndarray:
    """``float64[rows, 2]``: the loss at each row and 1 where one was logged (NaN, 0: none)."""
    if loss is None:
        return np.column_stack([np.full(rows, np.nan), np.zeros(rows)])
    return np.column_stack([np.asarray(loss, np.float64), np.asarray(logged, np.float64)])


def _joined(parts: List[np.ndarray]) -> List[np.ndarray]:
    """``parts`` as one array (in a list; none: an empty list), copied only if there are more."""
    return [np.concatenate(parts)] if len(parts) > 1 else parts


def _classes(evidence: Evidence) -> np.ndarray:
    classes = np.full(evidence.missing.shape, OK, dtype=np.int8)
    for code in range(OK + 1, len(CLASSES)):  # milder classes first: the worst one wins a cell
        classes[evidence.cells_of_class(code)] = code
    classes[evidence.missing] = MISSING
    return classes
