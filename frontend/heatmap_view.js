// The heatmap on canvas: cells (rasterised, see raster.js), row labels with alert markers, the
// step axis with epoch boundaries, a colour bar in real units, hover crosshair + tooltip, and
// click to select. No DOM node per cell: 1,000 x 10,000 stays responsive.

import { CLASS_COLORS, viridis } from "./colormap.js";
import { el, replaceChildren } from "./dom.js";
import { ellipsize, formatStep, formatStepRange, formatValue } from "./format.js";
import { columnOfStep, gridLayout, layerGroups, niceTicks } from "./layout.js";
import { rasterize } from "./raster.js";

const LABEL_WIDTH = 240;
const AXIS_HEIGHT = 28;
const MIN_LABEL_ROW = 10; // CSS px a row needs for its own label
const SEVERITY_COLORS = { critical: "#d93025", warning: "#f29900", info: "#1a73e8" };

export class HeatmapView {
  constructor({ onSelect, onHover, onZoom, onResize } = {}) {
    this.onSelect = onSelect || (() => {});
    this.onHover = onHover || (() => {});
    this.onZoom = onZoom || (() => {});
    this.onResize = onResize || (() => {});
    this.labels = el("canvas", { class: "labels", "aria-hidden": "true" });
    this.cells = el("canvas", { class: "cells", "data-testid": "heatmap-canvas" });
    this.overlay = el("canvas", { class: "overlay" });
    this.axis = el("canvas", { class: "axis", "aria-hidden": "true" });
    this.lossLabel = el("div", { class: "loss-label" });
    this.loss = el("canvas", { class: "loss", "data-testid": "loss-curve", hidden: true });
    this.lossPoints = null;
    this.tooltip = el("div", { class: "tooltip", role: "tooltip", hidden: true });
    this.colorbar = el("div", { class: "colorbar" });
    this.plot = el("div", { class: "plot" }, this.cells, this.overlay, this.tooltip);
    this.root = el(
      "div", { class: "heatmap" },
      el("div", { class: "grid" }, this.lossLabel, this.loss, this.labels, this.plot, this.axis),
      this.colorbar,
    );
    this.matrix = null;
    this.hover = null;
    this.selected = null;
    this.highlight = null; // {rows: Set, firstStep, lastStep} from a clicked alert
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
      if (drag && Math.abs(drag.x - drag.startX) > 5) {
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
    Object.assign(this, { matrix, scale, rowSeverity, epochs: epochs || [] });
    this.hover = null;
    this.draw();
  }

  /** A loss curve to align above the step axis: [[wall_time, step, value], ...] or null. */
  setLoss(points, tag) {
    this.lossPoints = points && points.length ? points : null;
    this.lossTag = tag;
    this.#drawLoss();
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

  highlightAlert(rows, firstStep, lastStep) {
    this.highlight = { rows: new Set(rows), firstStep, lastStep };
    this.#drawOverlay();
    const first = Math.min(...rows);
    if (Number.isFinite(first)) {
      const grid = this.#grid();
      this.root.scrollIntoView({ block: "nearest" });
      this.plot.parentElement.scrollTop = grid.rowRange(first)[0];
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
    for (const canvas of [this.cells, this.overlay]) size(canvas, width, height, ratio);
    size(this.labels, LABEL_WIDTH, height, ratio);
    size(this.axis, width, AXIS_HEIGHT, ratio);
    const started = performance.now();
    const pixelWidth = Math.round(width * ratio);
    const pixelHeight = Math.round(height * ratio);
    const pixels = rasterize(matrix, this.scale, pixelWidth, pixelHeight);
    this.cells.getContext("2d").putImageData(new ImageData(pixels, pixelWidth, pixelHeight), 0, 0);
    this.#drawEpochs(width, height, ratio);
    this.#drawLabels(height, ratio);
    this.#drawAxis(width, ratio);
    this.#drawLoss();
    this.#drawColorbar();
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
    const cls = m.className(row, column);
    replaceChildren(
      this.tooltip,
      el("div", { class: "tip-variable" }, m.variables[row]),
      el("div", {}, `layer ${m.layers[row]}`),
      el("div", {}, m.epochIndex ? `epoch ${m.epochIndex[column]} · ${formatStepRange(m.steps[column], m.lastSteps[column])}`
        : formatStepRange(m.steps[column], m.lastSteps[column])),
      el("div", {}, `${m.stat}: ${formatValue(m.value(row, column))}`),
      el("div", { class: `tip-class class-${cls}` }, CLASS_TEXT[cls] || cls),
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
    if (this.highlight) {
      const m = this.matrix;
      let first = columnOfStep(m.steps, m.lastSteps, this.highlight.firstStep);
      let last = columnOfStep(m.steps, m.lastSteps, this.highlight.lastStep);
      if (first < 0) first = 0;
      if (last < 0) last = m.columns - 1;
      context.strokeStyle = "#d93025";
      context.lineWidth = 2;
      for (const row of this.highlight.rows) {
        const [top, bottom] = grid.rowRange(row);
        const left = grid.columnRange(first)[0];
        const right = grid.columnRange(last)[1];
        context.strokeRect(left + 1, top + 1, Math.max(2, right - left - 2), Math.max(2, bottom - top - 2));
      }
    }
    if (this.drag && Math.abs(this.drag.x - this.drag.startX) > 5) {
      context.fillStyle = "rgba(26, 115, 232, 0.25)";
      const left = Math.min(this.drag.startX, this.drag.x);
      context.fillRect(left, 0, Math.abs(this.drag.x - this.drag.startX), grid.height);
      return;
    }
    for (const [cell, color] of [[this.selected, "#1a73e8"], [this.hover, "rgba(255,255,255,0.85)"]]) {
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

  #drawEpochs(width, height, ratio) {
    const m = this.matrix;
    if (!this.epochs.length || m.epochIndex) return;
    const context = this.cells.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.strokeStyle = "rgba(255,255,255,0.7)";
    context.setLineDash([3, 3]);
    const grid = gridLayout(m.rows, m.columns, width, height);
    for (const start of this.epochs) {
      const column = columnOfStep(m.steps, m.lastSteps, start);
      if (column <= 0) continue;
      const x = Math.round(grid.columnRange(column)[0]) + 0.5;
      context.beginPath();
      context.moveTo(x, 0);
      context.lineTo(x, height);
      context.stroke();
    }
    context.setLineDash([]);
  }

  #drawLabels(height, ratio) {
    const m = this.matrix;
    const context = this.labels.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, LABEL_WIDTH, height);
    const style = getComputedStyle(this.root);
    context.font = `12px ${style.fontFamily}`;
    context.fillStyle = style.color;
    context.textBaseline = "middle";
    const grid = gridLayout(m.rows, m.columns, 1, height);
    const measure = (text) => context.measureText(text).width;
    const markerSpace = 14;
    const perRow = grid.rowHeight >= MIN_LABEL_ROW;
    const groups = perRow ? m.variables.map((v, row) => ({ text: v, first: row, last: row }))
      : layerGroups(m.layers).map((g) => ({ text: g.layer, first: g.first, last: g.last }));
    for (const group of groups) {
      const top = grid.rowRange(group.first)[0];
      const bottom = grid.rowRange(group.last)[1];
      if (bottom - top < MIN_LABEL_ROW) continue;
      context.fillText(ellipsize(group.text, LABEL_WIDTH - markerSpace - 6, measure), markerSpace, (top + bottom) / 2);
    }
    // Alert markers: a row with alerts gets a dot in the gutter, coloured by its worst severity.
    for (const [row, severity] of this.rowSeverity) {
      const [top, bottom] = grid.rowRange(row);
      context.fillStyle = SEVERITY_COLORS[severity];
      context.beginPath();
      context.arc(6, (top + bottom) / 2, Math.max(1.5, Math.min(4, (bottom - top) / 2)), 0, 2 * Math.PI);
      context.fill();
    }
  }

  #drawAxis(width, ratio) {
    const m = this.matrix;
    const context = this.axis.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, AXIS_HEIGHT);
    if (!m.columns) return;
    const style = getComputedStyle(this.root);
    context.font = `11px ${style.fontFamily}`;
    context.fillStyle = style.color;
    context.strokeStyle = style.color;
    context.textAlign = "center";
    context.textBaseline = "top";
    const grid = gridLayout(m.rows, m.columns, width, 1);
    if (m.epochIndex) {
      const every = Math.max(1, Math.ceil((m.columns * 40) / width));
      for (let c = 0; c < m.columns; c += every) {
        const x = (grid.columnRange(c)[0] + grid.columnRange(c)[1]) / 2;
        context.fillText(`epoch ${m.epochIndex[c]}`, x, 6);
      }
      return;
    }
    const ticks = niceTicks(m.steps[0], m.lastSteps[m.columns - 1], Math.max(2, Math.floor(width / 90)));
    for (const step of ticks) {
      const x = this.#stepX(step, grid);
      if (x === null) continue;
      context.beginPath();
      context.moveTo(x, 0);
      context.lineTo(x, 4);
      context.stroke();
      context.fillText(formatStep(step), Math.min(width - 20, Math.max(20, x)), 6);
    }
  }

  // The x of a step on the step axis (inside its column, by its place in the column's range).
  #stepX(step, grid) {
    const m = this.matrix;
    const column = columnOfStep(m.steps, m.lastSteps, step);
    if (column < 0) return null;
    const [left, right] = grid.columnRange(column);
    const span = Math.max(1, m.lastSteps[column] - m.steps[column] + 1);
    return left + ((step - m.steps[column] + 0.5) / span) * (right - left);
  }

