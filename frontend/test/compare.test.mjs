import assert from "node:assert/strict";
import { test } from "node:test";

import {
  MAX_DECADES, NEUTRAL_RGB, UNMATCHED_HATCH_RGB, UNMATCHED_RGB, alignColumns, alignRows, alignedMatrix,
  compareMatrices, describeCell, divergingColor, divergingScale, hatchRows, logRatios, rasterizeRatio,
  ratioText, rowLabel, unmatchedRows, unmatchedSummary,
} from "../compare.js";
import { CLASS_NAMES, VOCABULARY } from "./vocabulary_fixture.mjs";

const EMPTY = VOCABULARY.classCode("missing");
const NONFINITE = VOCABULARY.classCode("nonfinite");

/** A decoded heatmap (decode.js's shape) of `values` [[per column] per row], classes "ok" unless given. */
function heatmap({ run = "A", variables, values, classes, steps, lastSteps, epochIndex = null, stat = "l2_norm", rowsBy = "variables" }) {
  const rows = variables.length;
  const columns = steps.length;
  return {
    run, stat, rowsBy, variables, layers: variables, rows, columns, steps,
    lastSteps: lastSteps || steps, epochIndex, classNames: CLASS_NAMES,
    values: Float32Array.from(values.flat()),
    classes: Uint8Array.from((classes || values.map((row) => row.map(() => "ok"))).flat()
      .map((name) => VOCABULARY.classCode(name))),
  };
}

test("rows match by name: A's order, then B's leftovers, each flagged", () => {
  const rows = alignRows(["in/kernel", "in/bias", "mid/kernel", "out/kernel"],
    ["in/kernel", "extra/kernel", "out/kernel", "in/bias", "head/bias"]);
  assert.deepEqual(rows.map((r) => [r.name, r.a, r.b, r.status]), [
    ["in/kernel", 0, 0, "both"],
    ["in/bias", 1, 3, "both"],
    ["mid/kernel", 2, -1, "a"],
    ["out/kernel", 3, 2, "both"],
    ["extra/kernel", -1, 1, "b"],
    ["head/bias", -1, 4, "b"],
  ]);
});

test("identical layouts match row for row; disjoint ones match nothing; repeated names in order", () => {
  assert.ok(alignRows(["a", "b"], ["a", "b"]).every((r, i) => r.a === i && r.b === i && r.status === "both"));
  assert.deepEqual(alignRows(["a"], ["b"]).map((r) => r.status), ["a", "b"]);
  assert.deepEqual(alignRows(["x", "x"], ["x"]).map((r) => [r.a, r.b]), [[0, 0], [1, -1]]);
  assert.deepEqual(alignRows([], ["x"]).map((r) => r.status), ["b"]);
});

test("step columns match the column of B holding A's first step", () => {
  const a = { steps: [1, 5, 9, 13], lastSteps: [4, 8, 12, 16] };
  const b = { steps: [0, 3, 6, 9], lastSteps: [2, 5, 8, 11] }; // B stops at step 11
  assert.deepEqual([...alignColumns(a, b)], [0, 1, 3, -1]);
  // Same steps one for one.
  const same = { steps: [0, 1, 2], lastSteps: [0, 1, 2] };
  assert.deepEqual([...alignColumns(same, same)], [0, 1, 2]);
  // A logged steps B never did (a gap), and lastSteps absent (unmerged columns).
  assert.deepEqual([...alignColumns({ steps: [0, 1, 2] }, { steps: [0, 2] })], [0, -1, 1]);
});

test("epoch columns match by epoch index, whatever their steps", () => {
  const a = { steps: [0, 100, 200], lastSteps: [99, 199, 299], epochIndex: [0, 1, 2] };
  const b = { steps: [0, 10], lastSteps: [9, 19], epochIndex: [0, 1] }; // 10 steps per epoch, 2 epochs
  assert.deepEqual([...alignColumns(a, b)], [0, 1, -1]);
  // Epochs against steps never line up.
  assert.deepEqual([...alignColumns(a, { steps: [0, 100], lastSteps: [99, 199] })], [-1, -1, -1]);
});

