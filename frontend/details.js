// The details panel of one selected cell: that variable's stat over the steps (log y axis for
// magnitudes, the norm thresholds drawn in their classes' colours), every stat at the selected
// step, and its distribution there when histograms were logged.

import { ACCENT } from "./colormap.js";
import { toNumber } from "./decode.js";
import { el, replaceChildren, sizeCanvas } from "./dom.js";
import { formatStep, formatValue } from "./format.js";
import { chartRange, nearestIndex, niceTicks } from "./layout.js";

const CHART_WIDTH = 560;
const CHART_HEIGHT = 180;
const MARGIN = { left: 56, right: 10, top: 10, bottom: 24 };

/** Fills `panel` for the cell at `step` of `series` (the `series` answer of its variable). */
export function renderDetails(panel, { series, stat, step, thresholds, histogram, vocabulary }) {
  const values = (series.stats[stat] || []).map(toNumber);
  const index = nearestIndex(series.steps, step);
  const title = el("h3", { class: "details-title" }, series.variable);
  const subtitle = el("div", { class: "details-subtitle" },
    `layer ${series.layer} · shape ${series.shape ? `[${series.shape.join(", ")}]` : "unknown"} · ` +
    `step ${formatStep(series.steps[index])} · ${series.classes[index]}`);
  const chart = el("canvas", { class: "series-chart", "data-testid": "series-chart" });
  drawSeries(chart, { steps: series.steps, values, stat, selectedStep: series.steps[index], thresholds, vocabulary });
  const rows = Object.entries(series.stats).map(([name, column]) =>
    el("tr", {}, el("th", {}, name), el("td", {}, formatValue(toNumber(column[index])))));
  const table = el("table", { class: "stats-table" }, el("tbody", {}, rows));
  const parts = [title, subtitle, el("div", { class: "details-body" }, chart, table)];
  if (histogram) parts.push(renderHistogram(histogram));
  replaceChildren(panel, parts);
  panel.hidden = false;
}

function drawSeries(canvas, { steps, values, stat, selectedStep, thresholds, vocabulary }) {
  const context = sizeCanvas(canvas, CHART_WIDTH, CHART_HEIGHT, window.devicePixelRatio || 1);
  const style = getComputedStyle(canvas);
  context.font = `11px ${style.fontFamily}`;
  context.fillStyle = style.color;
  context.strokeStyle = style.color;
  const logScale = vocabulary.statScale(stat) === "log";
  const y = (v) => (logScale ? (v > 0 ? Math.log10(v) : NaN) : v);
  const limits = logScale ? vocabulary.normLimits(stat, thresholds) : [];
  const range = steps.length ? chartRange(values.map(y).filter(Number.isFinite),
    limits.map(({ value }) => Math.log10(value))) : null;
  if (!range) {
    context.fillText("no finite values to plot", MARGIN.left, CHART_HEIGHT / 2);
    return;
  }
  const [low, high, shownLines] = range;
  const lines = limits.filter(({ value }) => shownLines.includes(Math.log10(value)));
  const plotWidth = CHART_WIDTH - MARGIN.left - MARGIN.right;
  const plotHeight = CHART_HEIGHT - MARGIN.top - MARGIN.bottom;
  const first = steps[0];
  const last = steps[steps.length - 1] === first ? first + 1 : steps[steps.length - 1];
  const px = (s) => MARGIN.left + ((s - first) / (last - first)) * plotWidth;
  const py = (v) => MARGIN.top + (1 - (v - low) / (high - low)) * plotHeight;
  context.textAlign = "right";
  context.textBaseline = "middle";
  for (const tick of niceTicks(low, high, 4)) {
    context.fillText(formatValue(logScale ? 10 ** tick : tick), MARGIN.left - 4, py(tick));
  }
  context.textAlign = "center";
  context.textBaseline = "top";
  for (const tick of niceTicks(first, last, 5)) context.fillText(formatStep(tick), px(tick), CHART_HEIGHT - 18);
  for (const { value, color } of lines) {
    context.strokeStyle = color;
    context.setLineDash([4, 3]);
    context.beginPath();
    context.moveTo(MARGIN.left, py(Math.log10(value)));
    context.lineTo(CHART_WIDTH - MARGIN.right, py(Math.log10(value)));
    context.stroke();
  }
  context.setLineDash([]);
  context.strokeStyle = ACCENT;
  context.lineWidth = 1.5;
  context.beginPath();
  let drawing = false;
  values.forEach((value, i) => {
    const v = y(value);
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
  context.fillStyle = vocabulary.nonfiniteClass?.accent ?? style.color;
  values.forEach((value, i) => {
    if (!Number.isFinite(value)) context.fillRect(px(steps[i]) - 1, MARGIN.top, 2, 6);
  });
  context.strokeStyle = "rgba(128,128,128,0.8)";
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
