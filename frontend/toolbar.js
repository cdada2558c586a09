// The toolbar above the heatmap: run, tag and stat pickers, steps or epochs, variables or layers,
// the comparison's controls, the zoom's reset, the thresholds form (opened by its button), CSV
// and PNG downloads. Built once and shown again in place at each change of the view (controls.js:
// an open picker or a focused control stays as it is); it reports what the user picks, and
// whether the form is open is all it keeps.

import { routeUrl } from "./api.js";
import { CompareControls } from "./compare_view.js";
import { Picker, Segmented } from "./controls.js";
import { el, setAttributes } from "./dom.js";
import { formatStep } from "./format.js";

export class Toolbar {
  /**
   * `vocabulary`: the served one (stat labels, the form's thresholds); `defaults`: the
   * thresholds' defaults (the form's placeholders). `onChange(changes)`: fields the user picked
   * (run, tag, stat, axis, rows, zoom, compare, compareMode, thresholds); `onThreshold(name,
   * text)`: a threshold typed into the form; `onPng()`: the PNG button.
   */
  constructor({ vocabulary, defaults, onChange, onThreshold, onPng }) {
    this.vocabulary = vocabulary;
    this.run = new Picker("Run", "run-picker", (run) => onChange({ run }));
    this.tag = new Picker("Tag", "tag-picker", (tag) => onChange({ tag }));
    // Only the stats logged are offered; those the writer left out are named on hover.
    this.stat = new Picker("Stat", "stat-picker", (stat) => onChange({ stat }));
    this.axis = new Segmented("Columns", [["step", "Steps"], ["epoch", "Epochs"]], (axis) => onChange({ axis }));
    this.rows = new Segmented("Rows", [
      ["variables", "Variables"], ["layers", "Layers", { title: "one row per layer, its variables combined" }],
    ], (rows) => onChange({ rows }));
    this.compare = new CompareControls(onChange);
    this.zoom = el("button", {
      type: "button", class: "button", "data-testid": "reset-zoom", onclick: () => onChange({ zoom: null }),
    });
    this.thresholdsButton = el("button", {
      type: "button", class: "button", "aria-expanded": "false", onclick: () => this.#toggleForm(),
    }, "Thresholds");
    this.csv = el("a", { class: "button", download: "", "data-testid": "download-csv" }, "CSV");
    this.hint = el("span", { class: "hint" });
    // Controls that belong together wrap to the next line together, never one button alone.
    const group = (...controls) => el("div", { class: "toolbar-group" }, controls);
    this.root = el("div", { class: "toolbar" },
      group(this.run.root, this.tag.root, this.stat.root),
      group(this.axis.root, this.rows.root),
      group(this.compare.picker.root),
      group(this.thresholdsButton, this.csv,
        el("button", { type: "button", class: "button", onclick: () => onPng() }, "PNG")),
      this.hint);
    this.inputs = vocabulary.formThresholds().map(({ name }) => el("input", {
      name, type: "number", step: "any", min: "0", "data-testid": `threshold-${name}`,
      placeholder: String(defaults[name]),
      onchange: (event) => onThreshold(name, event.target.value),
    }));
    this.form = el("form", { class: "thresholds", hidden: true },
      vocabulary.formThresholds().map(({ label }, index) => el("label", {}, label, this.inputs[index])),
      el("button", { type: "button", class: "button", onclick: () => onChange({ thresholds: {} }) },
        "Reset to defaults"));
  }

  /** Shows `view` (a ViewState): each control takes the view's value where it differs. */
  show(view) {
    const { state } = view;
    const info = view.info();
    const axis = view.axis();
    const runNames = view.runNames();
    this.run.show(runNames.map((run) => [run, run]), state.run);
    this.tag.show(view.tags().map((tag) => [tag, tag]), state.tag);
    this.stat.show(this.vocabulary.heatmapStats(info.stats), state.stat, info.not_logged
      && `not logged for this tag: ${info.not_logged.map((name) => this.vocabulary.statLabel(name)).join(", ")}`);
    this.axis.show(axis, (value) => ({
      disabled: value === "epoch" && !info.epochs,
      title: value === "epoch" && !info.epochs ? "this run has no epoch marks" : null,
    }));
    this.rows.show(state.rows);
    this.compare.show(state, runNames);
    this.#showZoom(state.zoom);
    setAttributes(this.csv, { href: routeUrl("export", { run: state.run, tag: state.tag, format: "csv" }) });
    this.hint.textContent = axis === "step" ? "Drag across the heatmap to zoom into steps." : "";
    this.inputs.forEach((input) => {
      const text = String(state.thresholds[input.name] ?? "");
      // A field being typed into keeps what the user typed.
      if (input.value !== text && input !== input.ownerDocument.activeElement) input.value = text;
    });
  }

  // The zoom's reset button, in front of the thresholds button while a range of steps is shown.
  #showZoom(zoom) {
    if (!zoom) {
      this.zoom.remove();
      return;
    }
    this.zoom.textContent = `Steps ${formatStep(zoom[0])}–${formatStep(zoom[1])} ✕`;
    if (!this.zoom.parentNode) this.thresholdsButton.before(this.zoom);
  }

  #toggleForm() {
    this.form.hidden = !this.form.hidden;
    setAttributes(this.thresholdsButton, { "aria-expanded": String(!this.form.hidden) });
  }
}