test("an aligned matrix takes its rows and columns from their sources, empty elsewhere", () => {
  const m = heatmap({ variables: ["r0", "r1"], values: [[1, 2], [3, 4]], steps: [0, 1] });
  const aligned = alignedMatrix(m, [1, -1, 0], [1, -1], EMPTY);
  assert.equal(aligned.rows, 3);
  assert.equal(aligned.columns, 2);
  assert.deepEqual([...aligned.values].map((v) => (Number.isNaN(v) ? "NaN" : v)), [4, "NaN", "NaN", "NaN", 2, "NaN"]);
  assert.equal(aligned.className(0, 0), "ok");
  assert.equal(aligned.className(1, 0), "missing");
  assert.equal(aligned.className(0, 1), "missing");
  assert.equal(aligned.value(2, 0), 2);
});

test("log ratios: log10(a / b), NaN where either is missing, NaN, Inf, 0 or negative", () => {
  const a = [10, 1e-7, 1, NaN, 1, 0, 1, Infinity, 1, -1, 1e-30, 5];
  const b = [1, 1e-1, 1, 1, NaN, 1, 0, 1, Infinity, 1, 1e30, 5];
  const r = logRatios(Float32Array.from(a), Float32Array.from(b));
  assert.ok(Math.abs(r[0] - 1) < 1e-12);
  assert.ok(Math.abs(r[1] + 6) < 1e-6);
  assert.equal(r[2], 0);
  for (const i of [3, 4, 5, 6, 7, 8, 9]) assert.ok(Number.isNaN(r[i]), `cell ${i}`);
  assert.ok(Math.abs(r[10] + 60) < 1e-4, "no underflow for tiny over huge");
  assert.equal(r[11], 0);
  const excluded = logRatios([1, 1], [1, 1], (i) => i === 1);
  assert.equal(excluded[0], 0);
  assert.ok(Number.isNaN(excluded[1]));
});

test("the comparison of two layouts: union rows, aligned columns, ratios only where both have data", () => {
  const a = heatmap({
    run: "vanishing", variables: ["in/kernel", "mid/kernel", "out/kernel"],
    values: [[1e-7, 1e-7, 1e-7], [1e-3, 0, 1e-3], [1, 1, NaN]],
    classes: [["vanishing", "vanishing", "vanishing"], ["ok", "ok", "nonfinite"], ["ok", "ok", "missing"]],
    steps: [0, 1, 2],
  });
  const b = heatmap({
    run: "healthy", variables: ["in/kernel", "out/kernel", "head/kernel"],
    values: [[1e-1, 1e-1], [2, 4], [7, 7]], steps: [0, 1],
  });
  const c = compareMatrices(a, b, { emptyCode: EMPTY, unusableCodes: [NONFINITE] });
  assert.deepEqual(c.rows.map((r) => r.status), ["both", "a", "both", "b"]);
  assert.deepEqual([...c.columns], [0, 1, -1]);
  assert.equal(c.rowCount, 4);
  assert.equal(c.columnCount, 3);
  assert.equal(c.matchedColumns, 2);
  const at = (row, column) => c.ratio[row * 3 + column];
  assert.ok(Math.abs(at(0, 0) + 6) < 1e-5, "in/kernel: 1e-7 / 1e-1");
  assert.ok(Math.abs(at(2, 0) - Math.log10(0.5)) < 1e-6, "out/kernel: 1 / 2");
  assert.ok(Number.isNaN(at(0, 2)), "a column B does not have");
  assert.ok(Number.isNaN(at(1, 0)) && Number.isNaN(at(3, 0)), "rows only in one run");
  assert.ok(Number.isNaN(at(2, 2)), "a missing cell");
  assert.equal(c.b.value(3, 1), 7);
  assert.equal(c.b.className(1, 0), "missing");
  assert.ok(Number.isNaN(c.a.value(3, 0)));
  // A non-finite cell's value is its finite entries' norm: no ratio of it.
  const d = compareMatrices(a, b, { emptyCode: EMPTY, unusableCodes: [VOCABULARY.classCode("vanishing")] });
  assert.ok(Number.isNaN(d.ratio[0]));
});

test("the comparison works on layers and on epochs", () => {
  const a = heatmap({
    run: "A", rowsBy: "layers", variables: ["dense", "dense_1"], values: [[1, 10], [1, 1]],
    steps: [0, 10], lastSteps: [9, 19], epochIndex: [0, 1],
  });
  const b = heatmap({
    run: "B", rowsBy: "layers", variables: ["dense", "dense_1"], values: [[100, 1, 1], [1, 1, 1]],
    steps: [0, 5, 10], lastSteps: [4, 9, 14], epochIndex: [0, 1, 2],
  });
  const c = compareMatrices(a, b, { emptyCode: EMPTY });
  assert.equal(c.rowsBy, "layers");
  assert.deepEqual([...c.columns], [0, 1]);
  assert.deepEqual(Array.from(c.ratio), [-2, 1, 0, 0]);
  assert.deepEqual(c.epochIndex, [0, 1]);
});

