"""The vanishing rule: a layer's gradient norm, sustained, below an absolute floor or far below
the output-side layers (the depth profile): class ``vanishing`` on the layer's variables,
warnings per layer.

Both judge layers (all of a layer's variables together), not single variables: a legitimately
tiny variable next to a healthy one is not a vanishing gradient. A batch-norm beta followed by
another normalisation gets almost no gradient by construction (the next layer subtracts its
shift), while its gamma trains; a final bias is tiny next to its kernel.

Both judge `Evidence.finite_norms`: a NaN/Inf gradient's norm says nothing about vanishing.

A depth finding is an episode with hysteresis (see ``depth_ratio``): it begins when the layer
falls below ``depth_ratio`` x the output side for ``sustain_steps``, and ends only when the
layer itself recovers, not when the output side shrinks toward it. The episode's recovery level
is state that reaches back to its first step, so a stream (`analysis.stream`) carries each
layer's level to its next round; the rest looks back and ahead at most ``sustain_steps - 1``.
"""

import dataclasses
import math
from typing import List, Optional, Tuple

import numpy as np

from tensorboard_gradients.analysis import window
from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.classes import VANISHING
from tensorboard_gradients.analysis.layers import Layers
from tensorboard_gradients.analysis.rule import Parameter, Rule

VANISHING_NORM = Parameter(
    "vanishing_norm", 1e-7, float, "vanishing below (norm)", in_form=True, doc="""
Absolute floor for one layer's gradient norm (all its variables together). Below it EVERY
entry is below 1e-7, which is Keras Adam's ``epsilon`` (PyTorch: 1e-8): Adam's step
``g / (sqrt(v) + eps)`` shrinks toward zero there, and a plain SGD step ``lr * g`` on
weights of order 1 is below float32's relative resolution (6e-8) for any learning rate
<= 1, i.e. rounded away. Judged per layer: a healthy MobileNet's batch-norm betas that feed
another normalisation sit at 1e-8 while their gammas train.
""")

DEPTH_RATIO = Parameter(
    "depth_ratio", 1e-4, float, "vanishing by depth below (x output layers)", in_form=True,
    doc="""
Depth profile (Glorot & Bengio 2010, "Understanding the difficulty of training deep
feedforward neural networks": back-propagated gradients shrink toward the input with a
poor activation/initialisation): a LAYER whose gradient norm (all its variables together)
is below this fraction of the output-side layers' norm at the same step is vanishing. Four
orders of magnitude: healthy networks, including ones with normalisation layers and
residual branches, keep layers within one or two orders of each other; the demo's
12-layer sigmoid network drops below 1e-4 at its input side. Judged per layer, not per
variable, so a legitimately tiny variable (a final bias next to its kernel) is not flagged.

Once flagged, a layer stays flagged until it recovers by itself: the finding ends at the first
of ``sustain_steps`` consecutive logged steps where the layer's own norm is back above
``depth_ratio`` x the output side's norm at the step the finding began (its recovery level)
and no longer below ``depth_ratio`` x the output side's current norm. The output side
shrinking toward a layer whose own gradient stays where it was is not a recovery (its loss
fell, or its layers converged, while the input side stays stalled). This is hysteresis, as a
Schmitt trigger's separate on and off levels, or the recovery threshold of alerting systems
(Datadog monitors' ``critical_recovery``; Oracle Cloud's metric alerts clear once the value
has stayed back within the threshold for the alert's period): one noisy step is no more a
recovery than it is an alert. A level fixed when the finding begins, not the output side's
level at each step, is what makes it the layer's own recovery.
""")

DEPTH_REFERENCE_FRACTION = Parameter(
    "depth_reference_fraction", 0.25, float, "output-side layers (fraction of layers)",
    maximum=1, doc="""
The output-side reference: the median norm of the last quarter of the layers (at least
one layer), so one odd output layer does not set the scale. Output-side layers above
``exploding_norm`` do not count: an exploding output side would otherwise make every
healthy layer below it look vanishing.
""")

CONVERGED_LOSS_FRACTION = Parameter(
    "converged_loss_fraction", 1e-2, float, "converged below (x the first loss)", maximum=1,
    doc="""
A layer that vanishes while the logged loss is at most this fraction of the run's first
logged (finite) loss is an ``info`` finding, not a warning: a converged model's gradients are
small because its loss is (issue 35: a small transformer that converged to a loss of ~1e-8 got
16 vanishing warnings; on the instability set an MLP interpolating its data, loss 1e-15, got
3). A stalled model's loss stays near where it began. Without a logged loss, a warning.
""")

