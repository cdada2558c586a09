// Comparing two runs (pure, no DOM): their rows matched by name, their columns matched by epoch or
// step, both matrices on that common grid, the per-cell log10 ratio of this run to the other, and
// the diverging colour scale it is drawn with. compare_view.js draws what these compute.
//
// Run A is the run the tab shows, run B the one picked under "Compare with". Rows are the union
// of both runs' rows (A's model order, then B's leftovers), each matched or only in one run;
// columns are A's, each matched to the column of B that holds the same epoch or A's first step.

import { counted, formatValue, rowName } from "./format.js";
import { columnOfStep } from "./layout.js";

export const COMPARE_MODES = Object.freeze(["side", "ratio"]); // side by side, or A / B
export const DEFAULT_COMPARE_MODE = "side";

// ColorBrewer RdBu (11 classes), blue (A smaller) to red (A larger) through its near-white at
// ratio 1: a diverging map that stays readable with the common colour-vision deficiencies
// (Brewer's "colorblind safe" flag), and apart from viridis, so a ratio never reads as a norm.
const RDBU = [
  [5, 48, 97], [33, 102, 172], [67, 147, 195], [146, 197, 222], [209, 229, 240], [247, 247, 247],
  [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43], [103, 0, 31],
];
export const NEUTRAL_RGB = Object.freeze(RDBU[5]);
// Rows only in one run: a grey hatch, darker and denser than the empty cell's background.
export const UNMATCHED_RGB = Object.freeze([196, 196, 196]);
export const UNMATCHED_HATCH_RGB = Object.freeze([120, 120, 120]);
const UNMATCHED_SPACING = 3; // device pixels between its stripes
// The colour scale's half-width in decades: at least one (ratios near 1 stay pale), at most six
// (1/1,000,000x .. 1,000,000x; a row that is missing in effect would otherwise wash out the rest).
export const MIN_DECADES = 1;
export const MAX_DECADES = 6;

/**
 * Rows of two runs matched by name: [{name, a, b, status}] with `a` / `b` the row's index in each
 * run (-1 where it has none) and `status` "both", "a" (only in run A) or "b" (only in run B).
 * Run A's rows come first in its order, then run B's unmatched ones in B's order. A name that
 * repeats is matched in order of appearance.
 */
export function alignRows(namesA, namesB) {
  const queues = new Map();
  namesB.forEach((name, index) => {
    if (!queues.has(name)) queues.set(name, []);
    queues.get(name).push(index);
  });
  const usedB = new Set();
  const rows = namesA.map((name, a) => {
    const queue = queues.get(name);
    const b = queue && queue.length ? queue.shift() : -1;
    if (b >= 0) usedB.add(b);
    return { name, a, b, status: b >= 0 ? "both" : "a" };
  });
  namesB.forEach((name, b) => {
    if (!usedB.has(b)) rows.push({ name, a: -1, b, status: "b" });
  });
  return rows;
}

/**
 * For each column of matrix `a`, the column of matrix `b` it matches, or -1 (Int32Array). Both
 * are decoded heatmaps (decode.js: `steps`, `lastSteps`, `epochIndex`). On the epoch axis (both
 * have `epochIndex`) columns match by epoch; on the step axis, A's column matches the column of B
 * whose [first, last] step range holds A's column's first step.
 */
export function alignColumns(a, b) {
  const matched = new Int32Array(a.steps.length).fill(-1);
  if (a.epochIndex && b.epochIndex) {
    const byEpoch = new Map(b.epochIndex.map((epoch, column) => [epoch, column]));
    a.epochIndex.forEach((epoch, column) => {
      if (byEpoch.has(epoch)) matched[column] = byEpoch.get(epoch);
    });
    return matched;
  }
  if (a.epochIndex || b.epochIndex) return matched; // epochs against steps: nothing lines up
  const bLast = b.lastSteps || b.steps;
  a.steps.forEach((step, column) => {
    matched[column] = columnOfStep(b.steps, bLast, step);
  });
  return matched;
}

