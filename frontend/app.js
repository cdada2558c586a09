// The Gradients tab: pickers, the heatmap, alerts, details, thresholds and their URL hash.

import { getJson, lossTag, routeUrl } from "./api.js";
import { makeScale } from "./colormap.js";
import { decodeHeatmap, toNumber } from "./decode.js";
import { el, replaceChildren } from "./dom.js";
import { formatStep, formatValue } from "./format.js";
import { formatHash, parseHash, resolvedAxis, thresholdParams } from "./hash_state.js";
import { nearestIndex, renderDetails } from "./details.js";
import { HeatmapView } from "./heatmap_view.js";
import { dataProblems, problemLine, problemsSummary } from "./problems.js";

const STAT_LABELS = {
  l2_norm: "L2 norm",
  mean_abs: "mean |g|",
  abs_max: "max |g|",
  std: "std",
  zero_fraction: "zero fraction",
  nan_count: "NaN count",
  inf_count: "Inf count",
  grad_weight_ratio: "gradient / weight",
  update_weight_ratio: "update / weight",
  update_l2_norm: "update L2 norm",
  weight_l2_norm: "weight L2 norm",
  mean: "mean",
  min: "min",
  max: "max",
};
// The thresholds offered in the form (every one is also accepted in the hash).
const EDITABLE_THRESHOLDS = [
  ["vanishing_norm", "vanishing below (norm)"],
  ["exploding_norm", "exploding above (norm)"],
  ["depth_ratio", "vanishing by depth below (x output layers)"],
  ["spike_zscore", "spike at robust z-score"],
  ["sustain_steps", "sustained for (logged steps)"],
];
const SEVERITY_RANK = { critical: 0, warning: 1, info: 2 };
const REFRESH_MS = 30000;
const HOVER_STATS_DELAY_MS = 150;

const KERAS_SNIPPET = `from tensorboard_gradients.keras import GradientMonitor
model.fit(x, y, callbacks=[GradientMonitor(log_dir="logs")])`;
const LOOP_SNIPPET = `from tensorboard_gradients import summary
with writer.as_default(step=step):
    summary.gradients(grads, model.trainable_variables)`;

export class App {
  constructor(root) {
    this.root = root;
    this.status = el("div", { class: "status", role: "status" });
    this.toolbar = el("div", { class: "toolbar" });
    this.thresholdForm = el("form", { class: "thresholds", hidden: true });
    this.problemsPanel = el("details", { class: "problems", open: true, hidden: true, "data-testid": "data-problems" });
    this.view = new HeatmapView({
      onSelect: (row, column) => this.selectCell(row, column),
      onHover: (cell) => this.hoverCell(cell),
      onZoom: (zoom) => this.update({ zoom }),
      onResize: () => this.refetchIfWider(),
    });
    this.alertsPanel = el("section", { class: "alerts", "aria-label": "Alerts" });
    this.detailsPanel = el("section", { class: "details", hidden: true, "aria-label": "Details" });
    this.main = el("div", { class: "main" });
    replaceChildren(root, el("div", { class: "gradients-app" },
      this.toolbar, this.thresholdForm, this.status, this.problemsPanel, this.main));
    this.matrix = null;
    this.selected = null;
    this.loadToken = 0;
  }

  async start() {
    this.setStatus("Loading…", "loading");
    try {
      const [defaults, runs] = await Promise.all([getJson("thresholds"), getJson("runs")]);
      this.defaults = defaults.defaults;
      this.runs = runs;
    } catch (error) {
      this.showError(error);
      return;
    }
    this.state = parseHash(window.location.hash, Object.keys(this.defaults));
    if (!this.pickRunAndTag()) {
      this.showEmpty();
      setTimeout(() => this.start(), REFRESH_MS); // training may not have logged anything yet
      return;
    }
    window.addEventListener("hashchange", () => this.onHashChange());
    setInterval(() => this.refreshIfGrown(), REFRESH_MS);
    this.renderProblems();
    await this.load();
  }

  /** Keeps the hash's run/tag when they exist, else the first run/tag with data. */
  pickRunAndTag() {
    const usable = Object.entries(this.runs).flatMap(([run, tags]) =>
      Object.entries(tags).filter(([, info]) => !info.error && info.steps > 0).map(([tag]) => [run, tag]));
    if (!usable.length) return false;
    const wanted = usable.find(([run, tag]) => run === this.state.run && tag === this.state.tag)
      || usable.find(([run]) => run === this.state.run) || usable[0];
    [this.state.run, this.state.tag] = wanted;
    const stats = this.info().stats;
    if (!stats.includes(this.state.stat)) this.state.stat = "l2_norm";
    return true;
  }

  info() {
    return this.runs[this.state.run][this.state.tag];
  }

