import assert from "node:assert/strict";
import { test } from "node:test";

import {
  NOT_LOGGED, NOT_LOGGED_HERE, cellValueText, keyStatsLines, representativeIndex, rowContext, statRows,
} from "../cells.js";
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

// A `series` answer at one step: every stat logged, or only the ones every writer logs.
const EVERY_STAT = {
  l2_norm: [3], mean: [0.5], std: [0.1], min: [0], max: [1], abs_max: [1], mean_abs: [0.5],
  zero_fraction: [0.25], nan_count: [0], inf_count: [0], size: [9],
};
const REQUIRED = ["l2_norm", "abs_max", "nan_count", "inf_count", "size"];
const NOT_LOGGED_STATS = Object.keys(EVERY_STAT).filter((name) => !REQUIRED.includes(name));
const atOneStep = (names, classes = ["ok"]) => ({
  steps: [1200], classes, stats: Object.fromEntries(names.map((name) => [name, EVERY_STAT[name]])),
});

test("the tooltip's key stats of a run that logged every stat", () => {
  assert.deepEqual(keyStatsLines(atOneStep(Object.keys(EVERY_STAT)), 0, ok, VOCABULARY, " (its worst)"), [
    "at step 1,200 (its worst): norm 3, max |g| 1", "zero fraction 0.25, NaN 0, Inf 0",
  ]);
});

test("the tooltip leaves out a stat the writer did not log, and shows no undefined or NaN", () => {
  const lines = keyStatsLines(atOneStep(REQUIRED), 0, ok, VOCABULARY);
  assert.deepEqual(lines, ["at step 1,200: norm 3, max |g| 1", "NaN 0, Inf 0"]);
  assert.doesNotMatch(lines.join("\n"), /undefined|null|zero fraction|NaN [^0]/);
  // A line none of whose stats were logged goes.
  assert.deepEqual(keyStatsLines(atOneStep(["l2_norm", "size"]), 0, ok, VOCABULARY), ["at step 1,200: norm 3"]);
});

test("the details list every logged stat's value, then the stats not logged as such", () => {
  const rows = statRows(atOneStep(REQUIRED), 0, ok, VOCABULARY, NOT_LOGGED_STATS);
  assert.deepEqual(rows, [
    ["l2_norm", "3", true], ["abs_max", "1", true], ["nan_count", "0", true], ["inf_count", "0", true],
    ["size", "9", true], ...NOT_LOGGED_STATS.map((name) => [name, NOT_LOGGED, false]),
  ]);
  assert.ok(rows.every(([, text]) => !/undefined|NaN/.test(text)));
  // A run that logged everything: no `not_logged` in its `runs` entry, nothing said.
  assert.equal(statRows(atOneStep(Object.keys(EVERY_STAT)), 0, ok, VOCABULARY).length, 11);
  // A NaN/Inf step still says so for the stats logged, and "not logged" for the others.
  const nan = statRows(atOneStep(REQUIRED, ["nonfinite"]), 0, nonfinite, VOCABULARY, ["zero_fraction"]);
  assert.deepEqual(nan.map(([, text]) => text), [nonfinite.label, nonfinite.label, "0", "0", "9", NOT_LOGGED]);
});

test("at a norms-only step the tooltip and details say the other stats were not logged there", () => {
  const run = {
    steps: [0, 1], classes: ["ok", "ok"], full: [true, false], stats_every: 10,
    every_step: ["l2_norm", "nan_count"],
    stats: {
      l2_norm: [2, 3], abs_max: [0.5, NaN], zero_fraction: [0.25, NaN], nan_count: [0, 0],
      weight_l2_norm: [4, NaN],
    },
  };
  const [norms, counts, why] = keyStatsLines(run, 1, ok, VOCABULARY);
  assert.equal(norms, "at step 1: norm 3");
  assert.equal(counts, "NaN 0");
  assert.match(why, /only the norms .*every statistic once every 10 logged steps/);
  const rows = Object.fromEntries(statRows(run, 1, ok, VOCABULARY).map(([name, text]) => [name, text]));
  assert.equal(rows.abs_max, NOT_LOGGED_HERE);
  // The weight norm too, where the tag holds it at the full steps only (format 1.7).
  assert.equal(rows.weight_l2_norm, NOT_LOGGED_HERE);
  assert.equal(rows.l2_norm, "3");
  // A step with every stat reads as before.
  assert.equal(keyStatsLines(run, 0, ok, VOCABULARY).length, 2);
  assert.equal(Object.fromEntries(statRows(run, 0, ok, VOCABULARY))["abs_max"], "0.5");
});
