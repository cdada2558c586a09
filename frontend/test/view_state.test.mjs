import assert from "node:assert/strict";
import { test } from "node:test";

import { DEFAULT_STATE, formatHash } from "../hash_state.js";
import { ViewState, changeBetween, stateOfHash } from "../view_state.js";

const DEFAULTS = { exploding_norm: 1000, vanishing_norm: 1e-7 };
const info = (steps, { stats = ["l2_norm", "mean_abs"], epochs = 0, variables = 4 } = {}) =>
  ({ steps, stats, epochs, variables });
const RUNS = {
  a: { gradients: info(100, { epochs: 2 }), probe: info(30, { stats: ["l2_norm"] }) },
  b: { gradients: info(50), broken: { ...info(5), error: "unreadable" } },
  c: { probe: info(10) },
  empty: { gradients: info(0) },
};

const open = (fields = {}, runs = RUNS) => ViewState.open(DEFAULTS, runs, { ...DEFAULT_STATE, ...fields });

test("a view opens on the run and tag asked for, else the nearest with data, else on nothing", () => {
  assert.deepEqual([open({ run: "a", tag: "probe" }).state.run, open({ run: "a", tag: "probe" }).state.tag], ["a", "probe"]);
  assert.equal(open({ run: "empty" }).state.run, "a");
  assert.equal(open({ run: "c" }).state.tag, "probe");
  assert.equal(ViewState.open(DEFAULTS, { empty: RUNS.empty }, DEFAULT_STATE), null, "no tag has data yet");
});

test("the state is replaced by each change, never edited", () => {
  const view = open({ run: "a", tag: "gradients" });
  const before = view.state;
  assert.ok(Object.isFrozen(before));
  view.change({ stat: "mean_abs" });
  assert.equal(before.stat, "l2_norm");
  assert.equal(view.state.stat, "mean_abs");
  assert.ok(Object.isFrozen(view.state));
});

test("another run opens on its first tag with data, over the whole run", () => {
  const view = open({ run: "a", tag: "probe", zoom: [10, 20] });
  const change = view.change({ run: "b" });
  assert.deepEqual([view.state.run, view.state.tag, view.state.zoom], ["b", "gradients", null]);
  assert.deepEqual(change, { needs: "reload", clearsSelection: true, runChanged: true });
  view.change({ run: "c" });
  assert.equal(view.state.tag, "probe");
});

test("another tag or the other axis drops the zoom; a stat, the rows or a threshold keep it", () => {
  const zoomed = (fields = {}) => open({ run: "a", tag: "gradients", zoom: [10, 20], ...fields });
  let view = zoomed();
  view.change({ tag: "probe" });
  assert.equal(view.state.zoom, null);
  view = zoomed();
  view.change({ axis: "epoch" });
  assert.equal(view.state.zoom, null);
  for (const changes of [{ stat: "mean_abs" }, { rows: "layers" }, { thresholds: { exploding_norm: 5 } },
    { compare: "b" }]) {
    view = zoomed();
    view.change(changes);
    assert.deepEqual(view.state.zoom, [10, 20], JSON.stringify(changes));
  }
});

test("picking what is already shown changes nothing and resets nothing", () => {
  const view = open({ run: "a", tag: "gradients", axis: "step", zoom: [10, 20] });
  for (const changes of [{ run: "a" }, { tag: "gradients" }, { axis: "step" }, { zoom: [10, 20] }, { thresholds: {} }]) {
    assert.deepEqual(view.change(changes), { needs: null, clearsSelection: false, runChanged: false });
  }
  assert.deepEqual(view.state.zoom, [10, 20]);
});

test("a stat the new tag does not log falls back to the default one", () => {
  const view = open({ run: "a", tag: "gradients", stat: "mean_abs" });
  view.change({ tag: "probe" });
  assert.equal(view.state.stat, "l2_norm");
});

test("the comparison's mode is only drawn again; every other field asks the plugin again", () => {
  const before = { ...DEFAULT_STATE, run: "a", tag: "gradients", compare: "b" };
  assert.equal(changeBetween(before, { ...before, compareMode: "ratio" }).needs, "redraw");
  for (const [field, value] of [["run", "b"], ["tag", "probe"], ["stat", "mean_abs"], ["axis", "epoch"],
    ["rows", "layers"], ["zoom", [1, 2]], ["compare", null], ["thresholds", { exploding_norm: 5 }]]) {
    assert.equal(changeBetween(before, { ...before, [field]: value }).needs, "reload", field);
  }
  assert.equal(changeBetween(before, { ...before, compareMode: "ratio", stat: "mean_abs" }).needs, "reload");
  assert.equal(changeBetween(before, { ...before }).needs, null);
});

test("threshold overrides are the same in any order", () => {
  const before = { ...DEFAULT_STATE, thresholds: { exploding_norm: 5, vanishing_norm: 1e-9 } };
  const after = { ...DEFAULT_STATE, thresholds: { vanishing_norm: 1e-9, exploding_norm: 5 } };
  assert.equal(changeBetween(before, after).needs, null);
});

test("a selected cell's details go with another run, tag or kind of row, and stay with anything else", () => {
  const before = { ...DEFAULT_STATE, run: "a", tag: "gradients" };
  for (const [field, value] of [["run", "b"], ["tag", "probe"], ["rows", "layers"]]) {
    assert.equal(changeBetween(before, { ...before, [field]: value }).clearsSelection, true, field);
  }
  for (const [field, value] of [["stat", "mean_abs"], ["axis", "epoch"], ["zoom", [1, 2]], ["compare", "b"],
    ["thresholds", { exploding_norm: 5 }]]) {
    assert.equal(changeBetween(before, { ...before, [field]: value }).clearsSelection, false, field);
  }
});

