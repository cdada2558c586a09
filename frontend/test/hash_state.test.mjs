import assert from "node:assert/strict";
import { test } from "node:test";

import {
  DEFAULT_STATE, formatHash, hasData, parseHash, resolvedAxis, thresholdParams, withRunAndTag,
} from "../hash_state.js";

const NAMES = ["exploding_norm", "vanishing_norm", "sustain_steps"];

test("a state survives the round trip through the hash", () => {
  const state = {
    run: "train/a b", tag: "gradients", stat: "mean_abs", axis: "epoch", zoom: [100, 2000],
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

test("malformed or unknown entries are dropped", () => {
  const state = parseHash(
    "#run=r&axis=sideways&zoom=9-3&t.exploding_norm=-1&t.vanishing_norm=abc&t.nope=3&t.sustain_steps=7",
    NAMES,
  );
  assert.equal(state.axis, null);
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
