// The heatmap's surroundings on canvas, lined up with its rows and columns: the row labels (one
// variable per row, or one layer per group of rows when rows are too thin to label) with a dot
// in the colour of each row's most urgent alert, the step or epoch axis, and the run's training
// loss above the columns.

import { ACCENT } from "./colormap.js";
import { el, replaceChildren, sizeCanvas } from "./dom.js";
import { ellipsize, formatStep, formatValue } from "./format.js";
import { gridLayout, layerGroups, niceTicks, stepX } from "./layout.js";

const LABEL_WIDTH = 240; // CSS px, as the stylesheet's first grid column
const AXIS_HEIGHT = 28;
const LOSS_HEIGHT = 70;
const MIN_LABEL_ROW = 10; // CSS px a row needs for its own label
const MARKER_SPACE = 14; // CSS px left of the labels for the alert dots

export class HeatmapAxes {
  constructor(vocabulary) {
    this.vocabulary = vocabulary;
    this.labels = el("canvas", { class: "labels", "aria-hidden": "true" });
    this.axis = el("canvas", { class: "axis", "aria-hidden": "true" });
    this.lossLabel = el("div", { class: "loss-label" });
    this.loss = el("canvas", { class: "loss", "data-testid": "loss-curve", hidden: true });
    this.lossPoints = null;
  }

  /** A loss curve to align above the step axis: [[wall_time, step, value], ...] or null. */
  setLoss(points, tag) {
    this.lossPoints = points && points.length ? points : null;
    this.lossTag = tag;
  }

  /** Row labels and alert dots (`rowSeverity`: row -> severity) beside a plot `height` CSS px high. */
  drawLabels(matrix, rowSeverity, height, ratio) {
    const context = sizeCanvas(this.labels, LABEL_WIDTH, height, ratio);
    context.clearRect(0, 0, LABEL_WIDTH, height);
    const style = getComputedStyle(this.labels);
    context.font = `12px ${style.fontFamily}`;
    context.fillStyle = style.color;
    context.textBaseline = "middle";
    const grid = gridLayout(matrix.rows, matrix.columns, 1, height);
    const measure = (text) => context.measureText(text).width;
    const perRow = grid.rowHeight >= MIN_LABEL_ROW;
    const groups = perRow ? matrix.variables.map((v, row) => ({ text: v, first: row, last: row }))
      : layerGroups(matrix.layers).map((g) => ({ text: g.layer, first: g.first, last: g.last }));
    for (const group of groups) {
      const top = grid.rowRange(group.first)[0];
      const bottom = grid.rowRange(group.last)[1];
      if (bottom - top < MIN_LABEL_ROW) continue;
      context.fillText(ellipsize(group.text, LABEL_WIDTH - MARKER_SPACE - 6, measure), MARKER_SPACE, (top + bottom) / 2);
    }
    for (const [row, severity] of rowSeverity) {
      const [top, bottom] = grid.rowRange(row);
      context.fillStyle = this.vocabulary.severityColor(severity);
      context.beginPath();
      context.arc(6, (top + bottom) / 2, Math.max(1.5, Math.min(4, (bottom - top) / 2)), 0, 2 * Math.PI);
      context.fill();
    }
  }

  /** Step ticks (or one label per epoch column) under a plot `width` CSS px wide. */
  drawAxis(matrix, width, ratio) {
    const context = sizeCanvas(this.axis, width, AXIS_HEIGHT, ratio);
    context.clearRect(0, 0, width, AXIS_HEIGHT);
    if (!matrix.columns) return;
    const style = getComputedStyle(this.axis);
    context.font = `11px ${style.fontFamily}`;
    context.fillStyle = style.color;
    context.strokeStyle = style.color;
    context.textAlign = "center";
    context.textBaseline = "top";
    const grid = gridLayout(matrix.rows, matrix.columns, width, 1);
    if (matrix.epochIndex) {
      const every = Math.max(1, Math.ceil((matrix.columns * 40) / width));
      for (let c = 0; c < matrix.columns; c += every) {
        const x = (grid.columnRange(c)[0] + grid.columnRange(c)[1]) / 2;
        context.fillText(`epoch ${matrix.epochIndex[c]}`, x, 6);
      }
      return;
    }
    const ticks = niceTicks(matrix.steps[0], matrix.lastSteps[matrix.columns - 1], Math.max(2, Math.floor(width / 90)));
    for (const step of ticks) {
      const x = stepX(matrix.steps, matrix.lastSteps, step, grid);
      if (x === null) continue;
      context.beginPath();
      context.moveTo(x, 0);
      context.lineTo(x, 4);
      context.stroke();
      context.fillText(formatStep(step), Math.min(width - 20, Math.max(20, x)), 6);
    }
  }

  /** The loss curve over the step axis of a plot `width` CSS px wide (hidden on epoch columns). */
  drawLoss(matrix, width, ratio) {
    const points = this.lossPoints;
    const shown = Boolean(points && matrix && matrix.columns && !matrix.epochIndex);
    this.loss.hidden = !shown;
    replaceChildren(this.lossLabel, shown ? this.lossTag : null);
    if (!shown) return;
    const context = sizeCanvas(this.loss, width, LOSS_HEIGHT, ratio);
    context.clearRect(0, 0, width, LOSS_HEIGHT);
    const grid = gridLayout(matrix.rows, matrix.columns, width, 1);
    const visible = points
      .map(([, step, value]) => [stepX(matrix.steps, matrix.lastSteps, step, grid), Number(value)])
      .filter(([x, v]) => x !== null && Number.isFinite(v));
    if (!visible.length) return;
    const low = Math.min(...visible.map(([, v]) => v));
    const high = Math.max(...visible.map(([, v]) => v));
    const y = (v) => 4 + (1 - (v - low) / (high - low || 1)) * (LOSS_HEIGHT - 8);
    const style = getComputedStyle(this.loss);
    context.strokeStyle = style.getPropertyValue("--accent") || ACCENT; // before the stylesheet loads
    context.lineWidth = 1.5;
    context.beginPath();
    visible.forEach(([x, v], i) => (i ? context.lineTo(x, y(v)) : context.moveTo(x, y(v))));
    context.stroke();
    context.fillStyle = style.color;
    context.font = `11px ${style.fontFamily}`;
    context.textBaseline = "top";
    context.fillText(formatValue(high), 4, 2);
    context.textBaseline = "bottom";
    context.fillText(formatValue(low), 4, LOSS_HEIGHT - 2);
  }
}
