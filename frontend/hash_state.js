// The view's state in the URL hash, so a link reproduces what the user saw, and what of it the
// plugin's `runs` answer can show (pure, no DOM).
//
//   #run=train&tag=gradients&stat=l2_norm&axis=epoch&rows=layers&zoom=100-2000&t.exploding_norm=100
//
// Threshold overrides carry a "t." prefix and are sent to the plugin as they are; anything
// unknown or malformed in a hand-edited hash is dropped rather than breaking the view.

import { naturalCompare } from "./runs.js";

export const DEFAULT_STATE = Object.freeze({
  run: null,
  tag: null,
  stat: "l2_norm",
  axis: null, // "step" or "epoch"; null: the run decides (see `resolvedAxis`)
  rows: "variables", // or "layers": one row per layer, its variables combined
  zoom: null, // [first step, last step] or null for the whole run
  compare: null, // another run to compare with, or null
  compareMode: "side", // "side" (both heatmaps side by side) or "ratio" (log10 of run / compare)
  thresholds: Object.freeze({}),
});

const THRESHOLD_PREFIX = "t.";

function validZoom(text) {
  const match = /^(\d+)-(\d+)$/.exec(text || "");
  if (!match) return null;
  const [first, last] = [Number(match[1]), Number(match[2])];
  return first <= last && Number.isSafeInteger(last) ? [first, last] : null;
}

/** The state a hash describes; `thresholdNames` are the overrides the plugin accepts. */
export function parseHash(hash, thresholdNames) {
  const params = new URLSearchParams((hash || "").replace(/^#/, ""));
  const known = new Set(thresholdNames);
  const thresholds = {};
  for (const [key, value] of params) {
    if (!key.startsWith(THRESHOLD_PREFIX)) continue;
    const name = key.slice(THRESHOLD_PREFIX.length);
    const number = Number(value);
    if (known.has(name) && value.trim() !== "" && Number.isFinite(number) && number > 0) {
      thresholds[name] = number;
    }
  }
  return {
    run: params.get("run") || null,
    tag: params.get("tag") || null,
    stat: params.get("stat") || DEFAULT_STATE.stat,
    axis: ["step", "epoch"].includes(params.get("axis")) ? params.get("axis") : null,
    rows: params.get("rows") === "layers" ? "layers" : DEFAULT_STATE.rows,
    zoom: validZoom(params.get("zoom")),
    compare: params.get("compare") || null,
    compareMode: params.get("compare_mode") === "ratio" ? "ratio" : DEFAULT_STATE.compareMode,
    thresholds,
  };
}

/** The hash for a state, omitting defaults (so a default view has a short link). */
export function formatHash(state) {
  const params = new URLSearchParams();
  if (state.run) params.set("run", state.run);
  if (state.tag) params.set("tag", state.tag);
  if (state.stat && state.stat !== DEFAULT_STATE.stat) params.set("stat", state.stat);
  if (state.axis) params.set("axis", state.axis);
  if (state.rows && state.rows !== DEFAULT_STATE.rows) params.set("rows", state.rows);
  if (state.zoom) params.set("zoom", `${state.zoom[0]}-${state.zoom[1]}`);
  if (state.compare) params.set("compare", state.compare);
  if (state.compare && state.compareMode && state.compareMode !== DEFAULT_STATE.compareMode) {
    params.set("compare_mode", state.compareMode);
  }
  for (const name of Object.keys(state.thresholds || {}).sort()) {
    params.set(THRESHOLD_PREFIX + name, String(state.thresholds[name]));
  }
  const text = params.toString();
  return text ? `#${text}` : "";
}

/** The plugin query parameters for a state's threshold overrides. */
export function thresholdParams(state) {
  return Object.fromEntries(Object.entries(state.thresholds || {}).map(([k, v]) => [k, String(v)]));
}

/** Whether a tag of the `runs` answer has something to show: readable, with logged steps. */
export function hasData(info) {
  return !info.error && info.steps > 0;
}

/** [run, tag] of every tag of a `runs` answer with data, runs and tags in natural order. */
export function usableTags(runs) {
  return Object.entries(runs).flatMap(([run, tags]) =>
    Object.entries(tags).filter(([, info]) => hasData(info)).map(([tag]) => [run, tag]))
    .sort(([runA, tagA], [runB, tagB]) => naturalCompare(runA, runB) || naturalCompare(tagA, tagB));
}

/**
 * `state` with a run and tag that have data: the state's own when they do, else its run's first
 * tag with data, else the first with data of any run (natural order); its stat if that tag has
 * it, else the default one. Null while no tag has data (training may not have logged anything
 * yet).
 */
export function withRunAndTag(state, runs) {
  const usable = usableTags(runs);
  if (!usable.length) return null;
  const [run, tag] = usable.find(([r, t]) => r === state.run && t === state.tag)
    || usable.find(([r]) => r === state.run) || usable[0];
  const stat = runs[run][tag].stats.includes(state.stat) ? state.stat : DEFAULT_STATE.stat;
  return { ...state, run, tag, stat };
}

// Runs with at most this many logged steps per epoch, and at least this many epochs, open on
// the layer-by-epoch view. Fewer columns hide when things went wrong: a run that diverged in its
// second of two epochs is one red column of two there, while its steps show the onset.
const EPOCH_VIEW_MAX_STEPS_PER_EPOCH = 500;
const EPOCH_VIEW_MIN_EPOCHS = 8;

/**
 * The axis to show: the user's choice, else epochs when the run has at least
 * `EPOCH_VIEW_MIN_EPOCHS` epoch marks and at most a few hundred logged steps per epoch (one
 * column per epoch then reads at a glance), else steps. `info` is the run's entry from the
 * plugin's `runs` route.
 */
export function resolvedAxis(state, info) {
  if (state.axis === "epoch" && info.epochs) return "epoch";
  if (state.axis) return "step";
  const perEpoch = info.epochs ? info.steps / info.epochs : Infinity;
  return info.epochs >= EPOCH_VIEW_MIN_EPOCHS && perEpoch <= EPOCH_VIEW_MAX_STEPS_PER_EPOCH
    ? "epoch" : "step";
}