test("a typed threshold overrides the default, an emptied one restores it, anything else is refused", () => {
  const view = open({ run: "a", tag: "gradients" });
  assert.equal(view.setThreshold("exploding_norm", "1e-6").needs, "reload");
  assert.deepEqual(view.state.thresholds, { exploding_norm: 1e-6 });
  assert.deepEqual(view.thresholds(), { exploding_norm: 1e-6, vanishing_norm: 1e-7 });
  for (const text of ["-1", "0", "abc", "Infinity"]) {
    assert.throws(() => view.setThreshold("exploding_norm", text), {
      name: "RangeError", message: "exploding_norm must be a positive number",
    });
  }
  assert.deepEqual(view.state.thresholds, { exploding_norm: 1e-6 }, "a refused value changes nothing");
  view.setThreshold("exploding_norm", "  ");
  assert.deepEqual(view.state.thresholds, {});
  assert.deepEqual(view.thresholds(), DEFAULTS);
});

test("the hash is followed whole: a link may name another run and a zoom at once", () => {
  const view = open({ run: "a", tag: "gradients" });
  const change = view.followHash("#run=b&tag=gradients&zoom=5-9&stat=mean_abs");
  assert.deepEqual(change, { needs: "reload", clearsSelection: true, runChanged: true });
  assert.deepEqual([view.state.run, view.state.zoom, view.state.stat], ["b", [5, 9], "mean_abs"]);
  assert.equal(view.followHash(view.hash()).needs, null, "the hash the tab wrote changes nothing");
  assert.equal(view.followHash("#run=b&tag=gradients&zoom=5-9&stat=mean_abs&compare_mode=ratio").needs, null,
    "no mode without a comparison");
});

test("a hash naming a run without data shows the nearest that has", () => {
  const view = open({ run: "b", tag: "gradients" });
  view.followHash("#run=empty");
  assert.deepEqual([view.state.run, view.state.tag], ["a", "gradients"]);
});

test("the hash holds the view and reads back to it, thresholds by the plugin's names", () => {
  const view = open({ run: "a", tag: "gradients", rows: "layers", zoom: [3, 4] });
  view.setThreshold("vanishing_norm", "1e-9");
  assert.equal(view.hash(), formatHash(view.state));
  assert.deepEqual(stateOfHash(view.hash(), DEFAULTS), view.state);
  assert.deepEqual(stateOfHash("#t.unknown=3&t.exploding_norm=2", DEFAULTS).thresholds, { exploding_norm: 2 });
});

test("a newer runs answer reloads only when the shown tag grew", () => {
  const view = open({ run: "a", tag: "gradients" });
  const runs = (gradients) => ({ ...RUNS, a: { ...RUNS.a, gradients } });
  assert.equal(view.setRuns(runs(info(100, { epochs: 2 }))).needs, null);
  assert.equal(view.setRuns(runs(info(120, { epochs: 2 }))).needs, "reload", "more steps");
  assert.equal(view.setRuns(runs(info(120, { epochs: 2, variables: 6 }))).needs, "reload", "other variables");
  assert.equal(view.info().steps, 120);
  assert.equal(view.setRuns({ b: RUNS.b }).needs, null, "the shown run gone: the view stays");
});

test("the queries: columns up to the plot's width, the axis and zoom asked, overrides on every route", () => {
  const view = open({ run: "a", tag: "gradients", stat: "mean_abs", rows: "layers", zoom: [10, 20],
    thresholds: { exploding_norm: 5 } });
  const { heatmap, alerts, compare } = view.queries(800);
  assert.deepEqual(alerts, { run: "a", tag: "gradients", exploding_norm: "5" });
  assert.deepEqual(heatmap, {
    ...alerts, stat: "mean_abs", rows: "layers", encoding: "base64", max_steps: 800, axis: null,
    first_step: 10, last_step: 20,
  });
  assert.equal(compare, null);
  assert.equal(view.queries(9000).heatmap.max_steps, 4000, "no more columns than a wide screen has");
  assert.deepEqual(view.thresholdParams(), { exploding_norm: "5" });
  view.change({ axis: "epoch" });
  assert.deepEqual([view.queries(800).heatmap.axis, view.queries(800).heatmap.first_step], ["epoch", null]);
});

test("a run is compared only while it is another run with the shown tag; else the status says why", () => {
  const view = open({ run: "a", tag: "gradients", compare: "b" });
  assert.equal(view.compareRun(), "b");
  assert.equal(view.queries(100).compare, "b");
  assert.equal(view.compareProblem(), "");
  view.change({ compare: "c" });
  assert.equal(view.compareRun(), null);
  assert.equal(view.compareProblem(), "Cannot compare with c: it has no tag gradients.");
  view.change({ compare: null });
  assert.equal(view.compareProblem(), "");
});

test("the pickers' lists: runs with data in natural order, the shown run's readable tags", () => {
  const view = open({ run: "b", tag: "gradients" });
  assert.deepEqual(view.runNames(), ["a", "b", "c"]);
  assert.deepEqual(view.tags(), ["gradients"]);
  view.change({ run: "a" });
  assert.deepEqual(view.tags(), ["gradients", "probe"]);
  assert.equal(view.axis(), "step", "two epochs: the steps show when the run went wrong");
});
