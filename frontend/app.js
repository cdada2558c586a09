// The Gradients tab's controller: its state (run, tag, stat, axis, rows, zoom, thresholds) and the
// URL hash that holds it, the plugin's answers it fetches, and which view shows what. The views are
// the toolbar, the heatmap, the alerts panel and the details; the vocabulary (class and severity
// colours, stat labels) comes with the thresholds' defaults before anything is drawn. Without a
// run in the hash the tab opens on the run the user last picked here, else on the most severe.

import { alertRowFinder, alertSpans, rowSeverities } from "./alerts.js";
import { renderAlerts } from "./alerts_panel.js";
import { getJson, lossTag } from "./api.js";
import { keyStatsLines, representativeIndex } from "./cells.js";
import { makeScale } from "./colormap.js";
import { compareMatrices } from "./compare.js";
import { CompareView } from "./compare_view.js";
import { decodeHeatmap } from "./decode.js";
import { renderDetails } from "./details.js";
import { el, replaceChildren } from "./dom.js";
import {
  formatHash, parseHash, resolvedAxis, thresholdParams, usableTags, withRunAndTag,
} from "./hash_state.js";
import { HeatmapView } from "./heatmap_view.js";
import { columnOfStep } from "./layout.js";
import { renderEmpty, renderProblems, renderStatus } from "./notices.js";
import { mostSevere } from "./runs.js";
import { Toolbar } from "./toolbar.js";
import { Vocabulary } from "./vocabulary.js";

const REFRESH_MS = 30000;
// While the plugin is still reading a long run (right after TensorBoard starts), the tab asks
// again this often, so the whole run replaces the partial view without a reload.
const READING_POLL_MS = 3000;
const HOVER_STATS_DELAY_MS = 150;
// How long the heatmap waits for the loss curve drawn above it (the Scalars plugin's answers), so
// that both appear in one frame and the cells never move under the pointer; a slower Scalars
// plugin gets its curve drawn when it answers, and one that never does cannot hold the tab back.
const LOSS_WAIT_MS = 3000;
// Where the run the user last picked is kept: TensorBoard reloads the tab's frame without its
// hash, and the user's run should outlast that.
const REMEMBERED_RUN_KEY = "tensorboard-gradients.run";

function rememberedRun() {
  try {
    return localStorage.getItem(REMEMBERED_RUN_KEY);
  } catch {
    return null; // storage blocked: the most severe run opens
  }
}

