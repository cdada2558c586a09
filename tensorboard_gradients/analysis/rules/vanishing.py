"""The vanishing rule: a gradient norm, sustained, below an absolute floor (per variable) or far
below the output-side layers (per layer, the depth profile): class ``vanishing``, warnings.

Both judge `Evidence.finite_norms`: a NaN/Inf gradient's norm says nothing about vanishing.
"""

import dataclasses
import math
from typing import List, Optional, Tuple

import numpy as np

from tensorboard_gradients.analysis import window
from tensorboard_gradients.analysis.alerts import Wording, flagged_columns
from tensorboard_gradients.analysis.classes import VANISHING
from tensorboard_gradients.analysis.rule import Parameter, Rule

VANISHING_NORM = Parameter(
    "vanishing_norm", 1e-7, float, "vanishing below (norm)", in_form=True, doc="""
Absolute floor for one variable's gradient norm. Below it EVERY entry is below 1e-7, which
is Keras Adam's ``epsilon`` (PyTorch: 1e-8): Adam's step ``g / (sqrt(v) + eps)`` shrinks
toward zero there, and a plain SGD step ``lr * g`` on weights of order 1 is below float32's
relative resolution (6e-8) for any learning rate <= 1, i.e. rounded away.
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
""")

DEPTH_REFERENCE_FRACTION = Parameter(
    "depth_reference_fraction", 0.25, float, "output-side layers (fraction of layers)",
    maximum=1, doc="""
The output-side reference: the median norm of the last quarter of the layers (at least
one layer), so one odd output layer does not set the scale. Output-side layers above
``exploding_norm`` do not count: an exploding output side would otherwise make every
healthy layer below it look vanishing.
""")

SUSTAIN_STEPS = Parameter(
    "sustain_steps", 5, int, "sustained for (logged steps)", in_form=True, doc="""
Vanishing and dead gradients must hold for this many consecutive logged steps: one noisy
step is not an alert (and not a highlighted cell).
""")


@dataclasses.dataclass
class DepthProfile:
    """Each layer's gradient norm relative to the output side's, at every step."""

    layers: List[str]  # layer names in model order
    rows: np.ndarray  # variable row -> position in ``layers``
    ratios: np.ndarray  # [steps, layers] layer norm / output-side reference norm
    vanishing: np.ndarray  # [steps, layers] ratio below depth_ratio, sustained


def _layer_index(series) -> Tuple[List[str], np.ndarray]:
    """(layer names in model order, row -> layer position)."""
    names: List[str] = []
    positions = {}
    rows = []
    for layer in series.layers:
        if layer not in positions:
            positions[layer] = len(names)
            names.append(layer)
        rows.append(positions[layer])
    return names, np.array(rows, dtype=np.int64)


def _layer_norms(norms: np.ndarray, rows: np.ndarray, layer_count: int) -> np.ndarray:
    """``[steps, layers]`` norm of each layer's variables together (NaN when all are missing)."""
    order = np.argsort(rows, kind="stable")
    if (np.diff(rows) < 0).any():  # layers interleaved (shared or reused layers): group them
        norms, rows = norms[:, order], rows[order]
    boundaries = np.searchsorted(rows, np.arange(layer_count))
    valid = ~np.isnan(norms)
    with np.errstate(over="ignore"):
        squares = np.add.reduceat(np.where(valid, norms, 0.0) ** 2, boundaries, axis=1)
    present = np.logical_or.reduceat(valid, boundaries, axis=1)
    return np.where(present, np.sqrt(squares), np.nan)


_ABSOLUTE = Wording.define("vanishing.absolute",
                           "gradient norm stayed below {limit:g} (down to {value:.3g})")
_DEPTH = Wording.define(
    "vanishing.depth",
    "gradient norm fell to {value:.3g}x that of the output-side layers (below {limit:g})")


class Vanishing(Rule):
    name = "vanishing"
    kind = "vanishing"
    cell_class = VANISHING
    parameters = (VANISHING_NORM, DEPTH_RATIO, DEPTH_REFERENCE_FRACTION, SUSTAIN_STEPS)

    def _below_floor(self, evidence) -> np.ndarray:
        limits = evidence.thresholds
        with np.errstate(invalid="ignore"):
            return window.sustained(evidence.finite_norms < limits.vanishing_norm,
                                    limits.sustain_steps)

    def _depth_profile(self, evidence) -> Optional[DepthProfile]:
        """None for a model of one layer: it has no depth to compare along."""
        limits = evidence.thresholds
        names, rows = _layer_index(evidence.series)
        if len(names) < 2:
            return None
        layer_norms = _layer_norms(evidence.finite_norms, rows, len(names))
        reference_count = max(1, int(math.ceil(len(names) * limits.depth_reference_fraction)))
        output_side = layer_norms[:, -reference_count:]
        with np.errstate(invalid="ignore"):
            healthy = np.where(output_side >= limits.exploding_norm, np.nan, output_side)
        reference = window.nanmedian(healthy)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = layer_norms / reference[:, None]
            vanishing = window.sustained(ratios < limits.depth_ratio, limits.sustain_steps)
        return DepthProfile(names, rows, ratios, vanishing)

    def cells(self, evidence):
        below_floor = evidence.once(self._below_floor)
        depth = evidence.once(self._depth_profile)
        if depth is None:
            return below_floor
        return below_floor | (depth.vanishing[:, depth.rows] & ~evidence.missing)

    def alerts(self, evidence, builder):
        limits = evidence.thresholds
        below_floor = evidence.once(self._below_floor)
        for row in flagged_columns(below_floor):
            builder.add(
                self.kind, "absolute", "warning", below_floor[:, row], evidence.norms[:, row],
                np.min, limits.vanishing_norm,
                _ABSOLUTE.bound(limit=limits.vanishing_norm),
                row=row,
            )
        depth = evidence.once(self._depth_profile)
        if depth is None:
            return
        for position in flagged_columns(depth.vanishing):
            builder.add(
                self.kind, "depth", "warning", depth.vanishing[:, position],
                depth.ratios[:, position], np.min, limits.depth_ratio,
                _DEPTH.bound(limit=limits.depth_ratio),
                layer=depth.layers[position],
            )
