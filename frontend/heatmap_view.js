// The heatmap's cells on canvas (rasterised, see raster.js) with its axes (axes.js) and legend
// (legend.js) around them, and what the pointer does over the cells: hover crosshair and tooltip,
// click to select, drag across steps to zoom, a clicked alert's or group's cells outlined. No DOM
// node per cell: 1,000 x 10,000 stays responsive.

import { HeatmapAxes } from "./axes.js";
import { cellValueText, rowContext } from "./cells.js";
import { ACCENT, EPOCH_LINE } from "./colormap.js";
import { el, replaceChildren, sizeCanvas } from "./dom.js";
import { formatStepRange, rowName } from "./format.js";
import { columnOfStep, columnSpan, gridLayout } from "./layout.js";
import { Legend } from "./legend.js";
import { classPaints, rasterize } from "./raster.js";

const MIN_DRAG = 5; // CSS px a drag must cover to zoom rather than click
const HOVER_COLOR = "rgba(255,255,255,0.85)";
const DRAG_COLOR = "rgba(26, 115, 232, 0.25)";

export class HeatmapView {
  constructor(vocabulary, { onSelect, onHover, onZoom, onResize }) {
    this.vocabulary = vocabulary;
    this.paints = classPaints(vocabulary.classes);
    Object.assign(this, { onSelect, onHover, onZoom, onResize });
    this.axes = new HeatmapAxes(vocabulary);
    this.legend = new Legend(vocabulary);
    this.cells = el("canvas", { class: "cells", "data-testid": "heatmap-canvas" });
    this.overlay = el("canvas", { class: "overlay" });
    this.tooltip = el("div", { class: "tooltip", role: "tooltip", hidden: true });
    this.plot = el("div", { class: "plot" }, this.cells, this.overlay, this.tooltip);
    const { lossLabel, loss, labels, axis, axisTitle } = this.axes;
    this.root = el("div", { class: "heatmap" },
      el("div", { class: "grid" }, lossLabel, loss, labels, this.plot, axis, axisTitle), this.legend.root);
    this.matrix = null;
    this.hover = null;
    this.selected = null;
    this.highlight = null; // [{rows, firstStep, lastStep}] from a clicked alert or group
    // Redraw whenever the plot's width changes (window resize, panels appearing beside it).
    let width = 0;
    new ResizeObserver(() => {
      const now = this.plotWidth();
      if (now === width) return;
      width = now;
      this.draw();
      this.onResize(now);
    }).observe(this.plot);
    this.drag = null; // {startX, x} in plot pixels while the user drags out a step range
    this.overlay.addEventListener("mousedown", (event) => {
      const x = this.#plotX(event);
      this.drag = { startX: x, x };
    });
    this.overlay.addEventListener("mousemove", (event) => {
      if (this.drag) this.drag.x = this.#plotX(event);
      this.#moved(event);
    });
    this.overlay.addEventListener("mouseleave", () => {
      this.drag = null;
      this.#moved(null);
    });
    this.overlay.addEventListener("mouseup", (event) => {
      const drag = this.drag;
      this.drag = null;
      if (drag && Math.abs(drag.x - drag.startX) > MIN_DRAG) {
        this.#zoomTo(Math.min(drag.startX, drag.x), Math.max(drag.startX, drag.x));
        return;
      }
      const cell = this.#cellAt(event);
      if (cell) this.onSelect(...cell);
      this.#drawOverlay();
    });
  }

