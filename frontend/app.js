// The Gradients tab's controller: its state (run, tag, stat, axis, zoom, thresholds) and the URL
// hash that holds it, the plugin's answers it fetches, and which view shows what. The views are
// the toolbar, the heatmap, the alerts panel and the details; the vocabulary (class and severity
// colours, stat labels) comes with the thresholds' defaults before anything is drawn.

import { alertRowFinder, rowSeverities } from "./alerts.js";
import { renderAlerts } from "./alerts_panel.js";
import { getJson, lossTag } from "./api.js";
import { makeScale } from "./colormap.js";
import { decodeHeatmap, toNumber } from "./decode.js";
import { renderDetails } from "./details.js";
import { el, replaceChildren } from "./dom.js";
import { formatStep, formatValue } from "./format.js";
import { formatHash, parseHash, resolvedAxis, thresholdParams, withRunAndTag } from "./hash_state.js";
import { HeatmapView } from "./heatmap_view.js";
import { nearestIndex } from "./layout.js";
import { renderEmpty, renderProblems, renderStatus } from "./notices.js";
import { Toolbar } from "./toolbar.js";
import { Vocabulary } from "./vocabulary.js";

const REFRESH_MS = 30000;
// While the plugin is still reading a long run (right after TensorBoard starts), the tab asks
// again this often, so the whole run replaces the partial view without a reload.
const READING_POLL_MS = 3000;
const HOVER_STATS_DELAY_MS = 150;

export class App {
  constructor(root) {
    this.root = root;
    this.status = el("div", { class: "status", role: "status" });
    this.toolbar = new Toolbar({
      onChange: (changes) => this.update(changes),
      onThreshold: (name, text) => this.setThreshold(name, text),
      onPng: () => this.downloadPng(),
    });
    this.problemsPanel = el("details", { class: "problems", open: true, hidden: true, "data-testid": "data-problems" });
    this.alertsPanel = el("section", { class: "alerts", "aria-label": "Alerts" });
    this.detailsPanel = el("section", { class: "details", hidden: true, "aria-label": "Details" });
    this.main = el("div", { class: "main" });
    replaceChildren(root, el("div", { class: "gradients-app" },
      this.toolbar.root, this.toolbar.form, this.status, this.problemsPanel, this.main));
    this.view = null; // the heatmap, made once the vocabulary has come
    this.matrix = null;
    this.selected = null;
    this.loadToken = 0;
  }

  async start() {
    this.setStatus("Loading…", "loading");
    try {
      const [thresholds, runs] = await Promise.all([getJson("thresholds"), getJson("runs")]);
      this.defaults = thresholds.defaults;
      this.vocabulary = new Vocabulary(thresholds.vocabulary);
      this.runs = runs;
    } catch (error) {
      this.showError(error);
      return;
    }
    this.vocabulary.applyTo(this.root);
    const state = withRunAndTag(parseHash(window.location.hash, Object.keys(this.defaults)), this.runs);
    if (!state) {
      this.setStatus("");
      renderEmpty(this.main, this.runs);
      setTimeout(() => this.start(), REFRESH_MS); // training may not have logged anything yet
      return;
    }
    this.state = state;
    this.view = new HeatmapView(this.vocabulary, {
      onSelect: (row, column) => this.selectCell(row, column),
      onHover: (cell) => this.hoverCell(cell),
      onZoom: (zoom) => this.update({ zoom }),
      onResize: () => this.refetchIfWider(),
    });
    window.addEventListener("hashchange", () => this.onHashChange());
    setInterval(() => this.refreshIfGrown(), REFRESH_MS);
    renderProblems(this.problemsPanel, this.runs);
    await this.load();
  }

  info() {
    return this.runs[this.state.run][this.state.tag];
  }

  axis() {
    return resolvedAxis(this.state, this.info());
  }

  setStatus(text, kind) {
    renderStatus(this.status, text, kind);
  }

  showError(error) {
    this.setStatus(`Could not load gradients: ${error.message}`, "error");
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
    const next = { ...this.state, ...changes };
    if (changes.run !== undefined || changes.tag !== undefined) this.selected = null;
    this.state = withRunAndTag(next, this.runs) || next;
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
    const shown = withRunAndTag(state, this.runs);
    this.state = shown || state;
    if (shown) this.load();
  }

  async load() {
    const token = ++this.loadToken;
    this.drawn = false;
    this.seriesCache = new Map();
    this.toolbar.render({
      state: this.state, runs: this.runs, axis: this.axis(), vocabulary: this.vocabulary, defaults: this.defaults,
    });
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
    const vocabulary = this.vocabulary;
    const matrix = decodeHeatmap(body, vocabulary);
    this.matrix = matrix;
    this.alerts = alerts.alerts;
    const rowsOf = alertRowFinder(matrix);
    const rowSeverity = rowSeverities(this.alerts, rowsOf, (severity) => vocabulary.severityRank(severity));
    const scale = makeScale(matrix.values, vocabulary.statScale(matrix.stat),
      vocabulary.scaleCeiling(matrix.stat, this.thresholds()));
    this.view.setData(matrix, scale, rowSeverity, matrix.epochs);
    this.loadLoss(token);
    this.drawn = true; // the latest data is on screen (browser tests wait for it)
    renderAlerts(this.alertsPanel, {
      alerts: this.alerts, vocabulary,
      onPick: (alert) => this.view.highlightAlert(rowsOf(alert), alert.first_step, alert.last_step),
    });
    const notes = [...matrix.damage];
    if (matrix.sampled) notes.push(matrix.sampled);
    else if (matrix.downsampled) notes.push("Several steps per column: each column shows its worst cell.");
    if (!matrix.columns) notes.push("No logged steps in this range.");
    this.setStatus(notes.join(" "), matrix.sampled || matrix.damage.length ? "warning" : "info");
    if (this.selected) this.selectCell(...this.selected, true);
    this.refetchIfWider();
    if (matrix.stepsToRead > 0) {
      setTimeout(() => { if (token === this.loadToken) this.load(); }, READING_POLL_MS);
    }
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
      renderDetails(this.detailsPanel, {
        series, stat: this.state.stat, step, thresholds: this.thresholds(), histogram, vocabulary: this.vocabulary,
      });
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
      renderProblems(this.problemsPanel, this.runs);
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
