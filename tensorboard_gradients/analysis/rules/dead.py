"""The dead rule: a gradient that is (almost) entirely exact zeros for a sustained stretch
(warnings; the heatmap shows the zero fraction itself, so no cell class).
"""

import numpy as np

from tensorboard_gradients.analysis import window
from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.rule import Parameter, Rule

DEAD_FRACTION = Parameter(
    "dead_fraction", 0.99, float, "dead at zero fraction", maximum=1, doc="""
A variable whose gradient is exactly zero in at least this fraction of its entries for
``sustain_steps`` logged steps is dead: dead ReLUs (CS231n notes: as much as 40% of a
network can die at too high a learning rate; here 99% of the gradient is gone) or a
disconnected path. Embedding tables are expected to be mostly zero (only the looked-up
rows get a gradient); raise this threshold or ignore those alerts for them.
""")


_ZERO_FRACTION = Wording.define(
    "dead.zero_fraction", "{value:.1%} of the gradient entries were exactly zero (dead units or "
    "a disconnected path; expected for embedding tables)")


class Dead(Rule):
    name = "dead"
    kind = "dead"
    parameters = (DEAD_FRACTION,)

    def alerts(self, evidence, builder):
        limits = evidence.thresholds
        zero_fraction = evidence.series.stat("zero_fraction")
        # A gradient with NaN/Inf entries is the nonfinite rule's finding, not also a dead one.
        with np.errstate(invalid="ignore"):
            dead = window.sustained((zero_fraction >= limits.dead_fraction) & ~evidence.nonfinite,
                                    limits.sustain_steps)
        for row in flagged_columns(dead):
            builder.add(
                self.kind, "zero_fraction", "warning", dead[:, row], zero_fraction[:, row], np.max,
                limits.dead_fraction,
                _ZERO_FRACTION,
                row=row,
            )