/**
 * `matrix` (a decoded heatmap) laid out on other rows and columns: row r is the matrix's row
 * `rowSources[r]` and column c its column `columnSources[c]`, a cell with a source of -1 being
 * NaN of class `emptyCode` (the vocabulary's code for a missing gradient). The result has the
 * fields `rasterize` (raster.js) and the tooltips read.
 */
export function alignedMatrix(matrix, rowSources, columnSources, emptyCode) {
  const rows = rowSources.length;
  const columns = columnSources.length;
  const values = new Float32Array(rows * columns).fill(NaN);
  const classes = new Uint8Array(rows * columns).fill(emptyCode);
  for (let r = 0; r < rows; r++) {
    const source = rowSources[r];
    if (source < 0) continue;
    for (let c = 0; c < columns; c++) {
      const column = columnSources[c];
      if (column < 0) continue;
      values[r * columns + c] = matrix.values[source * matrix.columns + column];
      classes[r * columns + c] = matrix.classes[source * matrix.columns + column];
    }
  }
  const classNames = matrix.classNames;
  return {
    rows, columns, values, classes, classNames,
    value(row, column) { return values[row * columns + column]; },
    className(row, column) { return classNames[classes[row * columns + column]]; },
  };
}

/**
 * log10(a / b) of each pair of cells (Float64Array): NaN where either value is missing, NaN,
 * infinite, zero or negative (no ratio of magnitudes to show), and where `excluded(i)` says the
 * cell's value does not stand for its gradient (a NaN/Inf gradient's norm over its finite
 * entries). Computed as a difference of logs, so tiny and huge norms neither under- nor overflow.
 */
export function logRatios(aValues, bValues, excluded = () => false) {
  const out = new Float64Array(aValues.length);
  for (let i = 0; i < aValues.length; i++) {
    const a = aValues[i];
    const b = bValues[i];
    out[i] = Number.isFinite(a) && Number.isFinite(b) && a > 0 && b > 0 && !excluded(i)
      ? Math.log10(a) - Math.log10(b) : NaN;
  }
  return out;
}

/**
 * Everything the comparison shows, from two decoded heatmaps of the same stat, axis and kind of
 * row: `rows` (alignRows), `columns` (alignColumns: B's column per column of A), `a` and `b`
 * (alignedMatrix, on the common grid), `ratio` (logRatios over it; rows only in one run are NaN).
 * `emptyCode`: the class code of an empty cell; `unusableCodes`: class codes whose values are not
 * the gradient's (the non-finite class).
 */
export function compareMatrices(a, b, { emptyCode, unusableCodes = [] }) {
  const rows = alignRows(a.variables, b.variables);
  const columns = alignColumns(a, b);
  const identity = Array.from({ length: a.columns }, (_, c) => c);
  const alignedA = alignedMatrix(a, rows.map((row) => row.a), identity, emptyCode);
  const alignedB = alignedMatrix(b, rows.map((row) => row.b), Array.from(columns), emptyCode);
  const unusable = new Set(unusableCodes);
  const ratio = logRatios(alignedA.values, alignedB.values,
    (i) => unusable.has(alignedA.classes[i]) || unusable.has(alignedB.classes[i]));
  return {
    runA: a.run, runB: b.run, stat: a.stat, rowsBy: a.rowsBy,
    rows, columns, a: alignedA, b: alignedB, ratio,
    rowCount: rows.length, columnCount: a.columns,
    steps: a.steps, lastSteps: a.lastSteps || a.steps, epochIndex: a.epochIndex || null,
    bSteps: b.steps, bLastSteps: b.lastSteps || b.steps,
    matchedColumns: columns.reduce((n, c) => n + (c >= 0 ? 1 : 0), 0),
  };
}

/** RdBu at t in [0, 1] (clamped): dark blue at 0, near-white at 0.5, dark red at 1. */
export function divergingColor(t) {
  const x = Math.min(1, Math.max(0, Number.isNaN(t) ? 0.5 : t)) * (RDBU.length - 1);
  const i = Math.min(RDBU.length - 2, Math.floor(x));
  const f = x - i;
  return RDBU[i].map((c, k) => Math.round(c + f * (RDBU[i + 1][k] - c)));
}

