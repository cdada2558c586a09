import assert from "node:assert/strict";
import { test } from "node:test";

import { ellipsize, formatStep, formatStepRange, formatValue } from "../format.js";

test("values read like gradient statistics", () => {
  assert.equal(formatValue(0.12345), "0.1235");
  assert.equal(formatValue(3), "3");
  assert.equal(formatValue(1234.5), "1235");
  assert.equal(formatValue(2.5e-7), "2.5e-7");
  assert.equal(formatValue(-1.234e12), "-1.23e12");
  assert.equal(formatValue(0), "0");
});

test("non-finite values are spelled out", () => {
  assert.equal(formatValue(NaN), "NaN");
  assert.equal(formatValue(Infinity), "+Inf");
  assert.equal(formatValue(-Infinity), "-Inf");
  assert.equal(formatValue(null), "NaN");
});

test("steps and ranges", () => {
  assert.equal(formatStep(12345), "12,345");
  assert.equal(formatStepRange(7, 7), "step 7");
  assert.equal(formatStepRange(100, 1099), "steps 100–1,099");
});

test("ellipsize keeps the end of a long variable path", () => {
  const measure = (text) => text.length;
  assert.equal(ellipsize("dense/kernel", 20, measure), "dense/kernel");
  assert.equal(ellipsize("model/block_12/attention/query/kernel", 14, measure), "…/query/kernel");
  assert.equal(ellipsize("abc", 1, measure), "…");
  assert.ok(ellipsize("x".repeat(500), 40, measure).length <= 40);
});