  axis() {
    return resolvedAxis(this.state, this.info());
  }

  setStatus(text, kind = "info") {
    replaceChildren(this.status, text ? el("span", { class: `status-${kind}` }, text) : null);
  }

  showError(error) {
    this.setStatus(`Could not load gradients: ${error.message}`, "error");
  }

  showEmpty() {
    this.setStatus("");
    replaceChildren(this.main, el("div", { class: "empty", "data-testid": "empty-state" },
      el("h2", {}, "No gradient data yet"),
      dataProblems(this.runs).map((problem) => el("p", { class: `status-${problem.severity}` }, problemLine(problem))),
      el("p", {}, "Log per-layer gradient statistics and they appear here. From Keras model.fit:"),
      el("pre", {}, KERAS_SNIPPET),
      el("p", {}, "From a custom TensorFlow training loop:"),
      el("pre", {}, LOOP_SNIPPET),
      el("p", {}, "PyTorch, JAX or numpy: tensorboard_gradients.GradientWriter (see the README).")));
  }

  /** Names every tag that cannot be read or lost steps as damaged, whichever run is shown. */
  renderProblems() {
    const problems = dataProblems(this.runs);
    this.problemsPanel.hidden = !problems.length;
    replaceChildren(this.problemsPanel, el("summary", {}, problemsSummary(problems)),
      el("ul", {}, problems.map((problem) =>
        el("li", { class: `problem problem-${problem.severity}` }, problemLine(problem)))));
  }

  renderToolbar() {
    const select = (label, value, options, onchange, testid) => el("label", {}, label,
      el("select", { "data-testid": testid, onchange: (event) => onchange(event.target.value) },
        options.map(([v, text]) => el("option", { value: v, selected: v === value }, text))));
    const runs = Object.keys(this.runs).filter((run) =>
      Object.values(this.runs[run]).some((info) => !info.error && info.steps > 0));
    const tags = Object.keys(this.runs[this.state.run]).filter((tag) => !this.runs[this.state.run][tag].error);
    const info = this.info();
    const axis = el("div", { class: "segmented", role: "group", "aria-label": "Columns" },
      ["step", "epoch"].map((value) => el("button", {
        type: "button", "aria-pressed": String(this.axis() === value), disabled: value === "epoch" && !info.epochs,
        title: value === "epoch" && !info.epochs ? "this run has no epoch marks" : null,
        onclick: () => this.update({ axis: value, zoom: null }),
      }, value === "step" ? "Steps" : "Epochs")));
    const csv = el("a", {
      class: "button", download: "", "data-testid": "download-csv",
      href: routeUrl("export", { run: this.state.run, tag: this.state.tag, format: "csv" }),
    }, "CSV");
    const png = el("button", { type: "button", class: "button", onclick: () => this.downloadPng() }, "PNG");
    const zoom = this.state.zoom ? el("button", {
      type: "button", class: "button", "data-testid": "reset-zoom", onclick: () => this.update({ zoom: null }),
    }, `Steps ${formatStep(this.state.zoom[0])}–${formatStep(this.state.zoom[1])} ✕`) : null;
    const thresholds = el("button", {
      type: "button", class: "button", "aria-expanded": String(!this.thresholdForm.hidden),
      onclick: () => { this.thresholdForm.hidden = !this.thresholdForm.hidden; this.renderToolbar(); },
    }, "Thresholds");
    replaceChildren(this.toolbar,
      select("Run", this.state.run, runs.map((r) => [r, r]), (run) => this.update({ run, tag: null, zoom: null }), "run-picker"),
      select("Tag", this.state.tag, tags.map((t) => [t, t]), (tag) => this.update({ tag, zoom: null }), "tag-picker"),
      select("Stat", this.state.stat, info.stats.filter((s) => STAT_LABELS[s]).map((s) => [s, STAT_LABELS[s]]),
        (stat) => this.update({ stat }), "stat-picker"),
      axis, zoom, thresholds, csv, png,
      el("span", { class: "hint" }, this.axis() === "step" ? "Drag across the heatmap to zoom into steps." : ""));
    this.renderThresholdForm();
  }

  renderThresholdForm() {
    const inputs = EDITABLE_THRESHOLDS.map(([name, label]) => el("label", {}, label,
      el("input", {
        name, type: "number", step: "any", min: "0", "data-testid": `threshold-${name}`,
        placeholder: String(this.defaults[name]),
        value: this.state.thresholds[name] ?? "",
        onchange: (event) => this.setThreshold(name, event.target.value),
      })));
    replaceChildren(this.thresholdForm, inputs,
      el("button", { type: "button", class: "button", onclick: () => this.update({ thresholds: {} }) },
        "Reset to defaults"));
  }

