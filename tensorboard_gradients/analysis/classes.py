"""The cell classes of the heatmap: their codes, their order of alarm and their tooltip texts."""

# Cell classes, ordered from least to most alarming: merging cells keeps the largest code.
CLASSES = ("missing", "ok", "vanishing", "spike", "exploding", "nonfinite")
MISSING, OK, VANISHING, SPIKE, EXPLODING, NONFINITE = range(len(CLASSES))

# One line per class for the tab's tooltip (which rules produce each class: `rules.RULES`).
CLASS_DESCRIPTIONS = {
    "missing": "no gradient at this step",
    "ok": "ok (no rule fired)",
    "vanishing": "vanishing (norm below the floor, or far below the output-side layers, "
                 "for several logged steps, until the layer itself recovers)",
    "spike": "spike (norm jumped far above its running median, and carries a real share of "
             "the step's global norm)",
    "exploding": "exploding (norm above the ceiling)",
    "nonfinite": "NaN/Inf in the gradient",
}
