import assert from "node:assert/strict";
import { test } from "node:test";

import {
  chartRange, columnMeans, columnOfStep, columnSpan, gridLayout, layerGroups, nearestIndex, niceTicks, stepX, valueScale,
} from "../layout.js";

test("cellAt maps pixels to cells, also with sub-pixel rows", () => {
  const grid = gridLayout(1000, 500, 1000, 600);
  assert.deepEqual(grid.cellAt(0, 0), [0, 0]);
  assert.deepEqual(grid.cellAt(999.9, 599.9), [999, 499]);
  assert.deepEqual(grid.cellAt(500, 300), [500, 250]);
  assert.equal(grid.cellAt(-1, 5), null);
  assert.equal(grid.cellAt(5, 600), null);
  const [top, bottom] = grid.rowRange(10);
  assert.ok(Math.abs(top - 6) < 1e-9 && Math.abs(bottom - 6.6) < 1e-9);
  assert.equal(gridLayout(0, 0, 100, 100).cellAt(1, 1), null);
});

test("layer groups follow the row order", () => {
  assert.deepEqual(layerGroups(["a", "a", "b", "a"]), [
    { layer: "a", first: 0, last: 1 }, { layer: "b", first: 2, last: 2 }, { layer: "a", first: 3, last: 3 },
  ]);
  assert.deepEqual(layerGroups([]), []);
});

test("the column of a step in merged columns", () => {
  const first = [0, 10, 20];
  const last = [9, 19, 25];
  assert.equal(columnOfStep(first, last, 0), 0);
  assert.equal(columnOfStep(first, last, 15), 1);
  assert.equal(columnOfStep(first, last, 25), 2);
  assert.equal(columnOfStep(first, last, 26), -1);
  assert.equal(columnOfStep([], [], 3), -1);
});

test("the columns a step range touches, clipped to the columns shown", () => {
  const first = [10, 20, 40]; // steps 30-39 fall between two columns (a gap in the logged steps)
  const last = [19, 29, 49];
  assert.deepEqual(columnSpan(first, last, 15, 22), [0, 1]);
  assert.deepEqual(columnSpan(first, last, 0, 100), [0, 2], "a range wider than the view");
  assert.deepEqual(columnSpan(first, last, 25, 25), [1, 1]);
  assert.equal(columnSpan(first, last, 30, 39), null, "between two columns");
  assert.equal(columnSpan(first, last, 50, 60), null, "after the view");
  assert.equal(columnSpan([], [], 0, 5), null);
});

test("a step's place on the axis, inside its merged column", () => {
  const grid = gridLayout(1, 3, 300, 10);
  assert.equal(stepX([0, 10, 20], [9, 19, 29], 0, grid), 5);
  assert.equal(stepX([0, 10, 20], [9, 19, 29], 15, grid), 155);
  assert.equal(stepX([0, 10, 20], [9, 19, 29], 30, grid), null);
  assert.equal(stepX([0, 1], [0, 1], 1, gridLayout(1, 2, 100, 10)), 75);
});

test("the nearest logged step", () => {
  assert.equal(nearestIndex([0, 10, 20], 14), 1);
  assert.equal(nearestIndex([0, 10, 20], 16), 2);
  assert.equal(nearestIndex([0, 10, 20], 5), 0); // ties: the earlier step
  assert.equal(nearestIndex([7], 100), 0);
});

test("nice ticks", () => {
  assert.deepEqual(niceTicks(0, 10000, 5), [0, 2000, 4000, 6000, 8000, 10000]);
  assert.deepEqual(niceTicks(-7, -2, 5), [-7, -6, -5, -4, -3, -2]);
  assert.deepEqual(niceTicks(3, 3), [3]);
});

test("a series chart shows the thresholds near its data, not ones that would flatten it", () => {
  // A vanishing layer (1e-9..1e-8) against thresholds at 1e-7 and 1e3 (log10 values).
  assert.deepEqual(chartRange([-9, -8.5, -8], [-7, 3]), [-9, -7, [-7]]);
  assert.deepEqual(chartRange([-1, 1.5], [-7, 3]), [-1, 3, [3]]);
  assert.deepEqual(chartRange([-4, -3], [-7, 3]), [-4, -3, []]);
  assert.deepEqual(chartRange([2, 2], []), [1.5, 2.5, []]);
  assert.equal(chartRange([], [3]), null);
});

test("a positive series over more than two decades gets a log scale, others a linear one", () => {
  const diverging = valueScale([2.1, 2.0, 40, 4.9e16]);
  assert.equal(diverging.log, true);
  assert.deepEqual([diverging.low, diverging.high], [2.0, 4.9e16]);
  assert.equal(diverging.position(2.0), 0);
  assert.ok(Math.abs(diverging.position(4.9e16) - 1) < 1e-12);
  assert.ok(diverging.position(40) > 0.05, "the rise before the blow-up is visible");
  const falling = valueScale([2.3, 1.1, 0.4]);
  assert.equal(falling.log, false);
  assert.ok(Math.abs(falling.position(1.35) - 0.5) < 1e-12);
  assert.equal(valueScale([-1, 1000]).log, false);
  assert.equal(valueScale([0, 1000]).log, false);
  assert.equal(valueScale([1, 100]).log, false);
  assert.equal(valueScale([1, 101]).log, true);
  assert.equal(valueScale([5, 5]).position(5), 0.5);
});

test("the loss on the epoch axis: the mean of each epoch's steps, up to the next epoch's start", () => {
  // Epochs start at steps 1, 21 and 41; the loss is logged at every step, the gradients perhaps not.
  const points = Array.from({ length: 60 }, (_, i) => [i + 1, i < 20 ? 2 : i < 40 ? 1 : 0.5]);
  assert.deepEqual(columnMeans(points, [1, 21, 41]), [
    { column: 0, value: 2 }, { column: 1, value: 1 }, { column: 2, value: 0.5 }]);
  // Steps before the first mark join the first epoch; after the last, the last; order is free.
  assert.deepEqual(columnMeans([[30, 4], [0, 1], [5, 3], [12, 9]], [5, 10]),
    [{ column: 0, value: 2 }, { column: 1, value: 6.5 }]);
  // NaN and Inf losses are no point; an epoch with none has no mean; no columns, no means.
  assert.deepEqual(columnMeans([[1, NaN], [2, Infinity], [11, 3]], [1, 11]), [{ column: 1, value: 3 }]);
  assert.deepEqual(columnMeans([[1, 1]], []), []);
});
