import assert from "node:assert/strict";
import { test } from "node:test";

import { dataProblems, logdirFinding, problemLine, problemsSummary } from "../problems.js";

const RUNS = {
  good: { gradients: { variables: 2, steps: 10, stats: ["l2_norm"], histograms: false, epochs: 0, sampled: null } },
  future: { gradients: { variables: 0, steps: 0, stats: [], histograms: false, epochs: 0, error: "upgrade it" } },
  bomb: {
    gradients: { steps: 3, damaged: 1, damage: ["1 logged step of this tag was refused as damaged: shape"] },
  },
  rotten: {
    gradients: { steps: 5, damaged: 0, damage: ["1 record of f fails its checksum"] },
    gradients_probe: { steps: 2, damaged: 0, damage: ["1 record of f fails its checksum"] },
  },
};

test("lists unreadable tags and damaged steps, nothing for healthy tags", () => {
  assert.deepEqual(dataProblems(RUNS), [
    { run: "future", tag: "gradients", severity: "error", text: "upgrade it" },
    { run: "bomb", tag: "gradients", severity: "warning", text: "1 logged step of this tag was refused as damaged: shape" },
    { run: "rotten", tag: "gradients", severity: "warning", text: "1 record of f fails its checksum" },
  ]);
  assert.deepEqual(dataProblems({ good: RUNS.good }), []);
  assert.deepEqual(dataProblems(undefined), []);
});

test("words each problem and the list's heading", () => {
  const problems = dataProblems(RUNS);
  assert.equal(problemLine(problems[0]), "future/gradients: upgrade it");
  assert.equal(problemsSummary(problems), "1 tag cannot be read; 2 tags have damaged data");
  assert.equal(problemsSummary(problems.slice(1, 2)), "1 tag has damaged data");
  assert.equal(problemsSummary([]), "");
});

test("the logdir's finding names the path and what is there, and a wrong path as one", () => {
  assert.equal(logdirFinding({ location: "/runs/mnist", exists: true, found: "2 runs; scalars tags: loss" }),
    "TensorBoard's logdir /runs/mnist: 2 runs; scalars tags: loss.");
  assert.equal(logdirFinding({ location: "/runs/mnsit", exists: false, found: "no such directory" }),
    "TensorBoard's logdir /runs/mnsit: no such directory. Check the path given to --logdir.");
});