  setThreshold(name, text) {
    const thresholds = { ...this.state.thresholds };
    const value = Number(text);
    if (text.trim() === "") delete thresholds[name];
    else if (Number.isFinite(value) && value > 0) thresholds[name] = value;
    else {
      this.setStatus(`${name} must be a positive number`, "error");
      return;
    }
    this.update({ thresholds });
  }

  /** Applies a state change: hash, toolbar, data. */
  update(changes) {
    Object.assign(this.state, changes);
    if (changes.run !== undefined || changes.tag !== undefined) {
      if (!this.state.tag || !this.runs[this.state.run][this.state.tag]) {
        this.state.tag = Object.keys(this.runs[this.state.run]).find((t) => !this.runs[this.state.run][t].error);
      }
      this.selected = null;
    }
    this.pickRunAndTag();
    this.writeHash();
    return this.load();
  }

  writeHash() {
    // An absolute URL: a relative one would resolve against the frame's <base href="plugin/...">.
    const url = new URL(window.location.href);
    url.hash = formatHash(this.state);
    if (url.href !== window.location.href) history.replaceState(null, "", url.href);
  }

  onHashChange() {
    const state = parseHash(window.location.hash, Object.keys(this.defaults));
    if (formatHash(state) === formatHash(this.state)) return;
    this.state = state;
    if (this.pickRunAndTag()) this.load();
  }

  async load() {
    const token = ++this.loadToken;
    this.drawn = false;
    this.seriesCache = new Map();
    this.renderToolbar();
    if (!this.main.contains(this.view.root)) {
      replaceChildren(this.main, this.view.root, el("div", { class: "side" }, this.alertsPanel, this.detailsPanel));
    }
    this.setStatus("Loading…", "loading");
    const common = { run: this.state.run, tag: this.state.tag, ...thresholdParams(this.state) };
    this.requestedWidth = this.view.plotWidth();
    const heatmapParams = {
      ...common, stat: this.state.stat, encoding: "base64",
      max_steps: Math.min(4000, this.requestedWidth),
      axis: this.axis() === "epoch" ? "epoch" : null,
      first_step: this.state.zoom ? this.state.zoom[0] : null,
      last_step: this.state.zoom ? this.state.zoom[1] : null,
    };
    let body;
    let alerts;
    try {
      [body, alerts] = await Promise.all([getJson("heatmap", heatmapParams), getJson("alerts", common)]);
    } catch (error) {
      if (token === this.loadToken) this.showError(error);
      return;
    }
    if (token !== this.loadToken) return; // a newer request superseded this one
    const matrix = decodeHeatmap(body);
    this.matrix = matrix;
    this.alerts = alerts.alerts;
    const rows = new Map(matrix.variables.map((v, i) => [v, i]));
    const rowSeverity = new Map();
    for (const alert of this.alerts) {
      for (const row of this.alertRows(alert, rows)) {
        const current = rowSeverity.get(row);
        if (current === undefined || SEVERITY_RANK[alert.severity] < SEVERITY_RANK[current]) rowSeverity.set(row, alert.severity);
      }
    }
    const ceiling = matrix.stat === "l2_norm" ? Number(this.thresholds().exploding_norm) : Infinity;
    this.view.setData(matrix, makeScale(matrix.values, matrix.stat, ceiling), rowSeverity, matrix.epochs);
    this.loadLoss(token);
    this.drawn = true; // the latest data is on screen (browser tests wait for it)
    this.renderAlerts(rows);
    const notes = [...matrix.damage];
    if (matrix.sampled) notes.push(matrix.sampled);
    else if (matrix.downsampled) notes.push("Several steps per column: each column shows its worst cell.");
    if (!matrix.columns) notes.push("No logged steps in this range.");
    this.setStatus(notes.join(" "), matrix.sampled || matrix.damage.length ? "warning" : "info");
    if (this.selected) this.selectCell(...this.selected, true);
    this.refetchIfWider();
  }

  /** The plot grew well past the width the columns were fetched for: one column per pixel again. */
  refetchIfWider() {
    const matrix = this.matrix;
    if (matrix && this.drawn && matrix.downsampled && !matrix.sampled
        && this.view.plotWidth() > this.requestedWidth * 1.2) {
      this.load();
    }
  }

  /** The run's training loss from the Scalars plugin, drawn above the heatmap when it exists. */
  async loadLoss(token) {
    try {
      const tags = await getJson("../scalars/tags");
      const runTags = Object.keys(tags[this.state.run] || {});
      const tag = lossTag(runTags);
      const points = tag ? await getJson("../scalars/scalars", { run: this.state.run, tag }) : null;
      if (token === this.loadToken) this.view.setLoss(points, tag);
    } catch {
      if (token === this.loadToken) this.view.setLoss(null); // no Scalars data: no curve
    }
  }