  #plotX(event) {
    return event.clientX - this.overlay.getBoundingClientRect().left;
  }

  // Dragged from x0 to x1: the steps of the columns under them, at full resolution.
  #zoomTo(x0, x1) {
    const grid = this.#grid();
    const first = grid.cellAt(Math.max(0, x0), 0);
    const last = grid.cellAt(Math.min(grid.width - 0.01, x1), 0);
    if (!first || !last || this.matrix.epochIndex) return;
    this.onZoom([this.matrix.steps[first[1]], this.matrix.lastSteps[last[1]]]);
  }

  /** New data: a decoded matrix, its colour scale, alert severity per row, epoch start steps. */
  setData(matrix, scale, rowSeverity, epochs) {
    // Outlined rows of another run, tag or kind of row would outline the wrong cells.
    const previous = this.matrix;
    if (!previous || ["run", "tag", "rowsBy"].some((key) => previous[key] !== matrix[key])) this.highlight = null;
    Object.assign(this, { matrix, scale, rowSeverity, epochs: epochs || [] });
    this.hover = null;
    this.tooltip.hidden = true; // it told of a cell of the data replaced, under a resting pointer
    this.draw();
  }

  /** A loss curve to align above the columns: [[wall_time, step, value], ...] or null. */
  /** The loss spikes (and the warnings before them) to mark over the loss curve and on the
   * heatmap's columns: `alerts.lossSpikeMarks` with a `color` each. */
  setLossMarks(marks) {
    this.lossMarks = marks;
    this.axes.setLossMarks(marks);
  }

  setLoss(points, tag) {
    this.axes.setLoss(points, tag);
    this.axes.drawLoss(this.matrix, this.plotWidth(), window.devicePixelRatio || 1);
  }

  /** Extra tooltip lines for `cell` (key stats fetched by the app), if it is still hovered. */
  setTooltipExtra(cell, lines) {
    if (!this.hover || this.hover[0] !== cell[0] || this.hover[1] !== cell[1]) return;
    replaceChildren(this.tooltipExtra, lines.map((line) => el("div", {}, line)));
  }

  select(cell) {
    this.selected = cell;
    this.#drawOverlay();
  }

  /** Outlines `spans` ([{rows, firstStep, lastStep}]) and scrolls the first row into view. */
  highlightAlerts(spans) {
    this.highlight = spans;
    this.#drawOverlay();
    const first = Math.min(...spans.flatMap((span) => span.rows));
    if (Number.isFinite(first)) {
      this.root.scrollIntoView({ block: "nearest" });
      this.plot.parentElement.scrollTop = this.#grid().rowRange(first)[0];
    }
  }

  /** The plot's width in CSS px (how many columns are worth asking the plugin for). */
  plotWidth() {
    return Math.max(100, Math.floor(this.plot.clientWidth || 800));
  }

  /** Redraws everything at the current size (call on resize). */
  draw() {
    const matrix = this.matrix;
    if (!matrix) return;
    const ratio = window.devicePixelRatio || 1;
    const width = this.plotWidth();
    const height = Math.max(160, Math.min(matrix.rows * 14, Math.max(320, window.innerHeight * 0.6)));
    const context = sizeCanvas(this.cells, width, height, ratio);
    sizeCanvas(this.overlay, width, height, ratio);
    const started = performance.now();
    const pixelWidth = Math.round(width * ratio);
    const pixelHeight = Math.round(height * ratio);
    const pixels = rasterize(matrix, this.scale, pixelWidth, pixelHeight, this.paints);
    context.putImageData(new ImageData(pixels, pixelWidth, pixelHeight), 0, 0);
    const epochLines = this.#drawEpochs(context, width, height);
    this.axes.drawLabels(matrix, this.rowSeverity, height, ratio);
    this.axes.drawAxis(matrix, width, ratio);
    this.axes.drawLoss(matrix, width, ratio);
    this.legend.draw(this.scale, matrix.stat, { epochLines });
    this.#drawOverlay();
    this.lastDrawMs = performance.now() - started;
    this.root.dataset.drawMs = this.lastDrawMs.toFixed(1);
  }

  #grid() {
    const width = this.cells.width / (window.devicePixelRatio || 1);
    const height = this.cells.height / (window.devicePixelRatio || 1);
    return gridLayout(this.matrix.rows, this.matrix.columns, width, height);
  }

  #cellAt(event) {
    if (!this.matrix) return null;
    const box = this.overlay.getBoundingClientRect();
    return this.#grid().cellAt(event.clientX - box.left, event.clientY - box.top);
  }

  #moved(event) {
    const cell = event ? this.#cellAt(event) : null;
    this.hover = cell;
    this.#drawOverlay();
    if (!cell) {
      this.tooltip.hidden = true;
      this.onHover(null);
      return;
    }
    const [row, column] = cell;
    const m = this.matrix;
    const cls = this.vocabulary.classOf(m.className(row, column));
    const color = this.vocabulary.classVar(cls.name, "tooltip");
    const range = formatStepRange(m.steps[column], m.lastSteps[column]);
    replaceChildren(
      this.tooltip,
      el("div", { class: "tip-variable" }, rowName(m.rowsBy, m.variables[row])),
      el("div", {}, rowContext(m.rowsBy, m.layers[row])),
      el("div", {}, m.epochIndex ? `epoch ${m.epochIndex[column]} · ${range}` : range),
      el("div", { class: "tip-value" },
        `${m.stat}: ${cellValueText(m.value(row, column), cls, this.vocabulary.statScale(m.stat))}`),
      el("div", { class: "tip-class", style: color && `color: ${color}` }, cls.description),
      this.tooltipExtra = el("div", { class: "tip-extra" }),
    );
    this.tooltip.hidden = false;
    const box = this.overlay.getBoundingClientRect();
    const x = event.clientX - box.left;
    const y = event.clientY - box.top;
    this.tooltip.style.left = `${Math.min(x + 14, box.width - 220)}px`;
    this.tooltip.style.top = `${y + 14}px`;
    this.onHover(cell);
  }

  #drawOverlay() {
    if (!this.matrix) return;
    const ratio = window.devicePixelRatio || 1;
    const context = this.overlay.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    const grid = this.#grid();
    context.clearRect(0, 0, grid.width, grid.height);
    this.#drawColumnMarks(context, grid);
    if (this.highlight) this.#drawHighlight(context, grid);
    if (this.drag && Math.abs(this.drag.x - this.drag.startX) > MIN_DRAG) {
      context.fillStyle = DRAG_COLOR;
      const left = Math.min(this.drag.startX, this.drag.x);
      context.fillRect(left, 0, Math.abs(this.drag.x - this.drag.startX), grid.height);
      return;
    }
    for (const [cell, color] of [[this.selected, ACCENT], [this.hover, HOVER_COLOR]]) {
      if (!cell) continue;
      const [row, column] = cell;
      const [top, bottom] = grid.rowRange(row);
      const [left, right] = grid.columnRange(column);
      context.strokeStyle = color;
      context.lineWidth = 1;
      context.beginPath();
      context.moveTo(0, (top + bottom) / 2);
      context.lineTo(grid.width, (top + bottom) / 2);
      context.moveTo((left + right) / 2, 0);
      context.lineTo((left + right) / 2, grid.height);
      context.stroke();
      context.strokeRect(left, top, Math.max(1, right - left), Math.max(1, bottom - top));
    }
  }

  // Where each loss spike (or warning before one) starts and ends, across every row: a spike's
  // columns between two lines, a warning's first column after a dashed one.
  #drawColumnMarks(context, grid) {
    const m = this.matrix;
    this.drawnColumnMarks = []; // [{left, right, rule}], kept for the browser tests
    for (const mark of this.lossMarks || []) {
      const columns = columnSpan(m.steps, m.lastSteps, mark.firstStep, mark.lastStep);
      if (!columns) continue;
      const left = Math.round(grid.columnRange(columns[0])[0]) + 0.5;
      const right = Math.round(grid.columnRange(columns[1])[1]) - 0.5;
      context.strokeStyle = mark.color || ACCENT;
      context.lineWidth = 1;
      context.setLineDash(mark.rule === "spike" ? [] : [2, 2]);
      context.beginPath();
      for (const x of mark.rule === "spike" ? [left, right] : [left]) {
        context.moveTo(x, 0);
        context.lineTo(x, grid.height);
      }
      context.stroke();
      this.drawnColumnMarks.push({ left, right, rule: mark.rule });
    }
    context.setLineDash([]);
  }

  // The clicked alerts' rows, each over its own steps, outlined; a whole-model alert's columns
  // (`wholeColumns`) in one outline.
  #drawHighlight(context, grid) {
    const m = this.matrix;
    context.strokeStyle = this.vocabulary.urgentColor;
    context.lineWidth = 2;
    this.drawnOutlines = []; // [{left, right, top, bottom}], kept for the browser tests
    for (const { rows, firstStep, lastStep, wholeColumns } of this.highlight) {
      const columns = columnSpan(m.steps, m.lastSteps, firstStep, lastStep);
      if (!columns) continue;
      const left = grid.columnRange(columns[0])[0];
      const right = grid.columnRange(columns[1])[1];
      const outline = (top, bottom) => {
        context.strokeRect(left + 1, top + 1, Math.max(2, right - left - 2), Math.max(2, bottom - top - 2));
        this.drawnOutlines.push({ left, right, top, bottom });
      };
      if (wholeColumns) outline(0, grid.height);
      for (const row of rows) outline(...grid.rowRange(row));
    }
  }

  // Dashed lines where epochs start, on the step axis; returns how many were drawn.
  #drawEpochs(context, width, height) {
    const m = this.matrix;
    if (!this.epochs.length || m.epochIndex) return 0;
    context.strokeStyle = EPOCH_LINE.color;
    context.setLineDash(EPOCH_LINE.dash);
    const grid = gridLayout(m.rows, m.columns, width, height);
    let drawn = 0;
    for (const start of this.epochs) {
      const column = columnOfStep(m.steps, m.lastSteps, start);
      if (column <= 0) continue;
      const x = Math.round(grid.columnRange(column)[0]) + 0.5;
      context.beginPath();
      context.moveTo(x, 0);
      context.lineTo(x, height);
      context.stroke();
      drawn += 1;
    }
    context.setLineDash([]);
    return drawn;
  }
}
