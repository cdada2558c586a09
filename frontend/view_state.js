// The tab's view state as one model (pure, no DOM): what the user looks at (run, tag, stat,
// axis, rows, zoom, the run compared with and how, threshold overrides), the changes the
// toolbar, the heatmap and the URL make to it, what each change resets, and whether a change
// needs new answers from the plugin or only another drawing of those the tab holds. The fields'
// defaults, their hash and what a `runs` answer can show are hash_state.js'.

import { formatHash, parseHash, resolvedAxis, thresholdParams, usableTags, withRunAndTag } from "./hash_state.js";

// The most heatmap columns the tab asks for: one per CSS pixel of the plot, up to a wide screen.
const MAX_COLUMNS = 4000;
// What picking a field resets when its value changes: another run opens on its first tag with
// data, and the zoomed steps are another tag's, or no columns of the other axis.
const RESETS = Object.freeze({
  run: { tag: null, zoom: null },
  tag: { zoom: null },
  axis: { zoom: null },
});
// Fields whose change only draws the answers held otherwise (the comparison's mode: the same two
// heatmaps side by side or as a ratio); a change of any other asks the plugin again.
const DRAWN_ONLY = new Set(["compareMode"]);
// A selected cell's details belong to a cell of one run, tag and kind of row.
const SELECTION_FIELDS = ["run", "tag", "rows"];
const FIELDS = ["run", "tag", "stat", "axis", "rows", "zoom", "compare", "compareMode", "thresholds"];
const NOTHING = Object.freeze({ needs: null, clearsSelection: false, runChanged: false });

// Threshold overrides compare by their entries, whatever order they were set in.
const canonical = (value) => JSON.stringify(
  value && typeof value === "object" && !Array.isArray(value) ? Object.entries(value).sort() : value);
const same = (a, b) => canonical(a) === canonical(b);

/** The state a URL hash asks for; `defaults` are the plugin's thresholds (the overrides it takes). */
export function stateOfHash(hash, defaults) {
  return parseHash(hash, Object.keys(defaults));
}

/**
 * What a change of state from `before` to `after` asks of the tab: `needs` is "reload" (new
 * answers), "redraw" (the answers held, drawn otherwise) or null (nothing changed);
 * `clearsSelection` when the selected cell's details no longer apply; `runChanged` when another
 * run is shown.
 */
export function changeBetween(before, after) {
  const changed = FIELDS.filter((field) => !same(before[field], after[field]));
  if (!changed.length) return NOTHING;
  return Object.freeze({
    needs: changed.every((field) => DRAWN_ONLY.has(field)) ? "redraw" : "reload",
    clearsSelection: SELECTION_FIELDS.some((field) => changed.includes(field)),
    runChanged: changed.includes("run"),
  });
}

export class ViewState {
  /**
   * The view of `asked` (a state, hash_state's fields) in `runs` (the plugin's `runs` answer) with
   * a run and tag that have data, or null while no tag has any (training may not have logged
   * yet). `defaults`: the plugin's threshold defaults.
   */
  static open(defaults, runs, asked) {
    const shown = withRunAndTag(asked, runs);
    return shown && new ViewState(defaults, runs, shown);
  }

  constructor(defaults, runs, state) {
    this.defaults = defaults;
    this.runs = runs;
    this.state = Object.freeze(state);
  }

  /** The shown tag's entry of the `runs` answer. */
  info() {
    return this.runs[this.state.run][this.state.tag];
  }

  /** The axis shown: "step" or "epoch" (the user's, else the run's, see `resolvedAxis`). */
  axis() {
    return resolvedAxis(this.state, this.info());
  }

  /** The rule thresholds in force: the plugin's defaults with the overrides. */
  thresholds() {
    return { ...this.defaults, ...this.state.thresholds };
  }

  /** Runs with a tag that has data, in natural order (the run and compare pickers' list). */
  runNames() {
    return [...new Set(usableTags(this.runs).map(([run]) => run))];
  }

  /** The shown run's readable tags. */
  tags() {
    const tags = this.runs[this.state.run];
    return Object.keys(tags).filter((tag) => !tags[tag].error);
  }

  /** The run to compare with: the state's, while it is another run with the shown tag. */
  compareRun() {
    const { compare, run, tag } = this.state;
    return compare && compare !== run && this.runs[compare] && this.runs[compare][tag] ? compare : null;
  }

  /** Why the run picked to compare with is not compared, or "". */
  compareProblem() {
    const { compare, tag } = this.state;
    return compare && !this.compareRun() && compare !== this.state.run
      ? `Cannot compare with ${compare}: it has no tag ${tag}.` : "";
  }

  /** The threshold overrides as the plugin's routes take them. */
  thresholdParams() {
    return thresholdParams(this.state);
  }

  /**
   * The plugin's query parameters for this view: `heatmap` (at most `width` columns), `alerts`,
   * and `compare`, the run whose heatmap is asked with the same parameters (or null).
   */
  queries(width) {
    const { run, tag, stat, rows, zoom } = this.state;
    const alerts = { run, tag, ...this.thresholdParams() };
    const heatmap = {
      ...alerts, stat, rows, encoding: "base64",
      max_steps: Math.min(MAX_COLUMNS, width),
      axis: this.axis() === "epoch" ? "epoch" : null,
      first_step: zoom ? zoom[0] : null,
      last_step: zoom ? zoom[1] : null,
    };
    return { heatmap, alerts, compare: this.compareRun() };
  }

  /** The URL hash of this view. */
  hash() {
    return formatHash(this.state);
  }

  /**
   * The user picked `changes` (some of the fields): they apply with what each resets when its
   * value changes (`RESETS`). Returns the change (`changeBetween`).
   */
  change(changes) {
    const resets = Object.entries(changes)
      .filter(([field, value]) => RESETS[field] && !same(value, this.state[field]))
      .map(([field]) => RESETS[field]);
    return this.#commit(Object.assign({ ...this.state }, ...resets, changes));
  }

  /**
   * The user typed `text` as threshold `name`: a positive number overrides the default, an empty
   * field restores it, anything else throws a RangeError saying so (the state is kept).
   */
  setThreshold(name, text) {
    const thresholds = { ...this.state.thresholds };
    const value = Number(text);
    if (text.trim() === "") delete thresholds[name];
    else if (Number.isFinite(value) && value > 0) thresholds[name] = value;
    else throw new RangeError(`${name} must be a positive number`);
    return this.change({ thresholds });
  }

  /** The URL's hash changed (a link, the back button, a hand edit): the state it asks for, whole. */
  followHash(hash) {
    const asked = stateOfHash(hash, this.defaults);
    if (formatHash(asked) === this.hash()) return NOTHING;
    return this.#commit(asked);
  }

  /** A newer `runs` answer: a reload when the shown tag grew (more steps or other variables). */
  setRuns(runs) {
    const before = this.info();
    this.runs = runs;
    const after = runs[this.state.run] && runs[this.state.run][this.state.tag];
    const grown = after && (after.steps !== before.steps || after.variables !== before.variables);
    return grown ? Object.freeze({ ...NOTHING, needs: "reload" }) : NOTHING;
  }

  // `next` becomes the state, with a run and tag that have data; a state no tag can show (every
  // tag lost its data since) is kept without asking for anything.
  #commit(next) {
    const shown = withRunAndTag(next, this.runs);
    const change = changeBetween(this.state, shown || next);
    this.state = Object.freeze(shown || next);
    return shown ? change : Object.freeze({ ...change, needs: null });
  }
}