/**
 * The diverging scale of log10 ratios: symmetric around 0 (ratio 1, white), its half-width
 * `limit` the largest |log ratio| of the finite values rounded up to a whole decade, between
 * MIN_DECADES and MAX_DECADES. `position(x)` in [0, 1] (clamped; NaN for NaN), `color(x)` RGB
 * (null for NaN), `ticks`: [{log, label}] in real ratios ("1/100x", "1x", "100x").
 */
export function divergingScale(logValues, { minDecades = MIN_DECADES, maxDecades = MAX_DECADES } = {}) {
  let largest = 0;
  for (const x of logValues) {
    if (Number.isFinite(x) && Math.abs(x) > largest) largest = Math.abs(x);
  }
  const limit = Math.min(maxDecades, Math.max(minDecades, Math.ceil(largest - 1e-9)));
  const position = (x) => (Number.isNaN(x) ? NaN : Math.min(1, Math.max(0, 0.5 + x / (2 * limit))));
  const step = Math.max(1, Math.ceil(limit / 3));
  const ticks = [];
  for (let k = -limit; k <= limit; k += 1) {
    if (k % step === 0) ticks.push({ log: k, label: ratioText(k) });
  }
  return {
    limit,
    domain: [-limit, limit],
    position,
    color(x) {
      const t = position(x);
      return Number.isNaN(t) ? null : divergingColor(t);
    },
    ticks,
  };
}

/** A log10 ratio as a real ratio: "1x", "12.3x", "1/100x", "1/1e6x"; "n/a" for NaN. */
export function ratioText(log10Ratio) {
  if (Number.isNaN(log10Ratio)) return "n/a";
  if (log10Ratio === Infinity) return "+Inf x";
  if (log10Ratio === -Infinity) return "1/Inf x";
  const magnitude = 10 ** Math.abs(log10Ratio);
  const text = magnitude >= 1e4 ? formatValue(magnitude) : trimmed(magnitude);
  return log10Ratio < 0 && text !== "1" ? `1/${text}x` : `${text}x`;
}

function trimmed(value) {
  const text = value >= 100 ? value.toFixed(0) : value.toPrecision(3);
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}

// [first, end) of the cells a pixel covers (as raster.js spreads cells over pixels).
function cellSpan(pixel, pixels, cells) {
  const first = Math.min(cells - 1, Math.floor((pixel * cells) / pixels));
  return [first, Math.max(first + 1, Math.min(cells, Math.floor(((pixel + 1) * cells) / pixels)))];
}

/**
 * RGBA pixels (width x height x 4) of a `rows` x `columns` matrix of log10 ratios drawn with
 * `scale` (divergingScale): where several cells fall on one pixel it shows the one furthest from
 * ratio 1; cells without a ratio stay transparent (the empty background shows).
 */
export function rasterizeRatio(ratio, rows, columns, scale, width, height) {
  const pixels = new Uint8ClampedArray(width * height * 4);
  if (!rows || !columns || !width || !height) return pixels;
  const columnSpans = Array.from({ length: width }, (_, x) => cellSpan(x, width, columns));
  const line = new Uint8ClampedArray(width * 4);
  let previous = "";
  for (let y = 0; y < height; y++) {
    const [firstRow, endRow] = cellSpan(y, height, rows);
    if (`${firstRow}:${endRow}` !== previous) {
      previous = `${firstRow}:${endRow}`;
      line.fill(0);
      for (let x = 0; x < width; x++) {
        const [firstColumn, endColumn] = columnSpans[x];
        let shown = NaN;
        for (let r = firstRow; r < endRow; r++) {
          for (let c = firstColumn; c < endColumn; c++) {
            const v = ratio[r * columns + c];
            if (!Number.isNaN(v) && !(Math.abs(v) <= Math.abs(shown))) shown = v;
          }
        }
        const rgb = scale.color(shown);
        if (!rgb) continue;
        line.set(rgb, x * 4);
        line[x * 4 + 3] = 255;
      }
    }
    pixels.set(line, y * width * 4);
  }
  return pixels;
}

