import assert from "node:assert/strict";
import { test } from "node:test";

import { mostSevere, naturalCompare } from "../runs.js";
import { VOCABULARY } from "./vocabulary_fixture.mjs";

const rank = (severity) => VOCABULARY.severityRank(severity);
const [critical, warning, info] = VOCABULARY.severities.map((severity) => ({ severity: severity.name }));

test("runs sort in natural order", () => {
  const names = ["run10", "run2", "Run1", "a/b10", "a/b9", "run2/eval"];
  assert.deepEqual([...names].sort(naturalCompare), ["a/b9", "a/b10", "Run1", "run2", "run2/eval", "run10"]);
});

test("a run's path reads as a path: a run before the runs its name begins", () => {
  // The demo's runs: a locale's collation ranks "_" before "/", which listed the clipped run first.
  const demo = ["vanishing_fixed/train", "exploding_clipped/train", "healthy/train", "exploding/train",
    "custom_loop/train", "vanishing/train"];
  assert.deepEqual([...demo].sort(naturalCompare), ["custom_loop/train", "exploding/train",
    "exploding_clipped/train", "healthy/train", "vanishing/train", "vanishing_fixed/train"]);
  assert.deepEqual(["lr_10/train", "lr_9_warm/train", "lr_9/train"].sort(naturalCompare),
    ["lr_9/train", "lr_9_warm/train", "lr_10/train"]);
});

test("numbers compare by value at any length, and equal names by code point", () => {
  assert.deepEqual(["step_100000000000000000001", "step_99999999999999999999", "step_007", "step_7"].sort(naturalCompare),
    ["step_007", "step_7", "step_99999999999999999999", "step_100000000000000000001"]);
  assert.deepEqual(["run", "Run", "RUN"].sort(naturalCompare), ["RUN", "Run", "run"]);
  assert.equal(naturalCompare("same", "same"), 0);
});

test("the most severe tag: its worst alert first, then the most alerts, then the name", () => {
  const found = [
    ["run2", "gradients", [info, info, info]],
    ["run10", "gradients", [warning]],
    ["run3", "gradients", [critical, info]],
    ["run1", "gradients", []],
  ];
  assert.deepEqual(mostSevere(found, rank), ["run3", "gradients"]);
  found.push(["run11", "gradients", [warning, critical, warning]]);
  assert.deepEqual(mostSevere(found, rank), ["run11", "gradients"]);
  found.push(["run4", "gradients", [critical, warning, warning]]);
  assert.deepEqual(mostSevere(found, rank), ["run4", "gradients"]); // a tie: natural order
  assert.deepEqual(mostSevere([["b", "t", []], ["a10", "t", []], ["a9", "t", []]], rank), ["a9", "t"]);
  assert.equal(mostSevere([], rank), null);
});

test("an unknown severity ranks after every known one, but before no alerts", () => {
  assert.deepEqual(mostSevere([["a", "t", []], ["b", "t", [{ severity: "new" }]]], rank), ["b", "t"]);
  assert.deepEqual(mostSevere([["a", "t", [info]], ["b", "t", [{ severity: "new" }]]], rank), ["a", "t"]);
});
