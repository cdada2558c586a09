// The toolbar above the heatmap: run, tag and stat pickers, steps or epochs, variables or layers,
// the zoom's reset, the thresholds form (opened by its button), CSV and PNG downloads. It shows
// the controller's state and reports what the user changes; whether the form is open is all it
// keeps.

import { routeUrl } from "./api.js";
import { compareControls } from "./compare_view.js";
import { el, replaceChildren } from "./dom.js";
import { formatStep } from "./format.js";
import { usableTags } from "./hash_state.js";

export class Toolbar {
  /**
   * `onChange(changes)`: a state change (run, tag, stat, axis, rows, zoom, thresholds);
   * `onThreshold(name, text)`: a threshold typed into the form; `onPng()`: the PNG button.
   */
  constructor({ onChange, onThreshold, onPng }) {
    Object.assign(this, { onChange, onThreshold, onPng });
    this.root = el("div", { class: "toolbar" });
    this.form = el("form", { class: "thresholds", hidden: true });
  }

  /**
   * Shows `view`: {state, runs (the `runs` answer), axis (the one shown), vocabulary, defaults
   * (the thresholds' defaults)}.
   */
  render(view) {
    this.view = view;
    const { state, runs, axis, vocabulary } = view;
    const info = runs[state.run][state.tag];
    const select = (label, value, options, onchange, testid, title = null) => el("label", { title }, label,
      el("select", { "data-testid": testid, onchange: (event) => onchange(event.target.value) },
        options.map(([v, text]) => el("option", { value: v, selected: v === value }, text))));
    const runNames = [...new Set(usableTags(runs).map(([run]) => run))]; // in natural order
    const tags = Object.keys(runs[state.run]).filter((tag) => !runs[state.run][tag].error);
    const axisButtons = el("div", { class: "segmented", role: "group", "aria-label": "Columns" },
      ["step", "epoch"].map((value) => el("button", {
        type: "button", "aria-pressed": String(axis === value), disabled: value === "epoch" && !info.epochs,
        title: value === "epoch" && !info.epochs ? "this run has no epoch marks" : null,
        onclick: () => this.onChange({ axis: value, zoom: null }),
      }, value === "step" ? "Steps" : "Epochs")));
    const rowButtons = el("div", { class: "segmented", role: "group", "aria-label": "Rows" },
      [["variables", "Variables"], ["layers", "Layers"]].map(([value, text]) => el("button", {
        type: "button", "aria-pressed": String(state.rows === value),
        title: value === "layers" ? "one row per layer, its variables combined" : null,
        onclick: () => this.onChange({ rows: value }),
      }, text)));
    const csv = el("a", {
      class: "button", download: "", "data-testid": "download-csv",
      href: routeUrl("export", { run: state.run, tag: state.tag, format: "csv" }),
    }, "CSV");
    const png = el("button", { type: "button", class: "button", onclick: () => this.onPng() }, "PNG");
    const zoom = state.zoom ? el("button", {
      type: "button", class: "button", "data-testid": "reset-zoom", onclick: () => this.onChange({ zoom: null }),
    }, `Steps ${formatStep(state.zoom[0])}–${formatStep(state.zoom[1])} ✕`) : null;
    const thresholds = el("button", {
      type: "button", class: "button", "aria-expanded": String(!this.form.hidden),
      onclick: () => {
        this.form.hidden = !this.form.hidden;
        this.render(this.view);
      },
    }, "Thresholds");
    // Controls that belong together wrap to the next line together, never one button alone.
    const group = (...controls) => el("div", { class: "toolbar-group" }, controls);
    replaceChildren(this.root,
      group(
        select("Run", state.run, runNames.map((r) => [r, r]), (run) => this.onChange({ run, tag: null, zoom: null }), "run-picker"),
        select("Tag", state.tag, tags.map((t) => [t, t]), (tag) => this.onChange({ tag, zoom: null }), "tag-picker"),
        // Only the stats logged are offered; those the writer left out are named on hover.
        select("Stat", state.stat, vocabulary.heatmapStats(info.stats), (stat) => this.onChange({ stat }), "stat-picker",
          info.not_logged && `not logged for this tag: ${info.not_logged.map((name) => vocabulary.statLabel(name)).join(", ")}`)),
      group(axisButtons, rowButtons),
      group(...compareControls({ state, runNames, onChange: this.onChange })),
      group(zoom, thresholds, csv, png),
      el("span", { class: "hint" }, axis === "step" ? "Drag across the heatmap to zoom into steps." : ""));
    this.#renderForm();
  }

  #renderForm() {
    const { state, vocabulary, defaults } = this.view;
    const inputs = vocabulary.formThresholds().map(({ name, label }) => el("label", {}, label,
      el("input", {
        name, type: "number", step: "any", min: "0", "data-testid": `threshold-${name}`,
        placeholder: String(defaults[name]),
        value: state.thresholds[name] ?? "",
        onchange: (event) => this.onThreshold(name, event.target.value),
      })));
    replaceChildren(this.form, inputs,
      el("button", { type: "button", class: "button", onclick: () => this.onChange({ thresholds: {} }) },
        "Reset to defaults"));
  }
}
