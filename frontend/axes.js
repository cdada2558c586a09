// The heatmap's surroundings, lined up with its rows and columns: the row labels (one variable
// per row, or one layer per group of rows when rows are too thin to label) with a dot in the
// colour of each row's most urgent alert, the step or epoch axis (labels thinned so none overlap)
// under its title, and the run's training loss above the columns (on the epoch axis, each epoch's
// mean), its range and scale beside it.

import { thinLabels } from "./axis_labels.js";
import { ACCENT } from "./colormap.js";
import { el, replaceChildren, sizeCanvas } from "./dom.js";
import { ellipsize, formatStep, formatValue, layerName, rowName } from "./format.js";
import {
  columnMeans, columnSpan, gridLayout, layerGroups, niceTicks, stepX, valueScale,
} from "./layout.js";

const LABEL_WIDTH = 240; // CSS px, as the stylesheet's first grid column
const AXIS_HEIGHT = 28;
const LOSS_HEIGHT = 70;
const MIN_LABEL_ROW = 10; // CSS px a row needs for its own label
const MARKER_SPACE = 14; // CSS px left of the labels for the alert dots
const AXIS_LABEL_GAP = 8; // CSS px at least between two axis labels
const AXIS_TITLES = { step: "step", epoch: "epoch (each column: the epoch's worst cell)" };

export class HeatmapAxes {
  constructor(vocabulary) {
    this.vocabulary = vocabulary;
    this.labels = el("canvas", { class: "labels", "aria-hidden": "true" });
    this.axis = el("canvas", { class: "axis", "aria-hidden": "true" });
    this.axisTitle = el("div", { class: "axis-title", "data-testid": "axis-title" });
    this.lossLabel = el("div", { class: "loss-label" });
    this.loss = el("canvas", { class: "loss", "data-testid": "loss-curve", hidden: true });
    this.lossPoints = null;
    this.lossMarks = []; // `alerts.lossSpikeMarks`, each with its colour
  }

  /** The loss spikes and their precursors to mark: `alerts.lossSpikeMarks` with a `color` each. */
  setLossMarks(marks) {
    this.lossMarks = marks;
  }

  /** A loss curve to align above the columns: [[wall_time, step, value], ...] or null. */
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
    const groups = perRow ? matrix.variables.map((v, row) => ({ text: rowName(matrix.rowsBy, v), first: row, last: row }))
      : layerGroups(matrix.layers).map((g) => ({ text: layerName(g.layer), first: g.first, last: g.last }));
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

  /**
   * Step ticks (or the epoch of each column) under a plot `width` CSS px wide, every k-th label
   * when they would overlap (`axis_labels.thinLabels`), and the axis' title.
   */
  drawAxis(matrix, width, ratio) {
    const context = sizeCanvas(this.axis, width, AXIS_HEIGHT, ratio);
    context.clearRect(0, 0, width, AXIS_HEIGHT);
    replaceChildren(this.axisTitle, AXIS_TITLES[matrix.epochIndex ? "epoch" : "step"]);
    if (!matrix.columns) return;
    const style = getComputedStyle(this.axis);
    context.font = `11px ${style.fontFamily}`;
    context.fillStyle = style.color;
    context.strokeStyle = style.color;
    context.textBaseline = "top";
    const grid = gridLayout(matrix.rows, matrix.columns, width, 1);
    const ticks = matrix.epochIndex
      ? matrix.epochIndex.map((epoch, c) => ({ x: (grid.columnRange(c)[0] + grid.columnRange(c)[1]) / 2, text: String(epoch) }))
      : niceTicks(matrix.steps[0], matrix.lastSteps[matrix.columns - 1], Math.max(2, Math.floor(width / 90)))
        .map((step) => ({ x: stepX(matrix.steps, matrix.lastSteps, step, grid), text: formatStep(step) }))
        .filter(({ x }) => x !== null);
    const labels = ticks.map(({ x, text }) => ({ x, width: context.measureText(text).width }));
    // Where each label went, kept for the browser tests, which check that none overlap.
    this.drawnLabels = thinLabels(labels, width, AXIS_LABEL_GAP).map(({ index, left }) => {
      const { x, text } = ticks[index];
      context.beginPath();
      context.moveTo(x, 0);
      context.lineTo(x, 4);
      context.stroke();
      context.fillText(text, left, 6);
      return { text, left, right: left + labels[index].width };
    });
  }

