// The details panel of one selected cell: that variable's stat over the steps (log y axis for
// magnitudes, the norm thresholds drawn in their classes' colours, the cell's steps shaded when
// it merges several), every stat at the step the cell is drawn as (and those its writer did not
// log, said so), and its distribution there when histograms were logged.

import { rowContext, statRows } from "./cells.js";
import { ACCENT } from "./colormap.js";
import { toNumber } from "./decode.js";
import { el, replaceChildren, sizeCanvas } from "./dom.js";
import { counted, formatStep, formatStepRange, formatValue, rowName } from "./format.js";
import { chartRange, niceTicks } from "./layout.js";

const MAX_CHART_WIDTH = 560;
const MIN_CHART_WIDTH = 240;
const CHART_HEIGHT = 190;
const MARGIN = { left: 68, right: 10, top: 10, bottom: 36 };
const CELL_BAND = "rgba(128,128,128,0.18)";

/**
 * Fills `panel` for the step at `index` of `series` (the `series` answer of the cell's variable,
 * or of its layer when `rowsBy` is "layers"): the step the cell `{first, last, epoch}` (its step
 * range, its epoch or null) is drawn as. `notLogged`: the tag's `not_logged` stats, if any.
 */
export function renderDetails(panel, {
  series, rowsBy, index, cell, stat, thresholds, histogram, vocabulary, notLogged = [],
}) {
  const cls = vocabulary.classOf(series.classes[index]);
  const values = (series.stats[stat] || []).map(toNumber);
  const step = series.steps[index];
  const merged = cell.first !== cell.last
    ? `${cell.epoch === null ? "" : `epoch ${cell.epoch} · `}${formatStepRange(cell.first, cell.last)}, worst at ` : "";
  const title = el("h3", { class: "details-title" }, rowName(rowsBy, series.variable));
  // A layer's `shape` is its variables' entries, counted as one flat tensor.
  const size = !series.shape ? "shape unknown"
    : rowsBy === "layers" ? counted(series.shape.reduce((a, b) => a * b, 1), "entry", "entries")
      : `shape [${series.shape.join(", ")}]`;
  const subtitle = el("div", { class: "details-subtitle", "data-testid": "details-cell" },
    `${rowContext(rowsBy, series.layer)} · ${size} · ` +
    `${merged}step ${formatStep(step)} · ${cls ? cls.label : series.classes[index]}`);
  const chart = el("canvas", { class: "series-chart", "data-testid": "series-chart" });
  const rows = statRows(series, index, cls, vocabulary, notLogged).map(([name, text, logged]) => el("tr", {},
    el("th", {}, name), el("td", { class: logged ? null : "not-logged" }, text)));
  const table = el("table", { class: "stats-table" }, el("tbody", {}, rows));
  const parts = [title, subtitle, el("div", { class: "details-body" }, chart, table)];
  if (histogram) parts.push(renderHistogram(histogram));
  replaceChildren(panel, parts);
  panel.hidden = false; // before the chart is sized to the panel's width
  const width = Math.max(MIN_CHART_WIDTH, Math.min(MAX_CHART_WIDTH, panel.clientWidth - 16));
  drawSeries(chart, width, {
    steps: series.steps, values, classes: series.classes, stat, selectedStep: step, cell, thresholds, vocabulary,
  });
}

