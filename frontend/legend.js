// The heatmap's legend under the plot: the colour bar labelled in the stat's own units, then a
// chip per class the vocabulary puts in the legend, painted as its cells are (a hatched class over
// the end of the colour map its values sit at, a filled class in its fill, the empty cell empty),
// then the dots beside the row labels: one per severity, as a row with such an alert has it, and
// the dashed epoch line while the cells show one.

import { EPOCH_LINE, viridis } from "./colormap.js";
import { el, replaceChildren } from "./dom.js";
import { formatValue } from "./format.js";

const BAR_WIDTH = 200;
const BAR_HEIGHT = 10;
const CHIP_POSITION = { low: 0.1, high: 0.9 }; // where on the colour map a class's chip sits
const EPOCH_CHIP_POSITION = 0.3; // the epoch line's chip: a dashed line on a dark cell colour

export class Legend {
  constructor(vocabulary) {
    this.root = el("div", { class: "colorbar" });
    // The bar and the chips never change: drawn once, placed again on every draw.
    this.bar = el("canvas", { class: "colorbar-gradient", width: BAR_WIDTH, height: BAR_HEIGHT });
    const context = this.bar.getContext("2d");
    for (let x = 0; x < BAR_WIDTH; x++) {
      context.fillStyle = `rgb(${viridis(x / (BAR_WIDTH - 1)).join(",")})`;
      context.fillRect(x, 0, 1, BAR_HEIGHT);
    }
    this.chips = vocabulary.legendClasses().map((cls) => classChip(cls, vocabulary));
    this.rowDots = el("span", { class: "legend-dots", "data-testid": "legend-dots" },
      "dot beside a row: its most urgent alert,",
      vocabulary.severities.map(({ name }) => el("span", { class: "legend-item" },
        el("span", { class: "dot", style: `background: ${vocabulary.severityVar(name)}` }), name)));
    this.epochLine = el("span", { class: "legend-item", "data-testid": "legend-epochs" },
      el("span", {
        class: "chip chip-epoch",
        style: `--epoch-line: ${EPOCH_LINE.color}; --epoch-dash: ${EPOCH_LINE.dash[0]}px; `
          + `background-color: rgb(${viridis(EPOCH_CHIP_POSITION).join(",")})`,
      }), "dashed line: an epoch starts");
  }

  /**
   * The legend of a colour scale (colormap.makeScale) of `stat`; `epochLines`: how many epoch
   * lines the cells show (the dashed line is explained only then).
   */
  draw(scale, stat, { epochLines = 0 } = {}) {
    const unit = scale.kind === "log" ? " (log scale)" : "";
    replaceChildren(
      this.root,
      el("span", { class: "colorbar-label" }, formatValue(scale.domain[0])),
      this.bar,
      el("span", { class: "colorbar-label" }, formatValue(scale.domain[1])),
      el("span", { class: "colorbar-unit" }, `${stat}${unit}`),
      this.chips,
      epochLines ? this.epochLine : null,
      this.rowDots,
    );
  }
}

function classChip(cls, vocabulary) {
  const style = [];
  if (cls.fill) style.push(`background: ${vocabulary.classVar(cls.name, "fill")}`);
  else if (cls.extreme) style.push(`background: rgb(${viridis(CHIP_POSITION[cls.extreme]).join(",")})`);
  if (cls.hatch) {
    style.push(`--hatch-color: ${vocabulary.classVar(cls.name, "hatch")}`,
      `--hatch-angle: ${vocabulary.classVar(cls.name, "hatch-angle")}`);
  }
  const kind = cls.empty ? " chip-empty" : cls.hatch ? " chip-hatched" : "";
  return el("span", { class: "legend-item" },
    el("span", { class: `chip${kind}`, style: style.join("; ") || null }), cls.label);
}
