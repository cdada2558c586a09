"""The dead rule: a gradient that is (almost) entirely exact zeros for a sustained stretch
(warnings; the heatmap shows the zero fraction itself, so no cell class).

It judges only a logged ``zero_fraction``, as the update-ratio rule judges only a logged update:
a writer asked for fewer stats (format 1.3's ``stats=``) may leave it out, and no other stat
gives the share of zero entries that ``dead_fraction`` bounds (a 99%-dead ReLU layer's norm and
largest entry can be anything). Between the steps with every statistic a monitor logs only the
norms (format 1.6, ``stats_every_n_steps``): the rule judges the steps that logged the zero
fraction (`GradientSeries.logged_rows`), and "sustained" counts those.
"""

import numpy as np

from tensorboard_gradients.analysis import window
from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.rule import Parameter, Rule

DEAD_FRACTION = Parameter(
    "dead_fraction", 0.99, float, "dead at zero fraction", maximum=1, doc="""
A variable whose gradient is exactly zero in at least this fraction of its entries for
``sustain_steps`` logged steps (of those that logged the zero fraction) is dead: dead ReLUs
(CS231n notes: as much as 40% of a network can die at too high a learning rate; here 99% of
the gradient is gone) or a disconnected path. Embedding tables are expected to be mostly zero (only the looked-up
rows get a gradient); raise this threshold or ignore those alerts for them.

Needs ``zero_fraction`` (logged unless a writer's ``stats=`` left it out).
""")


_ZERO_FRACTION = Wording.define(
    "dead.zero_fraction", "{value:.1%} of the gradient entries were exactly zero (dead units or "
    "a disconnected path; expected for embedding tables)")


class Dead(Rule):
    name = "dead"
    kind = "dead"
    parameters = (DEAD_FRACTION,)
    needs = ("zero_fraction",)

    def alerts(self, evidence, builder):
        if not self.judges(evidence.series):
            return  # not logged: nothing to judge (see the module)
        limits = evidence.thresholds
        zero_fraction = evidence.series.stat("zero_fraction")
        # A gradient with NaN/Inf entries is the nonfinite rule's finding, not also a dead one.
        with np.errstate(invalid="ignore"):
            dead = window.sustained_on(
                (zero_fraction >= limits.dead_fraction) & ~evidence.nonfinite,
                evidence.series.logged_rows("zero_fraction"), limits.sustain_steps)
        for row in flagged_columns(dead):
            builder.add(
                self.kind, "zero_fraction", "warning", dead[:, row], zero_fraction[:, row], np.max,
                limits.dead_fraction,
                _ZERO_FRACTION,
                row=row, raised_at_hit=limits.sustain_steps - 1,
            )
