"""The non-finite rule: a gradient with any NaN/Inf entry (class ``nonfinite``, critical alerts).

Every other rule leaves these cells alone: their statistics cover only the finite entries.
"""

import numpy as np

from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.classes import NONFINITE
from tensorboard_gradients.analysis.rule import Rule


_COUNT = Wording.define("nonfinite.count", "gradient had up to {value:.0f} NaN/Inf entries")
_AT_FIRST = Wording.define(
    "nonfinite.count_at_first", "gradient had up to {value:.0f} NaN/Inf entries (among the first "
    "non-finite gradients of the run)")


class Nonfinite(Rule):
    name = "nonfinite"
    kind = "nonfinite"
    cell_class = NONFINITE

    def cells(self, evidence):
        series = evidence.series
        with np.errstate(invalid="ignore"):
            return ~evidence.missing & (
                (series.stat("nan_count") > 0) | (series.stat("inf_count") > 0)
            )

    def alerts(self, evidence, builder):
        """Every variable with NaN/Inf; those hit at the run's first non-finite step say so."""
        nonfinite = evidence.cells(self)
        entries = evidence.series.stat("nan_count") + evidence.series.stat("inf_count")
        first_step = evidence.kept("first_nonfinite_step")
        rows_hit = np.flatnonzero(nonfinite.any(axis=1))
        if first_step is None and rows_hit.size:
            first_step = int(evidence.series.steps[rows_hit[0]])
        if first_step is not None:
            evidence.keep("first_nonfinite_step", first_step)
        first_row = np.flatnonzero(np.asarray(evidence.series.steps) == first_step)
        for row in flagged_columns(nonfinite):
            # The run's first non-finite step may lie in an earlier round of a stream.
            at_first = bool(first_row.size) and nonfinite[first_row[0], row]
            builder.add(
                self.kind, "count", "critical", nonfinite[:, row], entries[:, row], np.max, 0,
                _AT_FIRST if at_first else _COUNT,
                row=row,
            )