  /**
   * The loss curve over the columns of a plot `width` CSS px wide: on the step axis each logged
   * loss at its step, on the epoch axis each epoch's mean loss (`layout.columnMeans`) at its
   * column's centre, dotted. A log scale when the loss spans decades (`layout.valueScale`), its
   * range and scale beside it, left of the plot, where they cover no part of the curve.
   */
  drawLoss(matrix, width, ratio) {
    const points = this.lossPoints;
    const shown = Boolean(points && matrix && matrix.columns);
    this.loss.hidden = !shown;
    replaceChildren(this.lossLabel);
    this.drawnLoss = []; // [{x, value}] of the points drawn, kept for the browser tests
    this.drawnMarks = []; // [{left, right, rule}] of the loss spikes marked, for the same
    if (!shown) return;
    const context = sizeCanvas(this.loss, width, LOSS_HEIGHT, ratio);
    context.clearRect(0, 0, width, LOSS_HEIGHT);
    const grid = gridLayout(matrix.rows, matrix.columns, width, 1);
    const perEpoch = Boolean(matrix.epochIndex);
    const visible = perEpoch
      ? columnMeans(points.map(([, step, value]) => [step, Number(value)]), matrix.steps)
        .map(({ column, value }) => [(grid.columnRange(column)[0] + grid.columnRange(column)[1]) / 2, value])
      : points
        .map(([, step, value]) => [stepX(matrix.steps, matrix.lastSteps, step, grid), Number(value)])
        .filter(([x, v]) => x !== null && Number.isFinite(v));
    const scale = visible.length ? valueScale(visible.map(([, v]) => v)) : null;
    replaceChildren(this.lossLabel,
      el("span", { class: "loss-name", "data-testid": "loss-name" }, this.lossTag,
        perEpoch ? " (mean per epoch)" : null, scale?.log ? " (log scale)" : null),
      scale && el("span", { class: "loss-max", "data-testid": "loss-max" }, formatValue(scale.high)),
      scale && el("span", { class: "loss-min", "data-testid": "loss-min" }, formatValue(scale.low)));
    if (!scale) return;
    this.#drawMarks(context, matrix, grid);
    const y = (v) => 4 + (1 - scale.position(v)) * (LOSS_HEIGHT - 8);
    const style = getComputedStyle(this.loss);
    const color = style.getPropertyValue("--accent") || ACCENT; // before the stylesheet loads
    context.strokeStyle = color;
    context.lineWidth = 1.5;
    context.beginPath();
    visible.forEach(([x, v], i) => (i ? context.lineTo(x, y(v)) : context.moveTo(x, y(v))));
    context.stroke();
    if (perEpoch) { // a dot per epoch: one epoch's mean is no line
      context.fillStyle = color;
      const radius = Math.max(1, Math.min(2.5, grid.columnWidth / 3));
      for (const [x, v] of visible) {
        context.beginPath();
        context.arc(x, y(v), radius, 0, 2 * Math.PI);
        context.fill();
      }
    }
    this.drawnLoss = visible.map(([x, value]) => ({ x, value }));
  }

  /** Each loss spike (and each warning before one) as a band behind the curve, over the columns
   * of its steps: a precursor lighter than a spike. */
  #drawMarks(context, matrix, grid) {
    for (const mark of this.lossMarks) {
      const columns = columnSpan(matrix.steps, matrix.lastSteps, mark.firstStep, mark.lastStep);
      if (!columns) continue; // outside the columns shown
      const [first, last] = columns;
      const left = grid.columnRange(first)[0];
      const right = Math.max(grid.columnRange(last)[1], left + 2); // at least 2 px wide
      context.globalAlpha = mark.rule === "spike" ? 0.35 : 0.2;
      context.fillStyle = mark.color || ACCENT;
      context.fillRect(left, 0, right - left, LOSS_HEIGHT);
      context.globalAlpha = 1;
      this.drawnMarks.push({ left, right, rule: mark.rule });
    }
  }
}