SUSTAIN_STEPS = Parameter(
    "sustain_steps", 5, int, "sustained for (logged steps)", in_form=True, doc="""
Vanishing and dead gradients must hold for this many consecutive logged steps: one noisy
step is not an alert (and not a highlighted cell). A jump that stays up this long is a change
of level, not a spike; a variable without a gradient for fewer logged steps is not yet
never updated.
""")


@dataclasses.dataclass
class DepthProfile:
    """Each layer's gradient norm relative to the output side's, at every step."""

    ratios: np.ndarray  # [steps, layers] layer norm / output-side reference norm
    vanishing: np.ndarray  # [steps, layers] in a depth episode (see DEPTH_RATIO), norm logged


# What a stream carries to its next round under this key: the recovery level of each layer's
# episode holding before the round's first fresh row (NaN: none), by variable (its layer's).
_EPISODES = "depth_episodes"
# ... and the run's first finite logged loss, the reference of convergence.
_FIRST_LOSS = "first_loss"
# Rows an episode scan looks at per column and pass: the scan loops per event and per this
# many rows, never per step.
_SCAN_ROWS = 256


_ABSOLUTE = Wording.define("vanishing.absolute",
                           "gradient norm stayed below {limit:g} (down to {value:.3g})")
_DEPTH = Wording.define(
    "vanishing.depth",
    "gradient norm fell to {value:.3g}x that of the output-side layers (below {limit:g})")


class Vanishing(Rule):
    name = "vanishing"
    kind = "vanishing"
    cell_class = VANISHING
    parameters = (VANISHING_NORM, DEPTH_RATIO, DEPTH_REFERENCE_FRACTION, CONVERGED_LOSS_FRACTION,
                  SUSTAIN_STEPS)

    def _layers(self, evidence) -> Tuple[List[str], np.ndarray, np.ndarray]:
        """(layer names, row -> layer position, ``[steps, layers]`` finite layer norms)."""
        layers = Layers.of(evidence.series.layers)
        return layers.names, layers.rows, layers.root_sum_squares(evidence.finite_norms)

    def _below_floor(self, evidence) -> np.ndarray:
        """``bool[steps, layers]``: the layer's norm below the floor, sustained."""
        limits = evidence.thresholds
        _, _, layer_norms = evidence.once(self._layers)
        with np.errstate(invalid="ignore"):
            return window.sustained(layer_norms < limits.vanishing_norm, limits.sustain_steps)

    def _depth_profile(self, evidence) -> Optional[DepthProfile]:
        """None for a model of one layer: it has no depth to compare along."""
        limits = evidence.thresholds
        names, rows, layer_norms = evidence.once(self._layers)
        if len(names) < 2:
            return None
        reference_count = max(1, int(math.ceil(len(names) * limits.depth_reference_fraction)))
        output_side = layer_norms[:, -reference_count:]
        with np.errstate(invalid="ignore"):
            healthy = np.where(output_side >= limits.exploding_norm, np.nan, output_side)
        reference = window.nanmedian(healthy)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            ratios = layer_norms / reference[:, None]
            below = ratios < limits.depth_ratio
            # float32, so that a level a stream carries is the very level a whole series uses.
            onset_levels = (limits.depth_ratio * reference).astype(np.float32)
        # The layer's lowest norm over the sustain_steps steps from each one, when none of them
        # is below the depth ratio or unlogged (-inf otherwise, and where fewer steps follow).
        clear = np.where(below | np.isnan(layer_norms), -np.inf, layer_norms)
        recovery = np.full(clear.shape, -np.inf)
        lowest = window.min_in_window(clear, limits.sustain_steps)
        recovery[:len(lowest)] = lowest
        carried = evidence.kept(_EPISODES)
        ongoing = np.full(len(names), np.nan, np.float32)
        if carried is not None:
            ongoing[rows] = carried[0]
        levels = _episodes(window.sustained(below, limits.sustain_steps), onset_levels,
                           recovery, ongoing, evidence.fresh)
        if evidence.resume_row is not None:
            resume = evidence.resume_row - evidence.first_row
            holding = levels[resume - 1] if resume > evidence.fresh else ongoing
            evidence.keep(_EPISODES, (holding[rows],))
        return DepthProfile(ratios, ~np.isnan(levels) & ~np.isnan(layer_norms))

    def cells(self, evidence):
        _, rows, _ = evidence.once(self._layers)
        vanishing = evidence.once(self._below_floor)
        depth = evidence.once(self._depth_profile)
        if depth is not None:
            vanishing = vanishing | depth.vanishing
        return vanishing[:, rows] & ~evidence.missing

    def _converged(self, evidence) -> np.ndarray:
        """``bool[steps]``: the logged loss at most ``converged_loss_fraction`` of the run's
        first finite logged loss (carried from round to round of a stream, in float32)."""
        kept = evidence.kept(_FIRST_LOSS)
        first = None if kept is None else np.float32(kept[0][0])
        loss, logged = evidence.loss, evidence.loss_logged & np.isfinite(evidence.loss)
        if first is None and logged.any():
            first = np.float32(loss[np.argmax(logged)])
        if first is None:
            return np.zeros(len(loss), bool)
        evidence.keep(_FIRST_LOSS, (np.array([first], np.float32),))
        with np.errstate(invalid="ignore"):
            return logged & (loss <= evidence.thresholds.converged_loss_fraction * abs(first))

    def alerts(self, evidence, builder):
        limits = evidence.thresholds
        # Vanishing after the loss converged is information; at any step before, a warning.
        escalated = ("warning", ~evidence.once(self._converged))
        names, _, layer_norms = evidence.once(self._layers)
        below_floor = evidence.once(self._below_floor)
        for position in flagged_columns(below_floor):
            builder.add(
                self.kind, "absolute", "info", below_floor[:, position],
                layer_norms[:, position], np.min, limits.vanishing_norm,
                _ABSOLUTE.bound(limit=limits.vanishing_norm),
                layer=names[position], raised_at_hit=limits.sustain_steps - 1,
                escalated=escalated,
            )
        depth = evidence.once(self._depth_profile)
        if depth is None:
            return
        for position in flagged_columns(depth.vanishing):
            builder.add(
                self.kind, "depth", "info", depth.vanishing[:, position],
                depth.ratios[:, position], np.min, limits.depth_ratio,
                _DEPTH.bound(limit=limits.depth_ratio),
                layer=names[position], raised_at_hit=limits.sustain_steps - 1,
                escalated=escalated,
            )


