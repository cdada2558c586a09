// The Gradients tab's controller: it holds the view state (view_state.js: what is shown, what a
// change resets and needs), keeps the URL hash in step with it, asks the plugin for the answers a
// view needs and hands them to the views: the toolbar, the heatmap or the comparison, the alerts
// panel, the details. The vocabulary (class and severity colours, stat labels) comes with the
// thresholds' defaults before anything is drawn. Without a run in the hash the tab opens on the
// run the user last picked here, else on the most severe. Its timers (timers.js) go with it.

import { alertRowFinder, alertSpans, lossSpikeMarks, rowSeverities } from "./alerts.js";
import { renderAlerts } from "./alerts_panel.js";
import { getJson, lossTag } from "./api.js";
import { keyStatsLines, representativeIndex } from "./cells.js";
import { makeScale } from "./colormap.js";
import { compareMatrices } from "./compare.js";
import { CompareView } from "./compare_view.js";
import { decodeHeatmap } from "./decode.js";
import { renderDetails } from "./details.js";
import { el, replaceChildren } from "./dom.js";
import { thresholdParams, usableTags } from "./hash_state.js";
import { HeatmapView } from "./heatmap_view.js";
import { columnOfStep } from "./layout.js";
import { renderEmpty, renderProblems, renderStatus } from "./notices.js";
import { mostSevere } from "./runs.js";
import { Timers } from "./timers.js";
import { Toolbar } from "./toolbar.js";
import { ViewState, stateOfHash } from "./view_state.js";
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
    this.problemsPanel = el("details", { class: "problems", open: true, hidden: true, "data-testid": "data-problems" });
    this.alertsPanel = el("section", { class: "alerts", "aria-label": "Alerts" });
    this.detailsPanel = el("section", { class: "details", hidden: true, "aria-label": "Details" });
    this.main = el("div", { class: "main" });
    this.frame = el("div", { class: "gradients-app" }, this.status, this.problemsPanel, this.main);
    replaceChildren(root, this.frame);
    this.timers = new Timers();
    this.model = null; // the view state (a ViewState), once a tag has data
    this.view = null; // the heatmap, made with the model
    this.matrix = null;
    this.selected = null; // {run, tag, row, column, step}: the cell whose details are shown
    this.loadToken = 0;
    this.stopped = false;
    this.onHashChange = () => this.#carryOut(this.model.followHash(window.location.hash));
  }

  /** The view's state (hash_state's fields). */
  get state() {
    return this.model?.state;
  }

  /** The plugin's `runs` answer the view is shown from. */
  get runs() {
    return this.model?.runs;
  }

  async start() {
    this.setStatus("Loading…", "loading");
    let thresholds;
    let runs;
    try {
      [thresholds, runs] = await Promise.all([getJson("thresholds"), getJson("runs")]);
      this.vocabulary = new Vocabulary(thresholds.vocabulary);
    } catch (error) {
      this.showError(error);
      return;
    }
    this.vocabulary.applyTo(this.root);
    const asked = stateOfHash(window.location.hash, thresholds.defaults);
    this.model = ViewState.open(thresholds.defaults, runs, await this.openingState(asked, runs));
    if (!this.model) {
      await this.showEmpty(runs);
      return;
    }
    this.#buildViews();
    window.addEventListener("hashchange", this.onHashChange);
    this.timers.every("refresh", REFRESH_MS, () => this.refreshIfGrown());
    renderProblems(this.problemsPanel, runs);
    await this.load();
  }

  /** Tears the tab down: its timers stop, the URL is followed no more, answers on their way are dropped. */
  stop() {
    this.stopped = true;
    this.timers.stop();
    window.removeEventListener("hashchange", this.onHashChange);
    this.loadToken += 1;
  }

  /**
   * `asked` (the hash's state) with the run to open: the hash's own, else the one the user last
   * picked while it has data, else the most severe of `runs` (the `runs` answer has no alerts, so
   * each tag's are asked for; one that fails to answer is passed over).
   */
  async openingState(asked, runs) {
    if (asked.run) return asked;
    const usable = usableTags(runs);
    const remembered = rememberedRun();
    if (usable.some(([run]) => run === remembered)) return { ...asked, run: remembered };
    const found = await Promise.all(usable.map(([run, tag]) =>
      getJson("alerts", { run, tag, ...thresholdParams(asked) })
        .then((answer) => [run, tag, answer.alerts], () => null)));
    const [run, tag] = mostSevere(found.filter(Boolean), (severity) => this.vocabulary.severityRank(severity))
      || [null, null];
    return { ...asked, run, tag };
  }

  /** No tag has data yet: what the logdir holds, and another start later (training may log soon). */
  async showEmpty(runs) {
    this.setStatus("");
    const inventory = await getJson("inventory").catch((error) => {
      this.setStatus(`Could not ask TensorBoard what its logdir holds: ${error.message}`, "error");
      return null;
    });
    renderEmpty(this.main, runs, inventory);
    this.timers.after("start", REFRESH_MS, () => this.start());
  }

  // The toolbar, the heatmap and the comparison, made once with the model and shown from then on.
  #buildViews() {
    this.toolbar = new Toolbar({
      vocabulary: this.vocabulary, defaults: this.model.defaults,
      onChange: (changes) => this.apply(this.model.change(changes)),
      onThreshold: (name, text) => this.setThreshold(name, text),
      onPng: () => this.downloadPng(),
    });
    this.frame.prepend(this.toolbar.root, this.toolbar.form);
    this.view = new HeatmapView(this.vocabulary, {
      onSelect: (row, column) => this.selectCell(row, column),
      onHover: (cell) => this.hoverCell(cell),
      onZoom: (zoom) => this.apply(this.model.change({ zoom })),
      onResize: () => this.refetchIfWider(),
    });
    this.compareView = new CompareView(this.vocabulary);
    this.comparison = null; // compare.compareMatrices of the runs compared, while one is picked
    // The details first: beside the heatmap on a wide window, right under it on a narrow one.
    replaceChildren(this.main, el("div", { class: "heatmaps" }, this.view.root, this.compareView.root),
      el("div", { class: "side" }, this.detailsPanel, this.alertsPanel));
  }

  /** The shown tag's entry of the `runs` answer. */
  info() {
    return this.model.info();
  }

  setStatus(text, kind) {
    renderStatus(this.status, text, kind);
  }

  showError(error) {
    this.setStatus(`Could not load gradients: ${error.message}`, "error");
  }

  setThreshold(name, text) {
    let change;
    try {
      change = this.model.setThreshold(name, text);
    } catch (error) {
      if (!(error instanceof RangeError)) throw error;
      this.setStatus(error.message, "error");
      return;
    }
    this.apply(change);
  }

  /** Carries out a change the user made (the model's answer to it): the URL's hash, then the view. */
  apply(change) {
    this.writeHash();
    this.#carryOut(change);
  }

  // What a change of the view needs: the run remembered, the details of a cell it no longer
  // shows gone, new answers or another drawing of those held.
  #carryOut(change) {
    if (change.runChanged) rememberRun(this.model.state.run);
    if (change.clearsSelection) this.clearSelection();
    if (change.needs === "reload") this.load();
    else if (change.needs === "redraw") this.redraw();
  }

  writeHash() {
    // An absolute URL: a relative one would resolve against the frame's <base href="plugin/...">.
    const url = new URL(window.location.href);
    url.hash = this.model.hash();
    if (url.href !== window.location.href) history.replaceState(null, "", url.href);
  }

  /** Asks the plugin for the view's answers and shows them; a newer load drops an older one's. */
  async load() {
    if (this.stopped) return;
    const token = ++this.loadToken;
    this.drawn = false;
    this.timers.clear("reading"); // this load asks for what the poll would have
    this.toolbar.show(this.model);
    this.setStatus("Loading…", "loading");
    this.requestedWidth = this.model.compareRun() ? this.compareView.plotWidth() : this.view.plotWidth();
    let answers;
    try {
      answers = await this.#fetchView();
    } catch (error) {
      if (token === this.loadToken) this.showError(error);
      return;
    } finally {
      // The wait for the loss curve ends with the answers, unless a newer load's wait took its place.
      if (token === this.loadToken) this.timers.clear("loss");
    }
    if (token !== this.loadToken) return; // a newer request superseded this one
    this.#show(answers, token);
  }

  // The plugin's answers for the view: {body (the heatmap), alerts, compare (the run compared
  // with, or null), other (its heatmap, or {error}), loss (the loss curve, on its way)}.
  async #fetchView() {
    const { heatmap, alerts, compare } = this.model.queries(this.requestedWidth);
    const loss = this.fetchLoss(heatmap.run);
    const [body, alertsAnswer, other] = await Promise.all([getJson("heatmap", heatmap), getJson("alerts", alerts),
      // The compared run: the same tag, stat, axis, rows, columns and thresholds.
      compare && getJson("heatmap", { ...heatmap, run: compare }).catch((error) => ({ error })),
      Promise.race([loss, this.timers.wait("loss", LOSS_WAIT_MS)])]);
    return { body, alerts: alertsAnswer, compare, other, loss };
  }

  // Shows the answers of load `token`: the heatmap (or the comparison), the loss curve, the
  // alerts, the status line and the selected cell again; polls while the run is still being read.
  #show({ body, alerts, compare, other, loss }, token) {
    const vocabulary = this.vocabulary;
    const matrix = decodeHeatmap(body, vocabulary);
    this.matrix = matrix;
    this.seriesCache = new Map(); // of this matrix's rows
    this.alerts = alerts.alerts;
    const rowsOf = alertRowFinder(matrix);
    const rowSeverity = rowSeverities(this.alerts, rowsOf, (severity) => vocabulary.severityRank(severity));
    const scale = makeScale(matrix.values, vocabulary.statScale(matrix.stat),
      vocabulary.scaleCeiling(matrix.stat, this.model.thresholds()));
    this.view.setLossMarks(lossSpikeMarks(this.alerts).map(
      (mark) => ({ ...mark, color: vocabulary.severityColor(mark.severity) })));
    this.view.setData(matrix, scale, rowSeverity, matrix.epochs);
    // Already there unless the Scalars plugin was slow: then drawn before the next frame.
    loss.then(({ points, tag }) => { if (token === this.loadToken) this.view.setLoss(points, tag); });
    const compareNote = this.showComparison(matrix, other, compare);
    this.drawn = true; // the latest data is on screen (browser tests wait for it)
    renderAlerts(this.alertsPanel, {
      alerts: this.alerts, groups: alerts.groups, vocabulary,
      onPick: (picked) => this.view.highlightAlerts(alertSpans(picked, rowsOf)),
    });
    this.#showNotes(matrix, compareNote);
    if (matrix.stepsToRead > 0) this.timers.after("reading", READING_POLL_MS, () => this.load());
    if (this.selected) this.reselect(matrix);
    this.refetchIfWider();
  }

  // The status line over the answers shown: damage, a comparison not shown, sampled or merged
  // columns, an empty range.
  #showNotes(matrix, compareNote) {
    const notes = [...matrix.damage, ...(compareNote ? [compareNote] : [])];
    if (matrix.sampled) notes.push(matrix.sampled);
    else if (matrix.downsampled) notes.push("Several steps per column: each column shows its worst cell.");
    if (!matrix.columns) notes.push("No logged steps in this range.");
    this.setStatus(notes.join(" "), matrix.sampled || matrix.damage.length ? "warning" : "info");
  }

  /** The answers held, drawn as the state now asks (a change that asks the plugin nothing). */
  redraw() {
    this.toolbar.show(this.model);
    if (this.drawn && this.comparison) this.#drawComparison();
    this.refetchIfWider();
  }

  /**
   * Shows the comparison of `matrix` with `other` (the `heatmap` answer of run `compare`, or
   * {error}), in place of the heatmap, or the heatmap alone when there is none. Returns a note
   * for the status line (why the comparison cannot be shown), or "".
   */
  showComparison(matrix, other, compare) {
    const vocabulary = this.vocabulary;
    let note = this.model.compareProblem();
    this.comparison = null;
    if (other && other.error) {
      note = `Cannot compare with ${compare}: ${other.error.message}`;
    } else if (other) {
      this.comparison = compareMatrices(matrix, decodeHeatmap(other, vocabulary), {
        emptyCode: vocabulary.classes.findIndex((cls) => cls.empty),
        unusableCodes: vocabulary.classes.flatMap((cls, code) => (cls.nonfinite ? [code] : [])),
      });
    }
    this.view.root.hidden = Boolean(this.comparison);
    this.compareView.root.hidden = !this.comparison;
    if (this.comparison) this.#drawComparison();
    return note;
  }

  #drawComparison() {
    const { stat } = this.matrix;
    this.compareView.setData(this.comparison, this.model.state.compareMode, {
      scaleKind: this.vocabulary.statScale(stat), ceiling: this.vocabulary.scaleCeiling(stat, this.model.thresholds()),
    });
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

  /** Adds the hovered cell's key stats to the tooltip (after a short pause on the cell). */
  hoverCell(cell) {
    this.timers.clear("hover");
    if (!cell) return;
    this.timers.after("hover", HOVER_STATS_DELAY_MS, async () => {
      const [row, column] = cell;
      const matrix = this.matrix;
      const series = await this.seriesOf(row).catch(() => null);
      if (!series || matrix !== this.matrix) return;
      const index = representativeIndex(series, matrix.stat, matrix.steps[column], matrix.lastSteps[column],
        this.vocabulary);
      const cls = this.vocabulary.classOf(series.classes[index]);
      const merged = matrix.steps[column] !== matrix.lastSteps[column] ? " (its worst)" : "";
      this.view.setTooltipExtra(cell, keyStatsLines(series, index, cls, this.vocabulary, merged));
    });
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
        run, tag, rows: rowsBy, variable_index: row, ...this.model.thresholdParams(),
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
        series, rowsBy: matrix.rowsBy, index, cell, stat: matrix.stat, thresholds: this.model.thresholds(), histogram,
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

  /** The tab's reload: a newer `runs` answer, and the view again if its tag grew. */
  async refreshIfGrown() {
    if (document.hidden) return;
    try {
      const runs = await getJson("runs");
      const change = this.model.setRuns(runs);
      renderProblems(this.problemsPanel, runs);
      if (change.needs) await this.load();
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
