"""The tab's one vocabulary: what it calls and how it draws every statistic, cell class, alert
severity and threshold, served by the ``thresholds`` route (``"vocabulary"``).

The frontend, its stylesheet (through custom properties the tab sets from this answer) and the
tests take these from here; none of them keeps its own list. The names and their order come from
the tables they describe: `columns.STATS` (statistics), `analysis.CLASSES` (cell classes, later
= worse), `analysis.SEVERITIES` (most urgent first) and `analysis.PARAMETERS` (thresholds), so
a new statistic or rule parameter reaches the tab without a frontend edit. Only how a class or a
severity LOOKS is defined here (`CLASS_STYLES`, `SEVERITY_COLORS`).
"""

import copy

from tensorboard_gradients import analysis
from tensorboard_gradients.format import columns

# How the tab draws each `analysis.CLASSES` class:
#   label: its word in the legend and tooltips;
#   fill: the cell colour replacing the value's colour (RGB), or None;
#   hatch: stripes drawn over the value's colour, ``{"rgb", "angle"}`` with the angle in degrees
#     as in CSS ``repeating-linear-gradient``, or None;
#   accent: the class's colour on the light panel (threshold lines in charts, markers);
#   tooltip: its text colour on the dark tooltip;
#   legend: whether the legend shows a chip for it;
#   empty: the class has no value (the cell and its chip show the empty background);
#   extreme: the end of the value range the class stands for, "low" or "high" (a merged cell
#     keeps its most extreme value; the legend chip shows that end of the colour map), or None;
#   norm_threshold: the `analysis.Thresholds` field on the L2 norm that separates the class from
#     "ok" (a line on the details chart; a "high" one also caps the heatmap's colour scale);
#   nonfinite: the class of NaN/Inf (its first alert is called out above the alert list, its
#     colour marks the non-finite points of a chart).
# Values are drawn on the viridis map (perceptually uniform, colour-blind safe), so no class
# colour below occurs in viridis, whose hues run from dark purple through blue and green to
# yellow: a marked cell never reads as a value. And the two classes that keep their value's
# colour are hatched, in opposite directions, so the class reads without the colour bar and
# without colour vision.
CLASS_STYLES = {
    # No gradient at this step: no value and no colour, the cell shows the empty background.
    "missing": {"label": "no gradient", "fill": None, "hatch": None, "accent": None,
                "tooltip": None, "legend": True, "empty": True},
    # Healthy: the value's colour alone, nothing to explain in the legend.
    "ok": {"label": "ok", "fill": None, "hatch": None, "accent": None, "tooltip": None,
           "legend": False},
    # Vanishing values sit at the dark end of the map, so their stripes are pale cyan. The
    # accent is a cyan too, the same hue family on the light panel; the tooltip's lighter cyan
    # stays readable on dark grey.
    "vanishing": {"label": "vanishing", "fill": None,
                  "hatch": {"rgb": [200, 240, 255], "angle": -45},
                  "accent": "#12b5cb", "tooltip": "#9be7ff", "legend": True,
                  "extreme": "low", "norm_threshold": "vanishing_norm"},
    # A spike can have any value's colour (a jump against its own history, at any level; a
    # merged cell keeps its highest), so its stripes are magenta, a hue viridis never reaches,
    # and horizontal: they cross neither diagonal class's. Accent and tooltip are the same
    # magenta family, readable on the light panel and on dark grey.
    "spike": {"label": "spike", "fill": None,
              "hatch": {"rgb": [235, 0, 235], "angle": 0},
              "accent": "#c51fc5", "tooltip": "#f48fff", "legend": True, "extreme": "high"},
    # Exploding values sit at the bright yellow end of the map, so their stripes are dark red.
    # The accent is orange, apart from both the map's yellow and the non-finite red; the
    # tooltip's lighter orange stays readable on dark grey.
    "exploding": {"label": "exploding", "fill": None,
                  "hatch": {"rgb": [150, 0, 20], "angle": 45},
                  "accent": "#f29900", "tooltip": "#ffb74d", "legend": True,
                  "extreme": "high", "norm_threshold": "exploding_norm"},
    # NaN/Inf has no value to colour: a saturated red fills the cell, a hue viridis never
    # reaches; the accent is that red, the tooltip's lighter red stays readable on dark grey.
    "nonfinite": {"label": "NaN/Inf", "fill": [255, 45, 85], "hatch": None,
                  "accent": "#ff2d55", "tooltip": "#ff8a80", "legend": True,
                  "extreme": "high", "nonfinite": True},
}
_CLASS_STYLE_DEFAULTS = {"empty": False, "extreme": None, "norm_threshold": None,
                         "nonfinite": False}

# Alert severities on the light panel (an alert's edge, the outline of a clicked alert's cells):
# red for critical, the exploding orange for warnings, the tab's own blue for information.
SEVERITY_COLORS = {"critical": "#d93025", "warning": "#f29900", "info": "#1a73e8"}


def vocabulary() -> dict:
    """The JSON-ready vocabulary (a new copy on each call)::

        {"stats": [{"name", "label", "scale", "group", "description", "heatmap"}, ...],
         "classes": [{"name", "description", "label", "fill", "hatch", "accent", "tooltip",
                      "legend", "empty", "extreme", "norm_threshold", "nonfinite"}, ...],
         "severities": [{"name", "color"}, ...],
         "thresholds": [{"name", "label", "default", "in_form", "description"}, ...]}

    Each in the order of its table: `columns.STATS`,
    `analysis.CLASSES` (later = worse), `analysis.SEVERITIES` (most urgent first),
    `analysis.PARAMETERS`.
    """
    return {
        "stats": [
            {"name": stat.name, "label": stat.label, "scale": stat.scale, "group": stat.group,
             "description": stat.description, "heatmap": stat.heatmap}
            for stat in columns.STATS
        ],
        "classes": [
            {"name": name, "description": analysis.CLASS_DESCRIPTIONS[name],
             **_CLASS_STYLE_DEFAULTS, **copy.deepcopy(CLASS_STYLES[name])}
            for name in analysis.CLASSES
        ],
        "severities": [
            {"name": name, "color": SEVERITY_COLORS[name]} for name in analysis.SEVERITIES
        ],
        "thresholds": [
            {"name": parameter.name, "label": parameter.label, "default": parameter.default,
             "in_form": parameter.in_form, "description": _unwrapped(parameter.doc)}
            for parameter in analysis.PARAMETERS
        ],
    }


def _unwrapped(text: str) -> str:
    """Source-wrapped text (a docstring) as paragraphs of one line each, for the tab's tooltips."""
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in text.strip().split("\n\n"))


if __name__ == "__main__":  # regenerates the Node tests' copy: frontend/test/served_vocabulary.json
    import json

    print(json.dumps(vocabulary(), indent=1, allow_nan=False))
