import assert from "node:assert/strict";
import { test } from "node:test";

import {
  counted, ellipsize, formatStep, formatStepRange, formatValue, layerName, rowName,
} from "../format.js";

test("counts read in the singular for one and the plural otherwise", () => {
  assert.equal(counted(1, "finding"), "1 finding");
  assert.equal(counted(3, "finding"), "3 findings");
  assert.equal(counted(0, "finding"), "0 findings");
  assert.equal(counted(1000, "alert"), "1,000 alerts");
  assert.equal(counted(1, "entry", "entries"), "1 entry");
  assert.equal(counted(2, "entry", "entries"), "2 entries");
});

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

test("a numbered layer (an nn.Sequential's) reads as a layer, any other name as it is", () => {
  assert.equal(layerName("0"), "layer 0");
  assert.equal(layerName("12"), "layer 12");
  assert.equal(layerName("1.0"), "layer 1.0");
  assert.equal(layerName("features.0"), "features.0");
  assert.equal(layerName("dense_00"), "dense_00");
  assert.equal(layerName("0.weight"), "0.weight");
  assert.equal(rowName("layers", "2"), "layer 2");
  assert.equal(rowName("variables", "2"), "2");
  assert.equal(rowName("variables", "2.weight"), "2.weight");
});