/**
 * Paints the rows `unmatched` (a Set of row indices of `rows`) of RGBA `pixels` (width x height)
 * with the unmatched rows' grey hatch, over whatever was there: a row that one run does not have
 * reads as such, never as an empty or a healthy row.
 */
export function hatchRows(pixels, width, height, rows, unmatched) {
  if (!rows || !unmatched.size) return pixels;
  for (let y = 0; y < height; y++) {
    const [firstRow] = cellSpan(y, height, rows);
    if (!unmatched.has(firstRow)) continue;
    for (let x = 0; x < width; x++) {
      const rgb = (x + y) % UNMATCHED_SPACING === 0 ? UNMATCHED_HATCH_RGB : UNMATCHED_RGB;
      pixels.set(rgb, (y * width + x) * 4);
      pixels[(y * width + x) * 4 + 3] = 255;
    }
  }
  return pixels;
}

/** The rows a side of the comparison lacks: indices of the rows of status "b" for side "a" (run
 * A does not have them), of status "a" for side "b", of both for the ratio ("ratio"). */
export function unmatchedRows(rows, side) {
  const lacking = { a: ["b"], b: ["a"], ratio: ["a", "b"] }[side];
  return new Set(rows.flatMap((row, index) => (lacking.includes(row.status) ? [index] : [])));
}

/**
 * A row's label in the comparison of rows by `rowsBy` (format.rowName): its name, and which run
 * alone has it.
 */
export function rowLabel(row, runA, runB, rowsBy = "variables") {
  const name = rowName(rowsBy, row.name);
  if (row.status === "a") return `${name} (only in ${runA})`;
  if (row.status === "b") return `${name} (only in ${runB})`;
  return name;
}

/** One line saying how the rows (each a `unit`) matched: "" when every row is in both runs. */
export function unmatchedSummary(rows, runA, runB, unit = "row") {
  const onlyA = rows.filter((row) => row.status === "a").length;
  const onlyB = rows.filter((row) => row.status === "b").length;
  const parts = [];
  if (onlyA) parts.push(`${onlyA} only in ${runA}`);
  if (onlyB) parts.push(`${onlyB} only in ${runB}`);
  return parts.length ? `Of ${counted(rows.length, unit)}, ${parts.join(", ")} (hatched grey).` : "";
}

/**
 * What the tooltip says of cell (`row`, `column`) of `comparison` (compareMatrices):
 * {title, lines}, each line a string. `valueText(side, row, column)` words one side's value
 * (with its class, as the heatmap's tooltip does); `describeColumn(firstStep, lastStep, epoch)`
 * words a column.
 */
export function describeCell(comparison, row, column, { valueText, describeColumn }) {
  const { rows, runA, runB, stat } = comparison;
  const info = rows[row];
  const lines = [];
  if (info.status !== "both") {
    lines.push(`only in ${info.status === "a" ? runA : runB}: ${info.status === "a" ? runB : runA} has no such ${comparison.rowsBy === "layers" ? "layer" : "variable"}`);
  }
  const epoch = comparison.epochIndex ? comparison.epochIndex[column] : null;
  lines.push(`${runA}: ${describeColumn(comparison.steps[column], comparison.lastSteps[column], epoch)}`);
  const bColumn = comparison.columns[column];
  if (bColumn < 0) lines.push(`${runB}: nothing logged there`);
  else {
    lines.push(`${runB}: ${describeColumn(comparison.bSteps[bColumn], comparison.bLastSteps[bColumn], epoch)}`);
  }
  if (info.a >= 0) lines.push(`${stat} in ${runA}: ${valueText("a", row, column)}`);
  if (info.b >= 0 && bColumn >= 0) lines.push(`${stat} in ${runB}: ${valueText("b", row, column)}`);
  const ratio = comparison.ratio[row * comparison.columnCount + column];
  if (info.status === "both" && bColumn >= 0) {
    lines.push(Number.isNaN(ratio)
      ? "ratio: none (a value is missing, zero or not finite)"
      : `ratio ${runA} / ${runB}: ${ratioText(ratio)} (log10 ${ratio.toFixed(2)})`);
  }
  return { title: rowLabel(info, runA, runB, comparison.rowsBy), lines };
}
