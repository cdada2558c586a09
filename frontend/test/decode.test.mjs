import assert from "node:assert/strict";
import { test } from "node:test";

import { decodeHeatmap, toNumber } from "../decode.js";
import { Vocabulary } from "../vocabulary.js";
import { CLASS_NAMES, SERVED, VOCABULARY } from "./vocabulary_fixture.mjs";

const base = {
  run: "train", tag: "gradients", stat: "l2_norm", rows: "variables", variables: ["a/kernel", "b/kernel"],
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
  }, VOCABULARY);
  assert.equal(matrix.rows, 2);
  assert.equal(matrix.columns, 3);
  assert.equal(matrix.rowsBy, "variables");
  assert.ok(Number.isNaN(matrix.value(0, 1)));
  assert.equal(matrix.value(1, 0), Infinity);
  assert.equal(matrix.className(1, 1), "vanishing");
  assert.equal(matrix.className(1, 2), "missing");
  assert.deepEqual(matrix.lastSteps, [9, 19, 29]);
});

// Six cells' classes, row-major, and their codes in the answer's `class_names` order.
const CELL_CLASSES = ["ok", "nonfinite", "ok", "exploding", "vanishing", "missing"];
const cellCodes = () => Buffer.from(Uint8Array.from(CELL_CLASSES, (name) => CLASS_NAMES.indexOf(name)))
  .toString("base64");

test("base64 typed arrays decode to the same matrix", () => {
  const floats = new Float32Array([1, NaN, 3, Infinity, 5, 6]);
  const values = Buffer.from(floats.buffer).toString("base64");
  const classes = cellCodes();
  const matrix = decodeHeatmap({
    ...base, encoding: "base64", shape: [2, 3], values, classes,
    class_names: CLASS_NAMES,
  }, VOCABULARY);
  assert.equal(matrix.value(0, 2), 3);
  assert.equal(matrix.value(1, 0), Infinity);
  assert.ok(Number.isNaN(matrix.value(0, 1)));
  assert.equal(matrix.className(0, 1), "nonfinite");
  assert.equal(matrix.className(1, 2), "missing");
});

test("inconsistent answers are errors, not a wrong picture", () => {
  assert.throws(() => decodeHeatmap({ ...base, values: [[1, 2]], classes: [["ok", "ok"]] }, VOCABULARY), /fill/);
  assert.throws(() => decodeHeatmap({
    ...base, values: [[1, 2, 3], [4, 5, 6]], classes: [["ok", "ok", "bad"], ["ok", "ok", "ok"]],
  }, VOCABULARY), /unknown cell class/);
  assert.throws(() => decodeHeatmap({
    ...base, encoding: "base64", shape: [3, 3], values: "", classes: "", class_names: [],
  }, VOCABULARY), /shape/);
  assert.throws(() => decodeHeatmap({
    ...base, encoding: "base64", shape: [2, 3], values: Buffer.alloc(24).toString("base64"),
    classes: Buffer.alloc(6).toString("base64"), class_names: ["missing", "melting"],
  }, VOCABULARY), /unknown cell class "melting"/);
});

test("codes follow the vocabulary's order, whatever order the answer used", () => {
  const worstFirst = new Vocabulary({ ...SERVED, classes: [...SERVED.classes].reverse() });
  const classes = cellCodes();
  const matrix = decodeHeatmap({
    ...base, encoding: "base64", shape: [2, 3], values: Buffer.alloc(24).toString("base64"), classes,
    class_names: CLASS_NAMES,
  }, worstFirst);
  assert.deepEqual(matrix.classNames, [...CLASS_NAMES].reverse());
  const reversed = [...CLASS_NAMES].reverse();
  assert.deepEqual([...matrix.classes], CELL_CLASSES.map((name) => reversed.indexOf(name)));
  assert.equal(matrix.className(0, 1), "nonfinite");
  assert.equal(matrix.className(1, 2), "missing");
});
