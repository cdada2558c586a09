"""The never-updated rule: a variable that received no gradient at any logged step of the run
while other variables did (warnings; its cells are ``missing``).

Its parameters then never change: a branch disconnected from the loss, a layer the forward
pass skips, a head the loss does not use. The writers log such a variable as missing (and
warn once in the console), so only the analysis of the whole run can call it a finding: one
logged gradient anywhere withdraws it (`Rule.holds`).
"""

import numpy as np

from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.rule import Rule

_NO_GRADIENT = Wording.define(
    "never_updated.no_gradient", "received no gradient while other variables did (disconnected "
    "from the loss, or unused by the forward pass), so it never trained")


class NeverUpdated(Rule):
    name = "never_updated"
    kind = "never_updated"

    def alerts(self, evidence, builder):
        sustain = evidence.thresholds.sustain_steps
        missing = evidence.missing
        others_present = ~missing.all(axis=1)
        without = missing & others_present[:, None]
        no_update = np.zeros(len(missing))  # the value: no gradient, so no update at all
        for row in flagged_columns(without):
            # It holds (`holds`) from its sustain_steps-th step with gradients elsewhere on.
            builder.add(self.kind, "no_gradient", "warning", without[:, row], no_update, np.max,
                        0.0, _NO_GRADIENT, row=row, raised_at_hit=sustain - 1)

    def holds(self, finding, gradient_rows, thresholds):
        """Only while the variable missed every logged step with a gradient, and for at least
        ``sustain_steps`` of them: a run's first step or two may not reach every branch."""
        return finding.steps == gradient_rows and finding.steps >= thresholds.sustain_steps
