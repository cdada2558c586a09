// What one heatmap cell says (pure, no DOM): its value in words, which logged step of its
// variable stands for it when the cell merges several steps (an epoch column, or more steps than
// pixels), so that the tooltip and the details describe the cell as it is drawn, and the stats
// they list there. A writer may log only some stats (the `runs` answer's `not_logged`): the
// tooltip leaves those out, the details say "not logged"; neither ever shows a value it lacks.
// Between two steps with every stat a monitor may log only the norms (format 1.6, the `series`
// answer's `full` and `stats_every`): the other stats there read "not logged at this step".

import { toNumber } from "./decode.js";
import { formatStep, formatValue } from "./format.js";
import { nearestIndex } from "./layout.js";
import { classPaints, makeFolder } from "./raster.js";

// Scales of statistics that count entries or give their share: still true of a gradient with
// NaN/Inf entries (its NaN count is the point).
const ENTRY_COUNT_SCALES = new Set(["count", "fraction"]);

/**
 * A cell's value as the tooltip and the details say it, `cls` its class (the vocabulary's) and
 * `scaleKind` its statistic's scale. Most statistics are taken over the gradient's finite
 * entries, so a gradient that is all NaN has a norm of 0: for a cell of the non-finite class the
 * class's word replaces such a value. Counts and fractions of entries stay numbers.
 */
export function cellValueText(value, cls, scaleKind) {
  if (cls?.nonfinite && !ENTRY_COUNT_SCALES.has(scaleKind)) return cls.label;
  return formatValue(value);
}

// The key stats the tooltip adds after a pause on a cell, [word, stat] per line.
const KEY_STATS = [
  [["norm", "l2_norm"], ["max |g|", "abs_max"]],
  [["zero fraction", "zero_fraction"], ["NaN", "nan_count"], ["Inf", "inf_count"]],
];

// What the details say of a stat the tag's writer did not log.
export const NOT_LOGGED = "not logged";
// What they say of a stat logged at other steps than this norms-only one.
export const NOT_LOGGED_HERE = "not logged at this step";

/** Whether `series` (a `series` answer) holds only the norms at `index`. */
export function normsOnly(series, index) {
  return Array.isArray(series.full) && series.full[index] === false;
}

/** Whether stat `name` of `series` (a `series` answer) has a value at its norms-only steps too. */
export function loggedEveryStep(series, name) {
  return Array.isArray(series.every_step) && series.every_step.includes(name);
}

/** The tooltip's line for a norms-only step: which stats it holds and when the rest are. */
export function normsOnlyLine(series) {
  return `only the norms and NaN/Inf counts logged at this step (every statistic once every ${series.stats_every} logged steps)`;
}

/**
 * The tooltip's lines of key stats at `index` of `series` (a `series` answer), `cls` the step's
 * class: "at step N<merged>: norm …, max |g| …" then "zero fraction …, NaN …, Inf …", each stat
 * the series lacks left out (a line left with none goes). `merged`: what follows the step when
 * the cell merges several (" (its worst)"), else "".
 */
export function keyStatsLines(series, index, cls, vocabulary, merged = "") {
  const sparse = normsOnly(series, index);
  const [first, ...rest] = KEY_STATS.map((line) => line
    .filter(([, name]) => name in series.stats && !(sparse && !loggedEveryStep(series, name)))
    .map(([word, name]) => `${word} ${statText(series, name, index, cls, vocabulary)}`).join(", "));
  return [`at step ${formatStep(series.steps[index])}${merged}: ${first}`, ...rest.filter(Boolean),
    ...(sparse ? [normsOnlyLine(series)] : [])];
}

/**
 * The details' table at `index` of `series`: [name, text, logged] of every stat the series has,
 * in its order, then of each of `notLogged` (the tag's `not_logged`), its text `NOT_LOGGED`.
 */
export function statRows(series, index, cls, vocabulary, notLogged = []) {
  return [
    ...Object.keys(series.stats).map((name) => [name, statText(series, name, index, cls, vocabulary), true]),
    ...notLogged.filter((name) => !(name in series.stats)).map((name) => [name, NOT_LOGGED, false]),
  ];
}

function statText(series, name, index, cls, vocabulary) {
  if (normsOnly(series, index) && !loggedEveryStep(series, name)) return NOT_LOGGED_HERE;
  return cellValueText(toNumber(series.stats[name][index]), cls, vocabulary.statScale(name));
}

/**
 * The index in `series` (a `series` answer) of the step that a cell covering logged steps
 * [firstStep, lastStep] is drawn as: the worst class there and, among its steps, the most
 * extreme `stat` value (the rule columns are merged by). The step nearest `firstStep` when the
 * series has none in the range.
 */
export function representativeIndex(series, stat, firstStep, lastStep, vocabulary) {
  const fold = makeFolder(classPaints(vocabulary.classes));
  const values = series.stats[stat] || [];
  const state = { cls: -1, value: NaN, at: -1 };
  series.steps.forEach((step, i) => {
    if (step >= firstStep && step <= lastStep) {
      fold(state, vocabulary.classCode(series.classes[i]), toNumber(values[i]), i);
    }
  });
  return state.at >= 0 ? state.at : nearestIndex(series.steps, firstStep);
}

/**
 * What a heatmap row is, under its name, in the tooltip and the details: by variable, the
 * variable's layer; by layer (`rowsBy` "layers"), that the row combines the layer's variables.
 */
export function rowContext(rowsBy, layer) {
  return rowsBy === "layers" ? "layer · its variables as one tensor" : `layer ${layer}`;
}
