import assert from "node:assert/strict";
import { test } from "node:test";

import { cellValueText, representativeIndex, rowContext } from "../cells.js";
import { VOCABULARY } from "./vocabulary_fixture.mjs";

const nonfinite = VOCABULARY.nonfiniteClass;
const ok = VOCABULARY.classOf("ok");

test("a NaN/Inf cell's statistic of finite entries reads as NaN/Inf, not as its 0", () => {
  assert.equal(cellValueText(0, nonfinite, "log"), nonfinite.label);
  assert.equal(cellValueText(0.5, nonfinite, "linear"), nonfinite.label);
  assert.equal(cellValueText(16, nonfinite, "count"), "16");
  assert.equal(cellValueText(0.25, nonfinite, "fraction"), "0.25");
  assert.equal(cellValueText(0, ok, "log"), "0");
  assert.equal(cellValueText(1234.5, ok, "log"), "1235");
});

const series = (classes, values) => ({
  steps: classes.map((_, i) => 10 + i), classes, stats: { l2_norm: values },
});

test("a merged cell stands for its worst step, as it is drawn", () => {
  // steps 10..15; the cell covers 11..14
  const run = series(["ok", "exploding", "ok", "nonfinite", "nonfinite", "nonfinite"],
    [1, 5000, 1, 0, 0, 0]);
  assert.equal(representativeIndex(run, "l2_norm", 11, 14, VOCABULARY), 3); // the first NaN/Inf
  assert.equal(representativeIndex(run, "l2_norm", 10, 12, VOCABULARY), 1); // exploding
  assert.equal(representativeIndex(run, "l2_norm", 12, 12, VOCABULARY), 2); // one step: itself
});

test("among steps of one class, the most extreme value for that class wins", () => {
  const exploding = series(["exploding", "exploding", "exploding"], [2e3, 9e3, 5e3]);
  assert.equal(representativeIndex(exploding, "l2_norm", 10, 12, VOCABULARY), 1);
  const vanishing = series(["vanishing", "vanishing", "vanishing"], [1e-8, 1e-9, 1e-8]);
  assert.equal(representativeIndex(vanishing, "l2_norm", 10, 12, VOCABULARY), 1);
  const healthy = series(["ok", "ok"], [3, 1]);
  assert.equal(representativeIndex(healthy, "l2_norm", 10, 11, VOCABULARY), 0);
});

test("a range the series has no step in falls back to the nearest step", () => {
  const run = series(["ok", "ok", "ok"], [1, 2, 3]);
  assert.equal(representativeIndex(run, "l2_norm", 100, 200, VOCABULARY), 2);
  assert.equal(representativeIndex(run, "missing_stat", 11, 11, VOCABULARY), 1);
});

test("a row says which layer its variable is in, or that it combines a layer's variables", () => {
  assert.equal(rowContext("variables", "dense_1"), "layer dense_1");
  assert.equal(rowContext("layers", "dense_1"), "layer · its variables as one tensor");
});
