"""The registry: every diagnosis rule, in order. One module per rule.

The order is the order of `Thresholds` fields (each rule's `Rule.parameters` in turn), of
`KINDS` and of alerts that tie in the sort (same severity, first step and variable). It is not
an order of evaluation: a rule asks `Evidence` for the findings it depends on.

To add a rule: write ``rules/<name>.py`` with a `Rule` subclass (and its `Parameter`s), then
add one instance here.
"""

from typing import Dict, Tuple

from tensorboard_gradients.analysis.rule import Rule
from tensorboard_gradients.analysis.rules import (
    dead, exploding, loss_spike, never_updated, nonfinite, spike, update_ratio, vanishing,
)

RULES: Tuple[Rule, ...] = (
    nonfinite.Nonfinite(),
    exploding.Exploding(),
    spike.Spike(),
    loss_spike.LossSpike(),
    vanishing.Vanishing(),
    dead.Dead(),
    never_updated.NeverUpdated(),
    update_ratio.UpdateRatio(),
)

# Bumped whenever a rule judges the same series differently: a long run's digest written under
# another revision is recomputed, not served (`digest.analysis_identity`). 2: a vanishing-by-depth
# finding lasts until its layer recovers by itself (issue 33). 3: the loss-spike rule; alerts carry
# their raised step (issue 35).
# 4: the update precursor, surges (issue 35). 5: the sustained and jump precursors (issue 35).
RULES_REVISION = 5

PARAMETERS = tuple(parameter for rule in RULES for parameter in rule.parameters)

KINDS = tuple(dict.fromkeys(rule.kind for rule in RULES))


def of_kind(kind: str) -> Tuple[Rule, ...]:
    """The rules whose alerts have this `Alert.kind` (e.g. ``spike``: the spike rule)."""
    return tuple(rule for rule in RULES if rule.kind == kind)


def lacking(series) -> Dict[str, Tuple[str, ...]]:
    """``{rule name: the stats it needs that series lacks}`` of each rule that cannot judge
    ``series`` (`Rule.needs`), in rule order: what a report of its alerts must say was not
    judged."""
    return {rule.name: tuple(n for n in rule.needs if n not in series.available_stats)
            for rule in RULES if not rule.judges(series)}