function drawSeries(canvas, width, { steps, values, classes, stat, selectedStep, cell, thresholds, vocabulary }) {
  const context = sizeCanvas(canvas, width, CHART_HEIGHT, window.devicePixelRatio || 1);
  const style = getComputedStyle(canvas);
  context.font = `11px ${style.fontFamily}`;
  context.fillStyle = style.color;
  context.strokeStyle = style.color;
  const logScale = vocabulary.statScale(stat) === "log";
  const nonfinite = vocabulary.nonfiniteClass;
  // A NaN/Inf step's statistics of its finite entries (a norm of 0) are no point on the line.
  const isNonfinite = (i) => !Number.isFinite(values[i]) || classes[i] === nonfinite?.name;
  const shown = values.map((v, i) => (isNonfinite(i) || (logScale && !(v > 0)) ? NaN : logScale ? Math.log10(v) : v));
  const limits = logScale ? vocabulary.normLimits(stat, thresholds) : [];
  const range = steps.length ? chartRange(shown.filter(Number.isFinite),
    limits.map(({ value }) => Math.log10(value))) : null;
  if (!range) {
    context.fillText("no finite values to plot", MARGIN.left, CHART_HEIGHT / 2);
    return;
  }
  const [low, high, shownLines] = range;
  const lines = limits.filter(({ value }) => shownLines.includes(Math.log10(value)));
  const plotWidth = width - MARGIN.left - MARGIN.right;
  const plotHeight = CHART_HEIGHT - MARGIN.top - MARGIN.bottom;
  const first = steps[0];
  const last = steps[steps.length - 1] === first ? first + 1 : steps[steps.length - 1];
  const px = (s) => MARGIN.left + ((s - first) / (last - first)) * plotWidth;
  const py = (v) => MARGIN.top + (1 - (v - low) / (high - low)) * plotHeight;
  if (cell.first !== cell.last) {
    context.fillStyle = CELL_BAND;
    const left = px(Math.max(first, cell.first));
    context.fillRect(left, MARGIN.top, Math.max(2, px(Math.min(last, cell.last)) - left), plotHeight);
    context.fillStyle = style.color;
  }
  context.textAlign = "right";
  context.textBaseline = "middle";
  for (const tick of niceTicks(low, high, 4)) {
    context.fillText(formatValue(logScale ? 10 ** tick : tick), MARGIN.left - 4, py(tick));
  }
  context.textAlign = "center";
  context.textBaseline = "top";
  for (const tick of niceTicks(first, last, Math.max(2, Math.floor(plotWidth / 90)))) {
    context.fillText(formatStep(tick), px(tick), MARGIN.top + plotHeight + 4);
  }
  // Axis titles: the step below, the stat (and its scale) up the left side.
  context.fillText("step", MARGIN.left + plotWidth / 2, CHART_HEIGHT - 14);
  context.save();
  context.translate(10, MARGIN.top + plotHeight / 2);
  context.rotate(-Math.PI / 2);
  context.textBaseline = "middle";
  context.fillText(`${vocabulary.statLabel(stat)}${logScale ? " (log)" : ""}`, 0, 0);
  context.restore();
  for (const { value, color } of lines) {
    context.strokeStyle = color;
    context.setLineDash([4, 3]);
    context.beginPath();
    context.moveTo(MARGIN.left, py(Math.log10(value)));
    context.lineTo(width - MARGIN.right, py(Math.log10(value)));
    context.stroke();
  }
  context.setLineDash([]);
  context.strokeStyle = style.getPropertyValue("--accent") || ACCENT; // the theme's blue
  context.lineWidth = 1.5;
  context.beginPath();
  let drawing = false;
  shown.forEach((v, i) => {
    if (!Number.isFinite(v)) {
      drawing = false;
      return;
    }
    if (drawing) context.lineTo(px(steps[i]), py(v));
    else context.moveTo(px(steps[i]), py(v));
    drawing = true;
  });
  context.stroke();
  // Non-finite steps as ticks at the top, in the non-finite class's colour, so they are never
  // just a gap in the line.
  context.fillStyle = nonfinite?.accent ?? style.color;
  steps.forEach((step, i) => {
    if (isNonfinite(i)) context.fillRect(px(step) - 1, MARGIN.top, 2, 6);
  });
  context.strokeStyle = "rgba(128,128,128,0.8)";
  context.lineWidth = 1;
  context.beginPath();
  context.moveTo(px(selectedStep), MARGIN.top);
  context.lineTo(px(selectedStep), MARGIN.top + plotHeight);
  context.stroke();
}

function renderHistogram(histogram) {
  const counts = histogram.counts.map(toNumber);
  const total = counts.reduce((a, b) => a + (Number.isFinite(b) ? b : 0), 0) || 1;
  const bars = [];
  counts.forEach((count, i) => {
    if (!count) return;
    bars.push(el("div", { class: "histogram-row" },
      el("span", { class: "histogram-label" }, histogram.bins[i]),
      el("span", { class: "histogram-bar", style: `width: ${Math.max(1, (200 * count) / total)}px` }),
      el("span", { class: "histogram-count" }, formatValue(count))));
  });
  return el("div", { class: "histogram" },
    el("h4", {}, `|g| distribution at step ${formatStep(histogram.step)}`), bars);
}
