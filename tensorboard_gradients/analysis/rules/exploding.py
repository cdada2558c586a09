"""The exploding rule: a gradient norm above an absolute ceiling, per variable (class
``exploding``) and for the global norm (critical alerts). Spikes against a variable's own history
are the spike rule (`spike.py`).
"""

import numpy as np

from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.classes import EXPLODING
from tensorboard_gradients.analysis.rule import Parameter, Rule

EXPLODING_NORM = Parameter(
    "exploding_norm", 1e3, float, "exploding above (norm)", in_form=True, doc="""
Absolute ceiling for one variable's gradient norm. Gradient clipping, the standard fix for
exploding gradients (Pascanu, Mikolov & Bengio 2013, "On the difficulty of training
recurrent neural networks"), is usually set to a global norm of 1-10 (GPT-style training
clips at 1.0); a single tensor 100x past the usual clip level is exploding under any of
those settings. A single step above it is enough: an explosion is an event.
""")

EXPLODING_GLOBAL_NORM = Parameter(
    "exploding_global_norm", 1e3, float, "global norm exploding above", doc="""
The same ceiling for the global norm ``sqrt(sum of squared variable norms)``, the quantity
that ``clipnorm``/``global_clipnorm``/``clip_grad_norm_`` act on (Pascanu et al. 2013).
""")


_ABSOLUTE = Wording.define("exploding.absolute", "gradient norm reached {value:.3g}, above "
                           "{limit:g}")
_GLOBAL = Wording.define("exploding.global", "global gradient norm reached {value:.3g}, above "
                         "{limit:g}")


class Exploding(Rule):
    name = "exploding"
    kind = "exploding"
    cell_class = EXPLODING
    parameters = (EXPLODING_NORM, EXPLODING_GLOBAL_NORM)

    def cells(self, evidence):
        with np.errstate(invalid="ignore"):
            return ~evidence.missing & (evidence.norms >= evidence.thresholds.exploding_norm)

    def alerts(self, evidence, builder):
        limit = evidence.thresholds.exploding_norm
        exploding = evidence.cells(self)
        for row in flagged_columns(exploding):
            builder.add(
                self.kind, "absolute", "critical", exploding[:, row], evidence.norms[:, row],
                np.max, limit, _ABSOLUTE.bound(limit=limit),
                row=row,
            )

        global_limit = evidence.thresholds.exploding_global_norm
        with np.errstate(invalid="ignore"):
            global_exploding = evidence.global_present & (evidence.global_norm >= global_limit)
        builder.add(
            self.kind, "global", "critical", global_exploding, evidence.global_norm, np.max,
            global_limit,
            _GLOBAL.bound(limit=global_limit),
        )