test("the diverging colours: blue below 1, white at 1, red above, symmetric", () => {
  const scale = divergingScale([-6.5, 2, NaN, Infinity]);
  assert.equal(scale.limit, MAX_DECADES, "capped");
  assert.deepEqual(scale.domain, [-MAX_DECADES, MAX_DECADES]);
  assert.equal(scale.position(0), 0.5);
  assert.deepEqual(scale.color(0), [...NEUTRAL_RGB]);
  assert.ok(NEUTRAL_RGB.every((c) => c >= 245), "near-white at ratio 1");
  assert.equal(scale.color(NaN), null);
  assert.ok(Number.isNaN(scale.position(NaN)));
  assert.equal(scale.position(Infinity), 1);
  assert.equal(scale.position(-Infinity), 0);
  const [blueR, , blueB] = scale.color(-3);
  const [redR, , redB] = scale.color(3);
  assert.ok(blueB > blueR && redR > redB, "blue below, red above");
  // Symmetric in log space: the same distance from white either side of 1.
  const lightness = ([r, g, b]) => 0.2126 * r + 0.7152 * g + 0.0722 * b;
  for (const x of [0.5, 1, 2, 4, 6]) {
    assert.ok(Math.abs(scale.position(x) - 0.5 - (0.5 - scale.position(-x))) < 1e-12);
    assert.ok(Math.abs(lightness(scale.color(x)) - lightness(scale.color(-x))) < 25, `lightness at ±${x}`);
  }
  // Lightness falls monotonically away from white on both sides.
  let previous = Infinity;
  for (let t = 0.5; t <= 1.0001; t += 0.05) {
    const now = Math.min(lightness(divergingColor(t)), lightness(divergingColor(1 - t)));
    assert.ok(now <= previous + 1e-9);
    previous = now;
  }
});

test("the scale's width follows the data in whole decades, at least one", () => {
  assert.equal(divergingScale([0.01, -0.2]).limit, 1);
  assert.equal(divergingScale([]).limit, 1);
  assert.equal(divergingScale([NaN]).limit, 1);
  assert.equal(divergingScale([-2.2, 0.5]).limit, 3);
  assert.equal(divergingScale([2]).limit, 2);
  assert.equal(divergingScale([-40], { maxDecades: 4 }).limit, 4);
  const ticks = divergingScale([3]).ticks.map((t) => t.label);
  assert.deepEqual(ticks, ["1/1000x", "1/100x", "1/10x", "1x", "10x", "100x", "1000x"]);
  const wide = divergingScale([6]).ticks;
  assert.deepEqual(wide.map((t) => t.log), [-6, -4, -2, 0, 2, 4, 6]);
  assert.deepEqual(wide.map((t) => t.label), ["1/1e6x", "1/1e4x", "1/100x", "1x", "100x", "1e4x", "1e6x"]);
});

test("ratios read as real ratios", () => {
  assert.equal(ratioText(0), "1x");
  assert.equal(ratioText(1), "10x");
  assert.equal(ratioText(-2), "1/100x");
  assert.equal(ratioText(Math.log10(2.5)), "2.5x");
  assert.equal(ratioText(Math.log10(1 / 3)), "1/3x");
  assert.equal(ratioText(-6.3), "1/2e6x");
  assert.equal(ratioText(1e-12), "1x");
  assert.equal(ratioText(NaN), "n/a");
});

test("ratio pixels: the cell furthest from 1 wins a shared pixel; no ratio stays transparent", () => {
  const scale = divergingScale([2]);
  const ratio = Float64Array.from([-2, 0, NaN, 2]); // 2 x 2
  const big = rasterizeRatio(ratio, 2, 2, scale, 4, 4);
  const px = (pixels, width, x, y) => [...pixels.slice((y * width + x) * 4, (y * width + x) * 4 + 4)];
  assert.deepEqual(px(big, 4, 0, 0), [...scale.color(-2), 255]);
  assert.deepEqual(px(big, 4, 3, 0), [...NEUTRAL_RGB, 255]);
  assert.deepEqual(px(big, 4, 0, 3), [0, 0, 0, 0]);
  assert.deepEqual(px(big, 4, 3, 3), [...scale.color(2), 255]);
  const one = rasterizeRatio(Float64Array.from([0, -1, 0.5, NaN]), 2, 2, scale, 1, 1);
  assert.deepEqual(px(one, 1, 0, 0), [...scale.color(-1), 255]);
  assert.equal(rasterizeRatio(new Float64Array(0), 0, 0, scale, 3, 3).every((v) => v === 0), true);
});

