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