function rememberRun(run) {
  try {
    localStorage.setItem(REMEMBERED_RUN_KEY, run);
  } catch {
    // storage blocked: the hash still holds the view while the frame lives
  }
}

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
    this.selected = null; // {run, tag, row, column, step}: the cell whose details are shown
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
    const asked = parseHash(window.location.hash, Object.keys(this.defaults));
    const state = withRunAndTag(await this.openingState(asked), this.runs);
    if (!state) {
      this.setStatus("");
      const inventory = await getJson("inventory").catch((error) => {
        this.setStatus(`Could not ask TensorBoard what its logdir holds: ${error.message}`, "error");
        return null;
      });
      renderEmpty(this.main, this.runs, inventory);
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
    this.compareView = new CompareView(this.vocabulary);
    this.comparison = null; // compare.compareMatrices of the runs compared, while one is picked
    window.addEventListener("hashchange", () => this.onHashChange());
    setInterval(() => this.refreshIfGrown(), REFRESH_MS);
    renderProblems(this.problemsPanel, this.runs);
    await this.load();
  }

  /**
   * `asked` (the hash's state) with the run to open: the hash's own, else the one the user last
   * picked while it has data, else the most severe (the `runs` answer has no alerts, so each
   * tag's are asked for; one that fails to answer is passed over).
   */
  async openingState(asked) {
    if (asked.run) return asked;
    const usable = usableTags(this.runs);
    const remembered = rememberedRun();
    if (usable.some(([run]) => run === remembered)) return { ...asked, run: remembered };
    const found = await Promise.all(usable.map(([run, tag]) =>
      getJson("alerts", { run, tag, ...thresholdParams(asked) })
        .then((answer) => [run, tag, answer.alerts], () => null)));
    const [run, tag] = mostSevere(found.filter(Boolean), (severity) => this.vocabulary.severityRank(severity))
      || [null, null];
    return { ...asked, run, tag };
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
    if (changes.run) rememberRun(changes.run);
    this.show({ ...this.state, ...changes });
    this.writeHash();
    return this.load();
  }

  /** Makes `next` the state, with a run and tag that have data. */
  show(next) {
    const shown = withRunAndTag(next, this.runs) || next;
    // A cell of another run, tag or kind of row says nothing about this one: its details go.
    if (["run", "tag", "rows"].some((key) => shown[key] !== this.state[key])) this.clearSelection();
    this.state = shown;
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
    if (state.run && state.run !== this.state.run) rememberRun(state.run);
    this.show(state);
    if (withRunAndTag(state, this.runs)) this.load();
  }

  async load() {
    const token = ++this.loadToken;
    this.drawn = false;
    this.toolbar.render({
      state: this.state, runs: this.runs, axis: this.axis(), vocabulary: this.vocabulary, defaults: this.defaults,
    });
    if (!this.main.contains(this.view.root)) {
      // The details first: beside the heatmap on a wide window, right under it on a narrow one.
      replaceChildren(this.main, el("div", { class: "heatmaps" }, this.view.root, this.compareView.root),
        el("div", { class: "side" }, this.detailsPanel, this.alertsPanel));
    }
    const compare = this.compareRun();
    this.setStatus("Loading…", "loading");
    const common = { run: this.state.run, tag: this.state.tag, ...thresholdParams(this.state) };
    this.requestedWidth = compare ? this.compareView.plotWidth() : this.view.plotWidth();
    const heatmapParams = {
      ...common, stat: this.state.stat, rows: this.state.rows, encoding: "base64",
      max_steps: Math.min(4000, this.requestedWidth),
      axis: this.axis() === "epoch" ? "epoch" : null,
      first_step: this.state.zoom ? this.state.zoom[0] : null,
      last_step: this.state.zoom ? this.state.zoom[1] : null,
    };
    let body;
    let alerts;
    let other = null; // the compared run's heatmap, or {error}
    const loss = this.fetchLoss(this.state.run);
    try {
      [body, alerts, other] = await Promise.all([getJson("heatmap", heatmapParams), getJson("alerts", common),
        // The compared run: the same tag, stat, axis, rows, columns and thresholds.
        compare && getJson("heatmap", { ...heatmapParams, run: compare }).catch((error) => ({ error })),
        Promise.race([loss, new Promise((resolve) => { setTimeout(resolve, LOSS_WAIT_MS); })])]);
    } catch (error) {
      if (token === this.loadToken) this.showError(error);
      return;
    }
    if (token !== this.loadToken) return; // a newer request superseded this one
    const vocabulary = this.vocabulary;
    const matrix = decodeHeatmap(body, vocabulary);
    this.matrix = matrix;
    this.seriesCache = new Map(); // of this matrix's rows
    this.alerts = alerts.alerts;
    const rowsOf = alertRowFinder(matrix);
    const rowSeverity = rowSeverities(this.alerts, rowsOf, (severity) => vocabulary.severityRank(severity));
    const scale = makeScale(matrix.values, vocabulary.statScale(matrix.stat),
      vocabulary.scaleCeiling(matrix.stat, this.thresholds()));
    this.view.setData(matrix, scale, rowSeverity, matrix.epochs);
    // Already there unless the Scalars plugin was slow: then drawn before the next frame.
    loss.then(({ points, tag }) => { if (token === this.loadToken) this.view.setLoss(points, tag); });
    const compareNote = this.showComparison(matrix, other, compare);
    this.drawn = true; // the latest data is on screen (browser tests wait for it)
    renderAlerts(this.alertsPanel, {
      alerts: this.alerts, groups: alerts.groups, vocabulary,
      onPick: (picked) => this.view.highlightAlerts(alertSpans(picked, rowsOf)),
    });
    const notes = [...matrix.damage, ...(compareNote ? [compareNote] : [])];
    if (matrix.sampled) notes.push(matrix.sampled);
    else if (matrix.downsampled) notes.push("Several steps per column: each column shows its worst cell.");
    if (!matrix.columns) notes.push("No logged steps in this range.");
    this.setStatus(notes.join(" "), matrix.sampled || matrix.damage.length ? "warning" : "info");
    if (this.selected) this.reselect(matrix);
    this.refetchIfWider();
    if (matrix.stepsToRead > 0) {
      setTimeout(() => { if (token === this.loadToken) this.load(); }, READING_POLL_MS);
    }
  }

  /** The run to compare with: the state's, while it is another run with the shown tag. */
  compareRun() {
    const { compare, run, tag } = this.state;
    return compare && compare !== run && this.runs[compare] && this.runs[compare][tag] ? compare : null;
  }

  /**
   * Shows the comparison of `matrix` with `other` (the `heatmap` answer of run `compare`, or
   * {error}), in place of the heatmap, or the heatmap alone when there is none. Returns a note
   * for the status line (why the comparison cannot be shown), or "".
   */
  showComparison(matrix, other, compare) {
    const vocabulary = this.vocabulary;
    let note = "";
    this.comparison = null;
    if (this.state.compare && !compare) {
      note = `Cannot compare with ${this.state.compare}: it has no tag ${this.state.tag}.`;
    } else if (other && other.error) {
      note = `Cannot compare with ${compare}: ${other.error.message}`;
    } else if (other) {
      this.comparison = compareMatrices(matrix, decodeHeatmap(other, vocabulary), {
        emptyCode: vocabulary.classes.findIndex((cls) => cls.empty),
        unusableCodes: vocabulary.classes.flatMap((cls, code) => (cls.nonfinite ? [code] : [])),
      });
    }
    this.view.root.hidden = Boolean(this.comparison);
    this.compareView.root.hidden = !this.comparison;
    if (this.comparison) {
      this.compareView.setData(this.comparison, this.state.compareMode, {
        scaleKind: vocabulary.statScale(matrix.stat), ceiling: vocabulary.scaleCeiling(matrix.stat, this.thresholds()),
      });
    }
    return note;
  }

  /** The plot grew well past the width the columns were fetched for: one column per pixel again. */
  refetchIfWider() {
    const matrix = this.matrix;
    if (matrix && this.drawn && matrix.downsampled && !matrix.sampled
        && (this.comparison ? this.compareView.plotWidth() : this.view.plotWidth()) > this.requestedWidth * 1.2) {
      this.load();
    }
  }

  /**
   * The run's training loss from the Scalars plugin: {points, tag}, both null where the run has
   * none or the Scalars plugin does not answer (the heatmap is drawn without a curve then).
   */
  async fetchLoss(run) {
    try {
      const tags = await getJson("../scalars/tags");
      const tag = lossTag(Object.keys(tags[run] || {}));
      if (tag) return { points: await getJson("../scalars/scalars", { run, tag }), tag };
    } catch {
      // no Scalars data: no curve
    }
    return { points: null, tag: null };
  }

  /** The theme changed (index.js): what is drawn on canvas in the theme's colours, again. */
  themeChanged() {
    if (!this.drawn) return;
    this.view.draw();
    if (this.comparison) this.compareView.draw();
    if (this.selected) this.reselect(this.matrix);
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
      const index = representativeIndex(series, matrix.stat, matrix.steps[column], matrix.lastSteps[column],
        this.vocabulary);
      const cls = this.vocabulary.classOf(series.classes[index]);
      const merged = matrix.steps[column] !== matrix.lastSteps[column] ? " (its worst)" : "";
      this.view.setTooltipExtra(cell, keyStatsLines(series, index, cls, this.vocabulary, merged));
    }, HOVER_STATS_DELAY_MS);
  }

  /**
   * The `series` answer of the variable (or layer) in row `row` of the matrix shown, kept until
   * the next matrix (hover and details share it). Asked by index: a name can be longer than a URL
   * may be.
   */
  seriesOf(row) {
    const cache = this.seriesCache;
    if (!cache.has(row)) {
      const { run, tag, rowsBy } = this.matrix;
      const request = getJson("series", {
        run, tag, rows: rowsBy, variable_index: row, ...thresholdParams(this.state),
      });
      request.catch(() => cache.delete(row));
      cache.set(row, request);
    }
    return cache.get(row);
  }

  /**
   * Shows the details of the cell at `row`, `column`: its variable over the run and every stat at
   * the step the cell is drawn as (a merged cell's worst). The page does not scroll: the details
   * open beside the heatmap or right under it, and the heatmap stays where the user clicked.
   */
  async selectCell(row, column) {
    const matrix = this.matrix;
    if (!matrix || row >= matrix.rows || column >= matrix.columns) return;
    const selection = { run: matrix.run, tag: matrix.tag, row, column, step: matrix.steps[column] };
    this.selected = selection;
    this.view.select([row, column]);
    // Answers that come after another cell, run or load took over are dropped.
    const current = () => this.selected === selection && this.matrix === matrix;
    const cell = {
      first: matrix.steps[column], last: matrix.lastSteps[column],
      epoch: matrix.epochIndex ? matrix.epochIndex[column] : null,
    };
    try {
      const series = await this.seriesOf(row);
      if (!current()) return;
      const index = representativeIndex(series, matrix.stat, cell.first, cell.last, this.vocabulary);
      selection.step = series.steps[index];
      let histogram = null;
      if (this.info().histograms) {
        histogram = await getJson("histogram", {
          run: matrix.run, tag: matrix.tag, rows: matrix.rowsBy, variable_index: row, step: selection.step,
        }).catch(() => null);
      }
      if (!current()) return;
      renderDetails(this.detailsPanel, {
        series, rowsBy: matrix.rowsBy, index, cell, stat: matrix.stat, thresholds: this.thresholds(), histogram,
        vocabulary: this.vocabulary, notLogged: this.info().not_logged,
      });
    } catch (error) {
      if (!current()) return;
      replaceChildren(this.detailsPanel, el("p", { class: "status-error" }, `Could not load details: ${error.message}`));
      this.detailsPanel.hidden = false;
    }
  }

  /** The selected cell again in a new matrix of its run and tag (a refresh, a zoom, the other
   * axis): the column now holding the step its details show, if one does. */
  reselect(matrix) {
    const { run, tag, row, step } = this.selected;
    const column = columnOfStep(matrix.steps, matrix.lastSteps, step);
    if (run === matrix.run && tag === matrix.tag && row < matrix.rows && column >= 0) this.selectCell(row, column);
    else this.clearSelection();
  }

  clearSelection() {
    this.selected = null;
    if (this.view) this.view.select(null);
    this.detailsPanel.hidden = true;
    replaceChildren(this.detailsPanel);
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
    const { run, tag, stat, rowsBy } = this.matrix;
    const name = [run, tag, stat, ...(rowsBy === "layers" ? ["layers"] : [])].join("_");
    const link = el("a", {
      download: `${name}.png`.replace(/[^A-Za-z0-9._-]+/g, "_"),
      href: this.view.cells.toDataURL("image/png"),
    });
    link.click();
  }
}
