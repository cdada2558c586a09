// Two runs compared (compare.js computes, this draws): side by side, both heatmaps on the same
// rows and columns under one colour scale, or one heatmap of log10(this run / the other) on a
// diverging scale. Rows only one run has are hatched grey and labelled "only in <run>"; hovering
// a cell names both runs' values and their ratio. Also the toolbar's "Compare with" picker and
// the mode toggle, which the toolbar places and shows.

import { HeatmapAxes } from "./axes.js";
import { cellValueText } from "./cells.js";
import { makeScale, viridis } from "./colormap.js";
import {
  DEFAULT_COMPARE_MODE, UNMATCHED_HATCH_RGB, UNMATCHED_RGB, describeCell, divergingColor, divergingScale,
  hatchRows, rasterizeRatio, rowLabel, unmatchedRows, unmatchedSummary,
} from "./compare.js";
import { Picker, Segmented } from "./controls.js";
import { el, replaceChildren, sizeCanvas } from "./dom.js";
import { counted, ellipsize, formatStepRange, formatValue } from "./format.js";
import { gridLayout } from "./layout.js";
import { classPaints, rasterize } from "./raster.js";

const LABEL_WIDTH = 240; // CSS px, as the heatmap's label column
const MIN_LABEL_ROW = 10;
const BAR_WIDTH = 200; // as the heatmap's colour bar
const RATIO_BAR_WIDTH = 360; // room for up to seven ratio labels ("1/1000x")
const BAR_HEIGHT = 10;
const PANE_GAP = 12; // CSS px between the two heatmaps side by side
const MODE_LABELS = { side: "Side by side", ratio: "Ratio" };

/**
 * The toolbar's comparison controls: the "Compare with" run picker (none, or any other run) and,
 * while a run is picked, the side by side / ratio toggle. `onChange({compare})` and
 * `onChange({compareMode})` as the user picks.
 */
export class CompareControls {
  constructor(onChange) {
    this.picker = new Picker("Compare with", "compare-picker", (run) => onChange({ compare: run || null }));
    this.toggle = new Segmented("Comparison", Object.entries(MODE_LABELS).map(([value, text]) =>
      [value, text, { "data-testid": `compare-mode-${value}` }]), (compareMode) => onChange({ compareMode }));
  }

  /** Shows `state`'s comparison (the tab's `run`, `compare`, `compareMode`) among `runNames`. */
  show(state, runNames) {
    const others = runNames.filter((run) => run !== state.run);
    this.picker.show([["", "none"], ...others.map((run) => [run, run])], state.compare || "");
    if (!state.compare) {
      this.toggle.root.remove();
      return;
    }
    this.toggle.show(state.compareMode || DEFAULT_COMPARE_MODE, (value) => ({
      title: value === "ratio" ? `log10(${state.run} / ${state.compare}) per cell` : "both runs on the same rows and columns",
    }));
    if (!this.toggle.root.parentNode) this.picker.root.after(this.toggle.root);
  }
}

export class CompareView {
  constructor(vocabulary) {
    this.vocabulary = vocabulary;
    this.paints = classPaints(vocabulary.classes);
    this.note = el("div", { class: "compare-note", "data-testid": "compare-note" });
    this.labels = el("canvas", { class: "compare-labels", "aria-hidden": "true" });
    this.panes = el("div", { class: "compare-panes" });
    this.legend = el("div", { class: "colorbar compare-legend", "data-testid": "compare-legend" });
    this.tooltip = el("div", { class: "compare-tooltip", role: "tooltip", hidden: true, "data-testid": "compare-tooltip" });
    this.root = el("div", { class: "heatmap compare-view", "data-testid": "compare-view" },
      this.note, el("div", { class: "compare-grid" },
        el("div", {}, el("div", { class: "compare-title" }, "\u00a0"), this.labels), this.panes), this.legend, this.tooltip);
    this.comparison = null;
    let width = 0;
    new ResizeObserver(() => {
      const now = this.root.clientWidth;
      if (now === width) return;
      width = now;
      this.draw();
    }).observe(this.root);
  }

  /** The width in CSS px of one heatmap (how many columns are worth asking for). */
  plotWidth() {
    const total = Math.max(200, (this.root.clientWidth || 1040) - LABEL_WIDTH);
    const panes = this.mode === "ratio" ? 1 : 2;
    return Math.max(100, Math.floor((total - PANE_GAP * (panes - 1)) / panes));
  }