test("unmatched rows are painted with the grey hatch, the others left as they are", () => {
  const pixels = new Uint8ClampedArray(6 * 6 * 4).fill(7);
  hatchRows(pixels, 6, 6, 3, new Set([1]));
  const rowOf = (y) => [...pixels.slice(y * 24, y * 24 + 24)];
  assert.ok(rowOf(0).every((v) => v === 7) && rowOf(5).every((v) => v === 7));
  const band = [...rowOf(2), ...rowOf(3)];
  const colours = new Set();
  for (let i = 0; i < band.length; i += 4) colours.add(band.slice(i, i + 4).join(","));
  assert.deepEqual([...colours].sort(), [[...UNMATCHED_HATCH_RGB, 255].join(","), [...UNMATCHED_RGB, 255].join(",")].sort());
});

test("which rows each side lacks, their labels and the summary line", () => {
  const rows = alignRows(["x", "y"], ["x", "z"]);
  assert.deepEqual([...unmatchedRows(rows, "a")], [2]);
  assert.deepEqual([...unmatchedRows(rows, "b")], [1]);
  assert.deepEqual([...unmatchedRows(rows, "ratio")], [1, 2]);
  assert.equal(rowLabel(rows[1], "run1", "run2"), "y (only in run1)");
  assert.equal(rowLabel(rows[2], "run1", "run2"), "z (only in run2)");
  assert.equal(rowLabel(rows[0], "run1", "run2"), "x");
  // An nn.Sequential's layers, compared by layer, read as layers.
  const layers = alignRows(["0", "2"], ["0"]);
  assert.equal(rowLabel(layers[0], "run1", "run2", "layers"), "layer 0");
  assert.equal(rowLabel(layers[1], "run1", "run2", "layers"), "layer 2 (only in run1)");
  assert.equal(unmatchedSummary(rows, "run1", "run2"), "Of 3 rows, 1 only in run1, 1 only in run2 (hatched grey).");
  assert.equal(unmatchedSummary(alignRows(["x"], ["x"]), "a", "b"), "");
  assert.equal(unmatchedSummary(alignRows(["x"], []), "a", "b", "layer"), "Of 1 layer, 1 only in a (hatched grey).");
});

test("the tooltip shows both values and their ratio, and says when a row is only in one run", () => {
  const a = heatmap({ run: "vanishing", variables: ["in", "gone"], values: [[1e-7, 1e-7], [1, 1]], steps: [0, 10], lastSteps: [9, 19] });
  const b = heatmap({ run: "healthy", variables: ["in", "new"], values: [[1e-1], [2]], steps: [0], lastSteps: [9] });
  const c = compareMatrices(a, b, { emptyCode: EMPTY });
  const words = {
    valueText: (side, row, column) => `${c[side].value(row, column).toExponential(0)} (${c[side].className(row, column)})`,
    describeColumn: (first, last) => `steps ${first}-${last}`,
  };
  const matched = describeCell(c, 0, 0, words);
  assert.equal(matched.title, "in");
  assert.deepEqual(matched.lines, [
    "vanishing: steps 0-9", "healthy: steps 0-9", "l2_norm in vanishing: 1e-7 (ok)", "l2_norm in healthy: 1e-1 (ok)",
    "ratio vanishing / healthy: 1/1e6x (log10 -6.00)",
  ]);
  const onlyA = describeCell(c, 1, 0, words);
  assert.equal(onlyA.title, "gone (only in vanishing)");
  assert.match(onlyA.lines[0], /only in vanishing: healthy has no such variable/);
  assert.ok(!onlyA.lines.some((line) => line.startsWith("ratio")));
  const onlyB = describeCell(c, 2, 0, words);
  assert.equal(onlyB.title, "new (only in healthy)");
  assert.ok(onlyB.lines.includes("l2_norm in healthy: 2e+0 (ok)"));
  assert.ok(describeCell(c, 0, 1, words).lines.includes("healthy: nothing logged there"));
});
