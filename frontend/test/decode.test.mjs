import assert from "node:assert/strict";
import { test } from "node:test";

import { decodeHeatmap, toNumber } from "../decode.js";

const base = {
  run: "train", tag: "gradients", stat: "l2_norm", variables: ["a/kernel", "b/kernel"],
  layers: ["a", "b"], steps: [0, 10, 20], last_steps: [9, 19, 29], wall_times: [1, 2, 3],
  epochs: null, downsampled: true, sampled: null,
};

test("TensorBoard's non-finite strings become numbers", () => {
  assert.ok(Number.isNaN(toNumber("NaN")));
  assert.equal(toNumber("Infinity"), Infinity);
  assert.equal(toNumber("-Infinity"), -Infinity);
  assert.equal(toNumber(1.5), 1.5);
  assert.ok(Number.isNaN(toNumber(null)));
});

test("JSON lists decode to a row-major matrix", () => {
  const matrix = decodeHeatmap({
    ...base,
    values: [[1, "NaN", 3], ["Infinity", 5, 6]],
    classes: [["ok", "nonfinite", "ok"], ["exploding", "vanishing", "missing"]],
  });
  assert.equal(matrix.rows, 2);
  assert.equal(matrix.columns, 3);
  assert.ok(Number.isNaN(matrix.value(0, 1)));
  assert.equal(matrix.value(1, 0), Infinity);
  assert.equal(matrix.className(1, 1), "vanishing");
  assert.equal(matrix.className(1, 2), "missing");
  assert.deepEqual(matrix.lastSteps, [9, 19, 29]);
});

test("base64 typed arrays decode to the same matrix", () => {
  const floats = new Float32Array([1, NaN, 3, Infinity, 5, 6]);
  const values = Buffer.from(floats.buffer).toString("base64");
  const classes = Buffer.from(Uint8Array.from([1, 4, 1, 3, 2, 0])).toString("base64");
  const matrix = decodeHeatmap({
    ...base, encoding: "base64", shape: [2, 3], values, classes,
    class_names: ["missing", "ok", "vanishing", "exploding", "nonfinite"],
  });
  assert.equal(matrix.value(0, 2), 3);
  assert.equal(matrix.value(1, 0), Infinity);
  assert.ok(Number.isNaN(matrix.value(0, 1)));
  assert.equal(matrix.className(0, 1), "nonfinite");
  assert.equal(matrix.className(1, 2), "missing");
});

test("inconsistent answers are errors, not a wrong picture", () => {
  assert.throws(() => decodeHeatmap({ ...base, values: [[1, 2]], classes: [["ok", "ok"]] }), /fill/);
  assert.throws(() => decodeHeatmap({
    ...base, values: [[1, 2, 3], [4, 5, 6]], classes: [["ok", "ok", "bad"], ["ok", "ok", "ok"]],
  }), /unknown cell class/);
  assert.throws(() => decodeHeatmap({
    ...base, encoding: "base64", shape: [3, 3], values: "", classes: "", class_names: [],
  }), /shape/);
});