  /**
   * New data: `comparison` (compare.compareMatrices), `mode` ("side" or "ratio"), and for the
   * side by side colour scale the stat's scale kind and ceiling (as the heatmap's, see
   * colormap.makeScale), over both runs' values so one colour means one value in both.
   */
  setData(comparison, mode, { scaleKind, ceiling }) {
    this.comparison = comparison;
    this.mode = mode;
    const both = new Float32Array(comparison.a.values.length * 2);
    both.set(comparison.a.values);
    both.set(comparison.b.values, comparison.a.values.length);
    this.sideScale = makeScale(both, scaleKind, ceiling);
    this.ratioScale = divergingScale(comparison.ratio);
    this.draw();
  }

  draw() {
    const c = this.comparison;
    if (!c || !this.root.isConnected) return;
    const ratio = window.devicePixelRatio || 1;
    const width = this.plotWidth();
    const height = Math.max(160, Math.min(c.rowCount * 14, Math.max(320, window.innerHeight * 0.6)));
    const sides = this.mode === "ratio" ? ["ratio"] : ["a", "b"];
    replaceChildren(this.panes, sides.map((side) => this.#pane(side, width, height, ratio)));
    this.#drawLabels(height, ratio);
    const summary = unmatchedSummary(c.rows, c.runA, c.runB, c.rowsBy === "layers" ? "layer" : "variable");
    const unmatchedColumns = c.columnCount - c.matchedColumns;
    const columnsNote = unmatchedColumns
      ? `${unmatchedColumns} of ${counted(c.columnCount, c.epochIndex ? "epoch" : "column")} `
        + `${unmatchedColumns === 1 ? "has" : "have"} no counterpart in ${c.runB}.`
      : "";
    replaceChildren(this.note,
      el("strong", {}, this.mode === "ratio" ? `${c.runA} / ${c.runB}` : `${c.runA} | ${c.runB}`),
      ` ${c.stat}, matched by ${c.rowsBy === "layers" ? "layer" : "variable"} name and by ${c.epochIndex ? "epoch" : "step"}. `,
      el("span", { "data-testid": "compare-unmatched" }, summary), " ", columnsNote);
    this.#drawLegend();
  }

  // One heatmap of the comparison: run A's or B's cells ("a", "b"), or the ratio ("ratio").
  #pane(side, width, height, ratio) {
    const c = this.comparison;
    const canvas = el("canvas", { class: "cells", "data-testid": `compare-${side}` });
    const context = sizeCanvas(canvas, width, height, ratio);
    const pixelWidth = Math.round(width * ratio);
    const pixelHeight = Math.round(height * ratio);
    const pixels = side === "ratio"
      ? rasterizeRatio(c.ratio, c.rowCount, c.columnCount, this.ratioScale, pixelWidth, pixelHeight)
      : rasterize(c[side], this.sideScale, pixelWidth, pixelHeight, this.paints);
    hatchRows(pixels, pixelWidth, pixelHeight, c.rowCount, unmatchedRows(c.rows, side));
    context.putImageData(new ImageData(pixels, pixelWidth, pixelHeight), 0, 0);
    const axes = new HeatmapAxes(this.vocabulary);
    const axisMatrix = { rows: c.rowCount, columns: c.columnCount, steps: c.steps, lastSteps: c.lastSteps, epochIndex: c.epochIndex };
    const title = { a: c.runA, b: c.runB, ratio: `log10(${c.runA} / ${c.runB})` }[side];
    const plot = el("div", { class: "plot compare-plot" }, canvas);
    const pane = el("div", { class: "compare-pane", style: `width: ${width}px` },
      el("div", { class: "compare-title" }, title), plot, axes.axis, axes.axisTitle);
    plot.addEventListener("mousemove", (event) => this.#hover(event, canvas, width, height));
    plot.addEventListener("mouseleave", () => { this.tooltip.hidden = true; });
    // Drawn once in the document, where the axis can read its style.
    queueMicrotask(() => axes.drawAxis(axisMatrix, width, ratio));
    return pane;
  }

  #drawLabels(height, ratio) {
    const c = this.comparison;
    const context = sizeCanvas(this.labels, LABEL_WIDTH, height, ratio);
    context.clearRect(0, 0, LABEL_WIDTH, height);
    const style = getComputedStyle(this.labels);
    context.textBaseline = "middle";
    const grid = gridLayout(c.rowCount, 1, 1, height);
    if (grid.rowHeight < MIN_LABEL_ROW) return; // too thin to label: the tooltip names each row
    c.rows.forEach((row, index) => {
      const [top, bottom] = grid.rowRange(index);
      const matched = row.status === "both";
      context.font = `${matched ? "" : "italic "}12px ${style.fontFamily}`;
      context.fillStyle = matched ? style.color : style.getPropertyValue("--muted") || "#888";
      const text = ellipsize(rowLabel(row, c.runA, c.runB, c.rowsBy), LABEL_WIDTH - 20, (t) => context.measureText(t).width);
      context.fillText(text, 14, (top + bottom) / 2);
    });
  }

  #drawLegend() {
    const c = this.comparison;
    const width = this.mode === "ratio" ? RATIO_BAR_WIDTH : BAR_WIDTH;
    const bar = el("canvas", { class: "colorbar-gradient", width, height: BAR_HEIGHT });
    const context = bar.getContext("2d");
    const colorAt = this.mode === "ratio" ? divergingColor : viridis;
    for (let x = 0; x < width; x++) {
      context.fillStyle = `rgb(${colorAt(x / (width - 1)).join(",")})`;
      context.fillRect(x, 0, 1, BAR_HEIGHT);
    }
    const unmatched = el("span", { class: "legend-item" },
      el("span", { class: "chip chip-unmatched", style: `--unmatched: rgb(${UNMATCHED_RGB.join(",")}); --unmatched-hatch: rgb(${UNMATCHED_HATCH_RGB.join(",")})` }),
      "row only in one run");
    if (this.mode === "ratio") {
      const scale = this.ratioScale;
      const ticks = el("span", { class: "compare-ticks", "data-testid": "compare-ticks", style: `width: ${width}px` },
        scale.ticks.map(({ log, label }) => el("span", { style: `left: ${(scale.position(log) * 100).toFixed(1)}%` }, label)));
      replaceChildren(this.legend,
        el("span", { class: "compare-bar" }, bar, ticks),
        el("span", { class: "colorbar-unit" }, `${c.runA} / ${c.runB}, ${c.stat} (log scale; blue: smaller in ${c.runA}, red: larger)`),
        el("span", { class: "legend-item" }, el("span", { class: "chip chip-empty" }), "no ratio (missing, zero or NaN/Inf)"),
        unmatched);
    } else {
      const unit = this.sideScale.kind === "log" ? " (log scale)" : "";
      replaceChildren(this.legend,
        el("span", { class: "colorbar-label" }, formatValue(this.sideScale.domain[0])), bar,
        el("span", { class: "colorbar-label" }, formatValue(this.sideScale.domain[1])),
        el("span", { class: "colorbar-unit" }, `${c.stat}${unit}, one scale for both runs`),
        unmatched);
    }
  }

  #hover(event, canvas, width, height) {
    const c = this.comparison;
    const box = canvas.getBoundingClientRect();
    const cell = gridLayout(c.rowCount, c.columnCount, width, height).cellAt(event.clientX - box.left, event.clientY - box.top);
    if (!cell) {
      this.tooltip.hidden = true;
      return;
    }
    const scaleKind = this.vocabulary.statScale(c.stat);
    const { title, lines } = describeCell(c, cell[0], cell[1], {
      valueText: (side, row, column) => {
        const cls = this.vocabulary.classOf(c[side].className(row, column));
        return `${cellValueText(c[side].value(row, column), cls, scaleKind)} (${cls.label})`;
      },
      describeColumn: (first, last, epoch) => (epoch === null ? formatStepRange(first, last)
        : `epoch ${epoch} · ${formatStepRange(first, last)}`),
    });
    replaceChildren(this.tooltip, el("div", { class: "tip-variable" }, title), lines.map((line) => el("div", {}, line)));
    this.tooltip.hidden = false;
    const root = this.root.getBoundingClientRect();
    this.tooltip.style.left = `${Math.min(event.clientX - root.left + 14, root.width - 300)}px`;
    this.tooltip.style.top = `${event.clientY - root.top + 14}px`;
  }
}
