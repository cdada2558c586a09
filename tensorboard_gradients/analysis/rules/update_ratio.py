"""The update-ratio rule: a kernel whose update/weight ratio lies far outside the healthy band
over the run (info alerts; no cell class: it judges the run's median, not single steps).

It judges only the update the optimizer really made (``update_l2_norm``). The gradient/weight
ratio alone says nothing about the update under an adaptive optimizer: Adam's step is about
``lr`` per entry whatever the gradient's size, so healthy AdamW runs have gradient/weight
ratios of 10 and more, which a band scaled by an assumed SGD learning rate would call
rewritten weights. That ratio is logged and drawn, not judged.
"""

import warnings

import numpy as np

from tensorboard_gradients.analysis import window
from tensorboard_gradients.analysis.alerts import Wording
from tensorboard_gradients.analysis.rule import Parameter, Rule

UPDATE_RATIO_LOW = Parameter(
    "update_ratio_low", 1e-5, float, "update/weight ratio below", doc="""
Together with ``update_ratio_high``: the update/weight ratio ``||w_new - w_old|| / ||w||``
of a healthy layer is around 1e-3 (CS231n notes, "Neural Networks Part 3"; Karpathy's
makemore part 3 plots its log10 per layer). Two decades either side is "far outside": a
variable whose median ratio over the run lies outside [1e-5, 1e-1] is barely learning or
being rewritten every step.

Judged for kernels only (variables of 2+ dimensions), as Karpathy's plot does: biases
and normalisation scales start at 0 or 1, so their early ratios are large by
construction and say nothing about the learning rate.

Needs ``update_l2_norm`` and ``weight_l2_norm`` (the Keras monitor logs both unless its
``stats=`` leaves them out).
""")

UPDATE_RATIO_HIGH = Parameter(
    "update_ratio_high", 1e-1, float, "update/weight ratio above", doc="""
The upper end of that band (see ``update_ratio_low``).
""")


_BELOW = Wording.define("update_ratio.below",
                        "median {what} {value:.3g} is below {limit:g} (barely learning)")
_ABOVE = Wording.define(
    "update_ratio.above", "median {what} {value:.3g} is above {limit:g} (weights rewritten every "
    "step)")


class UpdateRatio(Rule):
    name = "update_ratio"
    kind = "update_ratio"
    parameters = (UPDATE_RATIO_LOW, UPDATE_RATIO_HIGH)
    needs = ("update_weight_ratio",)

    def check(self, thresholds):
        if thresholds.update_ratio_low >= thresholds.update_ratio_high:
            raise ValueError("threshold update_ratio_low must be below update_ratio_high")

    # The median over the whole run: a stream (`analysis.stream`) keeps this rule's `record`
    # of every round and calls `alerts_on` the whole record.
    whole_run = True

    def record(self, evidence):
        """``(rule, rows, ratios)``: the update/weight ratio (``rule`` names it in alerts) of
        the kernels (variables ``rows``), ``[steps, len(rows)]`` in float32, NaN at
        non-finite steps; None when the series did not log it."""
        series = evidence.series
        if not self.judges(series):
            return None
        rows = np.array([row for row, shape in enumerate(series.shapes)
                         if shape is not None and len(shape) >= 2], dtype=np.int64)
        # A NaN/Inf step's ratio describes no update. float32: the statistics' precision, and
        # half the bytes of the record a stream keeps of every step (and writes, `state`).
        ratios = np.where(evidence.nonfinite[:, rows], np.nan,
                          series.stat("update_weight_ratio")[:, rows]).astype(np.float32)
        return "update/weight", rows, ratios

    def alerts(self, evidence, builder):
        self.alerts_on(self.record(evidence), evidence.thresholds, builder)

    def alerts_on(self, record, limits, builder):
        """This rule's alerts from a `record` of the whole run (None: nothing to judge)."""
        if record is None:
            return
        rule, rows, ratios = record
        what = f"{rule} ratio"
        low, high = limits.update_ratio_low, limits.update_ratio_high
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            medians = np.nanmedian(ratios, axis=0)
        for column, median in enumerate(medians):
            if not np.isfinite(median) or low <= median <= high:
                continue
            too_low = median < low
            with np.errstate(invalid="ignore"):
                mask = ratios[:, column] < low if too_low else ratios[:, column] > high
            # Raised where the median of the steps so far first left the band on this side,
            # once the side had a step (its first step).
            outside = window.first_expanding_median(
                ratios[:, column], (lambda m: m < low) if too_low else (lambda m: m > high),
                from_row=int(np.argmax(mask)))
            builder.add(
                self.kind, rule, "info", mask, ratios[:, column], lambda _: median,
                low if too_low else high,
                (_BELOW if too_low else _ABOVE).bound(what=what, limit=low if too_low else high),
                row=int(rows[column]), raised_step=int(builder.steps[outside]),
            )