  /** The rule thresholds in force: the plugin's defaults with the URL's overrides. */
  thresholds() {
    return { ...this.defaults, ...this.state.thresholds };
  }

  alertRows(alert, rows) {
    if (alert.variable !== null && rows.has(alert.variable)) return [rows.get(alert.variable)];
    if (alert.layer !== null) return this.matrix.layers.flatMap((layer, row) => (layer === alert.layer ? [row] : []));
    return [];
  }

  renderAlerts(rows) {
    const firstNonfinite = this.alerts.filter((a) => a.kind === "nonfinite").sort((a, b) => a.first_step - b.first_step)[0];
    const items = this.alerts.map((alert) => el("li", { class: `alert severity-${alert.severity}` },
      el("button", {
        type: "button", class: "alert-button", "data-testid": "alert",
        onclick: () => this.view.highlightAlert(this.alertRows(alert, rows), alert.first_step, alert.last_step),
      },
      el("span", { class: "alert-kind" }, `${alert.severity} · ${alert.kind}`),
      el("span", { class: "alert-message" }, alert.message))));
    replaceChildren(this.alertsPanel,
      el("h2", {}, this.alerts.length ? `Alerts (${this.alerts.length})` : "No alerts"),
      firstNonfinite ? el("p", { class: "first-nonfinite", "data-testid": "first-nonfinite" },
        `First NaN/Inf gradient: step ${formatStep(firstNonfinite.first_step)} in ${firstNonfinite.variable}`) : null,
      el("ol", { class: "alert-list" }, items));
  }

  /** Adds the hovered cell's key stats to the tooltip (after a short pause on the cell). */
  hoverCell(cell) {
    clearTimeout(this.hoverTimer);
    if (!cell) return;
    this.hoverTimer = setTimeout(async () => {
      const [row, column] = cell;
      const matrix = this.matrix;
      const series = await this.seriesOf(row).catch(() => null);
      if (!series || matrix !== this.matrix) return;
      const index = nearestIndex(series.steps, matrix.steps[column]);
      const at = (name) => (name in series.stats ? formatValue(toNumber(series.stats[name][index])) : null);
      const lines = [
        `at step ${formatStep(series.steps[index])}: norm ${at("l2_norm")}, max |g| ${at("abs_max")}`,
        `zero fraction ${at("zero_fraction")}, NaN ${at("nan_count")}, Inf ${at("inf_count")}`,
      ];
      this.view.setTooltipExtra(cell, lines);
    }, HOVER_STATS_DELAY_MS);
  }

  /**
   * The `series` answer of the variable in heatmap row `row`, kept until the next load (hover
   * and details share it). Asked by index: a name can be longer than a URL may be.
   */
  seriesOf(row) {
    if (!this.seriesCache.has(row)) {
      const request = getJson("series", {
        run: this.state.run, tag: this.state.tag, variable_index: row, ...thresholdParams(this.state),
      });
      request.catch(() => this.seriesCache.delete(row));
      this.seriesCache.set(row, request);
    }
    return this.seriesCache.get(row);
  }

  async selectCell(row, column, keepView = false) {
    const matrix = this.matrix;
    if (!matrix || row >= matrix.rows || column >= matrix.columns) return;
    this.selected = [row, column];
    this.view.select(this.selected);
    const step = matrix.steps[column];
    const common = { run: this.state.run, tag: this.state.tag };
    try {
      const series = await this.seriesOf(row);
      let histogram = null;
      if (this.info().histograms) {
        histogram = await getJson("histogram", { ...common, variable_index: row, step }).catch(() => null);
      }
      renderDetails(this.detailsPanel, { series, stat: this.state.stat, step, thresholds: this.thresholds(), histogram });
      if (!keepView) this.detailsPanel.scrollIntoView({ block: "nearest" });
    } catch (error) {
      replaceChildren(this.detailsPanel, el("p", { class: "status-error" }, `Could not load details: ${error.message}`));
      this.detailsPanel.hidden = false;
    }
  }

  async refreshIfGrown() {
    if (document.hidden) return;
    try {
      const runs = await getJson("runs");
      const before = this.info();
      this.runs = runs;
      this.renderProblems();
      const after = runs[this.state.run] && runs[this.state.run][this.state.tag];
      if (after && (after.steps !== before.steps || after.variables !== before.variables)) await this.load();
    } catch {
      // the next refresh tries again; the current view stays
    }
  }

  downloadPng() {
    const link = el("a", {
      download: `${this.state.run}_${this.state.tag}_${this.state.stat}.png`.replace(/[^A-Za-z0-9._-]+/g, "_"),
      href: this.view.cells.toDataURL("image/png"),
    });
    link.click();
  }
}
