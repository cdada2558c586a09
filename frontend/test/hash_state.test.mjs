import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DEFAULT_STATE, formatHash, hasData, parseHash, resolvedAxis, thresholdParams, usableTags,
  withRunAndTag,
} from "../hash_state.js";

const NAMES = ["exploding_norm", "vanishing_norm", "sustain_steps"];

test("a state survives the round trip through the hash", () => {
  const state = {
    run: "train/a b", tag: "gradients", stat: "mean_abs", axis: "epoch", rows: "layers", zoom: [100, 2000],
    compare: "healthy/train", compareMode: "ratio",
    thresholds: { exploding_norm: 100, vanishing_norm: 1e-9 },
  };
  const hash = formatHash(state);
  assert.ok(hash.startsWith("#run=train%2Fa+b"));
  assert.deepEqual(parseHash(hash, NAMES), state);
});

test("the default view has an empty hash and parses back to the defaults", () => {
  assert.equal(formatHash(DEFAULT_STATE), "");
  assert.deepEqual(parseHash("", NAMES), { ...DEFAULT_STATE, thresholds: {} });
  assert.equal(formatHash({ ...DEFAULT_STATE, run: "r" }), "#run=r");
});

test("rows by layer are kept in the hash; rows by variable, the default, are not", () => {
  assert.equal(formatHash({ ...DEFAULT_STATE, run: "r", rows: "layers" }), "#run=r&rows=layers");
  assert.equal(formatHash({ ...DEFAULT_STATE, run: "r", rows: "variables" }), "#run=r");
  assert.equal(parseHash("#run=r&rows=layers", NAMES).rows, "layers");
  assert.equal(parseHash("#run=r", NAMES).rows, "variables");
});

test("malformed or unknown entries are dropped", () => {
  const state = parseHash(
    "#run=r&axis=sideways&rows=tensors&zoom=9-3&t.exploding_norm=-1&t.vanishing_norm=abc&t.nope=3&t.sustain_steps=7",
    NAMES,
  );
  assert.equal(state.axis, null);
  assert.equal(state.rows, "variables");
  assert.equal(state.zoom, null);
  assert.deepEqual(state.thresholds, { sustain_steps: 7 });
  assert.equal(parseHash("#zoom=1-99999999999999999999", NAMES).zoom, null);
  assert.equal(parseHash("#t.exploding_norm=", NAMES).thresholds.exploding_norm, undefined);
});

test("threshold overrides become plugin query parameters", () => {
  assert.deepEqual(thresholdParams({ thresholds: { exploding_norm: 100, vanishing_norm: 1e-9 } }), {
    exploding_norm: "100", vanishing_norm: "1e-9",
  });
});

test("the axis: the user's choice, else epochs for runs with short epochs", () => {
  const shortEpochs = { epochs: 10, steps: 2000 };
  const longEpochs = { epochs: 2, steps: 20000 };
  assert.equal(resolvedAxis({ axis: null }, shortEpochs), "epoch");
  assert.equal(resolvedAxis({ axis: null }, longEpochs), "step");
  assert.equal(resolvedAxis({ axis: null }, { epochs: 1, steps: 10 }), "step");
  assert.equal(resolvedAxis({ axis: null }, { epochs: 0, steps: 10 }), "step");
  assert.equal(resolvedAxis({ axis: "step" }, shortEpochs), "step");
  assert.equal(resolvedAxis({ axis: "epoch" }, longEpochs), "epoch");
  assert.equal(resolvedAxis({ axis: "epoch" }, { epochs: 0, steps: 10 }), "step");
  // Too few epochs to see when a run went wrong: a run that diverged in 2 epochs shows its steps.
  assert.equal(resolvedAxis({ axis: null }, { epochs: 2, steps: 40 }), "step");
  assert.equal(resolvedAxis({ axis: null }, { epochs: 7, steps: 70 }), "step");
  assert.equal(resolvedAxis({ axis: null }, { epochs: 8, steps: 80 }), "epoch");
  assert.equal(resolvedAxis({ axis: "epoch" }, { epochs: 2, steps: 40 }), "epoch");
  assert.equal(formatHash({ ...DEFAULT_STATE, run: "r", axis: "step" }), "#run=r&axis=step");
});

test("the run and tag shown: the hash's when they have data, else the nearest that has", () => {
  const info = (steps, stats = ["l2_norm", "mean_abs"]) => ({ steps, stats });
  const runs = {
    empty: { gradients: info(0) },
    broken: { gradients: { ...info(5), error: "unreadable" } },
    a: { gradients: info(5), probe: info(3, ["l2_norm"]) },
    b: { gradients: info(2) },
  };
  assert.ok(hasData(runs.a.gradients) && !hasData(runs.empty.gradients) && !hasData(runs.broken.gradients));
  const pick = (state) => withRunAndTag({ ...DEFAULT_STATE, ...state }, runs);
  assert.deepEqual([pick({ run: "a", tag: "probe" }).run, pick({ run: "a", tag: "probe" }).tag], ["a", "probe"]);
  assert.equal(pick({ run: "b", tag: "probe" }).tag, "gradients");
  assert.equal(pick({ run: "empty" }).run, "a");
  assert.equal(pick({ run: "broken" }).run, "a");
  assert.equal(pick({ run: "a", tag: "gradients", stat: "mean_abs" }).stat, "mean_abs");
  assert.equal(pick({ run: "a", tag: "probe", stat: "mean_abs" }).stat, "l2_norm");
  assert.equal(withRunAndTag(DEFAULT_STATE, { empty: runs.empty }), null);
});

test("tags with data are listed with runs in natural order, and the first opens by default", () => {
  const info = { steps: 3, stats: ["l2_norm"] };
  const runs = { run10: { gradients: info }, run9: { probe: info, gradients: info }, run1: { gradients: { steps: 0 } } };
  assert.deepEqual(usableTags(runs), [["run9", "gradients"], ["run9", "probe"], ["run10", "gradients"]]);
  assert.equal(withRunAndTag(DEFAULT_STATE, runs).run, "run9");
});

test("the run compared with and the comparison's mode are kept in the hash", () => {
  const state = { ...DEFAULT_STATE, run: "vanishing/train", compare: "healthy/train" };
  assert.equal(formatHash(state), "#run=vanishing%2Ftrain&compare=healthy%2Ftrain");
  assert.equal(formatHash({ ...state, compareMode: "ratio" }),
    "#run=vanishing%2Ftrain&compare=healthy%2Ftrain&compare_mode=ratio");
  assert.equal(formatHash({ ...state, compare: null, compareMode: "ratio" }), "#run=vanishing%2Ftrain",
    "no mode without a run to compare with");
  const parsed = parseHash("#run=a&compare=b&compare_mode=ratio", NAMES);
  assert.equal(parsed.compare, "b");
  assert.equal(parsed.compareMode, "ratio");
  assert.equal(parseHash("#run=a&compare=b&compare_mode=bogus", NAMES).compareMode, "side");
  assert.equal(parseHash("#run=a", NAMES).compare, null);
});