  #drawLoss() {
    const m = this.matrix;
    const points = this.lossPoints;
    const shown = Boolean(points && m && m.columns && !m.epochIndex);
    this.loss.hidden = !shown;
    replaceChildren(this.lossLabel, shown ? this.lossTag : null);
    if (!shown) return;
    const ratio = window.devicePixelRatio || 1;
    const width = this.plotWidth();
    const height = 70;
    size(this.loss, width, height, ratio);
    const context = this.loss.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);
    const grid = gridLayout(m.rows, m.columns, width, 1);
    const visible = points
      .map(([, step, value]) => [this.#stepX(step, grid), Number(value)])
      .filter(([x, v]) => x !== null && Number.isFinite(v));
    if (!visible.length) return;
    const low = Math.min(...visible.map(([, v]) => v));
    const high = Math.max(...visible.map(([, v]) => v));
    const y = (v) => 4 + (1 - (v - low) / (high - low || 1)) * (height - 8);
    context.strokeStyle = getComputedStyle(this.root).getPropertyValue("--accent") || "#1a73e8";
    context.lineWidth = 1.5;
    context.beginPath();
    visible.forEach(([x, v], i) => (i ? context.lineTo(x, y(v)) : context.moveTo(x, y(v))));
    context.stroke();
    context.fillStyle = getComputedStyle(this.root).color;
    context.font = `11px ${getComputedStyle(this.root).fontFamily}`;
    context.textBaseline = "top";
    context.fillText(formatValue(high), 4, 2);
    context.textBaseline = "bottom";
    context.fillText(formatValue(low), 4, height - 2);
  }

  #drawColorbar() {
    const scale = this.scale;
    const bar = el("canvas", { class: "colorbar-gradient", width: 200, height: 10 });
    const context = bar.getContext("2d");
    for (let x = 0; x < 200; x++) {
      context.fillStyle = `rgb(${viridis(x / 199).join(",")})`;
      context.fillRect(x, 0, 1, 10);
    }
    const unit = scale.kind === "log" ? " (log scale)" : "";
    const chip = (color, text, hatch) => el("span", { class: "legend-item" },
      el("span", { class: `chip${hatch ? ` hatch-${hatch}` : ""}`, style: color ? `background: rgb(${color.join(",")})` : null }),
      text);
    replaceChildren(
      this.colorbar,
      el("span", { class: "colorbar-label" }, formatValue(scale.domain[0])),
      bar,
      el("span", { class: "colorbar-label" }, formatValue(scale.domain[1])),
      el("span", { class: "colorbar-unit" }, `${this.matrix.stat}${unit}`),
      chip(viridis(0.1), "vanishing", "vanishing"),
      chip(viridis(0.9), "exploding", "exploding"),
      chip(CLASS_COLORS.nonfinite, "NaN/Inf"),
      chip(null, "no gradient", "missing"),
    );
  }
}

const CLASS_TEXT = {
  ok: "ok",
  vanishing: "vanishing",
  exploding: "exploding",
  nonfinite: "NaN/Inf in the gradient",
  missing: "no gradient at this step",
};

function size(canvas, width, height, ratio) {
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const pixelWidth = Math.round(width * ratio);
  const pixelHeight = Math.round(height * ratio);
  if (canvas.width !== pixelWidth) canvas.width = pixelWidth;
  if (canvas.height !== pixelHeight) canvas.height = pixelHeight;
}