def _episodes(onsets, onset_levels, recovery, ongoing, first: int) -> np.ndarray:
    """``float32[steps, layers]``: the recovery level of the episode holding each row (NaN:
    none; rows before ``first`` are context and NaN).

    An episode begins at a row of ``onsets`` (``bool[steps, layers]``) that no episode holds,
    with that row's ``onset_levels`` (``[steps]``), and holds every row until the first row
    whose ``recovery`` (``[steps, layers]``) reaches its level, which it does not hold.
    ``ongoing`` (``[layers]``): the levels of the episodes holding before row ``first``.

    An episode's end depends on where it began, so columns are scanned in step order; each pass
    takes every live column's next `_SCAN_ROWS` rows at once and stops each at its next event.
    """
    steps, columns = onsets.shape
    levels = np.full((steps, columns), np.nan, np.float32)
    if first >= steps:
        return levels
    level = np.array(ongoing, np.float32)
    row = np.full(columns, first)
    # Past its last onset (-1: none) a column outside an episode has nothing left to find.
    last_onset = np.where(onsets[first:].any(axis=0),
                          steps - 1 - np.argmax(onsets[::-1], axis=0), -1)
    offsets = np.arange(_SCAN_ROWS)
    while True:
        seeking = np.isnan(level)
        live = np.flatnonzero((row < steps) & (~seeking | (row <= last_onset)))
        if not live.size:
            return levels
        span = row[live, None] + offsets
        inside = span < steps
        span = np.minimum(span, steps - 1)
        column = np.broadcast_to(live[:, None], span.shape)
        searching = seeking[live, None]
        current = level[live, None]
        hits = inside & np.where(searching, onsets[span, column], recovery[span, column] >= current)
        found = hits.any(axis=1)
        reach = np.where(found, hits.argmax(axis=1), _SCAN_ROWS)
        held = inside & ~searching & (offsets < reach[:, None])
        levels[span[held], column[held]] = np.broadcast_to(current, span.shape)[held]
        events = row[live] + reach
        begins = found & seeking[live]
        level[live[begins]] = onset_levels[events[begins]]
        level[live[found & ~seeking[live]]] = np.nan
        row[live] = events
