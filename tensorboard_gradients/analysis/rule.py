"""The rule interface: what one diagnosis rule declares (`Parameter`) and provides (`Rule`).

A rule is one unit: the threshold parameters it owns (with their defaults and rationale), the
cells it gives a class in the heatmap and the alerts it raises. `rules/__init__.py` lists them in
order; `Thresholds` is assembled from their parameters.
"""

import dataclasses
import math
from typing import Optional, Tuple, Type, Union

import numpy as np


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One threshold: a `Thresholds` field, an HTTP query parameter and a CLI ``--threshold``.

    ``doc`` is the rationale and source of the default: it becomes part of the `Thresholds`
    docstring, so write it for users. ``label`` names the field in the tab's thresholds form
    (shown there only when ``in_form``).
    """

    name: str
    default: Union[int, float]
    type: Type  # int (a count of logged steps, 1 to 10**6) or float (finite and positive)
    label: str
    doc: str
    in_form: bool = False
    maximum: Optional[float] = None  # an upper bound besides the type's (e.g. 1 for fractions)

    def check_type(self, value) -> None:
        """`ValueError` unless ``value`` is an integer in [1, 10**6] / a finite positive number."""
        if self.type is int:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"threshold {self.name} must be an integer, got {value!r}")
            if not 1 <= value <= 10**6:
                raise ValueError(f"threshold {self.name} must be in [1, 1000000], got {value}")
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise ValueError(f"threshold {self.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise ValueError(
                    f"threshold {self.name} must be a finite positive number, got {value}"
                )

    def check_maximum(self, value) -> None:
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"threshold {self.name} must be at most {self.maximum:g}")

    def parse(self, text: str):
        """The value of ``text`` (an HTTP query parameter, a CLI flag); `ValueError` if none."""
        try:
            return self.type(text)
        except (TypeError, ValueError):
            raise ValueError(f"threshold {self.name} must be a number, got {text!r}") from None


class Rule:
    """One diagnosis rule. Subclasses set the class attributes and implement `alerts` (and
    `cells` when they set ``cell_class``); one instance per rule is listed in `rules.RULES`.

    Rules get an `Evidence` (the series, the thresholds and everything shared, each computed
    once): they may read any threshold, and ask for the cells of other rules' classes through
    ``evidence.cells_of_class`` (e.g. the spike rule ignores vanishing cells in its history).
    """

    name: str  # unique, e.g. "spike"
    kind: str  # the `Alert.kind` of its alerts; `KINDS` are the rules' kinds in rule order
    cell_class: Optional[int] = None  # the `CLASSES` code of the cells it flags; None: none
    parameters: Tuple[Parameter, ...] = ()  # the thresholds it owns, in `Thresholds` order
    # Whether its alerts judge the whole run at once (a median over every step): a stream
    # (`analysis.stream`) then keeps its ``record(evidence)`` of every round and calls its
    # ``alerts_on(record, thresholds, builder)`` once on all of it, instead of `alerts` per round.
    whole_run: bool = False
    # The stats it judges (names of `GradientSeries.available_stats`): a series without one of
    # them is not judged by this rule, which then raises no alert and flags no cell. Writers
    # may leave stats out (no weights, no optimizer update, format 1.3's ``stats=``).
    needs: Tuple[str, ...] = ()

    def judges(self, series) -> bool:
        """Whether ``series`` holds every stat this rule `needs`."""
        return all(name in series.available_stats for name in self.needs)

    def cells(self, evidence) -> np.ndarray:
        """``bool[steps, variables]``: the cells this rule gives ``cell_class``.

        Called at most once per analysis (through ``evidence.cells``). A rule that needs more
        than the mask again in `alerts` computes it in a method it passes to ``evidence.once``.
        """
        raise NotImplementedError

    def alerts(self, evidence, builder) -> None:
        """Add this rule's alerts to ``builder`` (an `AlertBuilder`), in model order."""
        raise NotImplementedError

    def holds(self, finding, gradient_rows: int, thresholds) -> bool:
        """Whether ``finding`` (this rule's, merged over every step fed so far) still holds
        for the run so far: ``gradient_rows`` steps held some gradient. A finding about its
        own steps holds for good (the default); one about the whole run can be withdrawn by a
        later step."""
        return True

    def check(self, thresholds) -> None:
        """`ValueError` when this rule's parameters contradict each other (checked after every
        parameter's own `Parameter.check_type` and `Parameter.check_maximum`)."""
