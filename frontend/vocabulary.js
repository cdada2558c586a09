// The backend's vocabulary, received once from the `thresholds` route: the statistics (labels,
// colour scales, which are heatmaps), the cell classes (their worse-is-later order, colours and
// words), the alert severities (most urgent first, colours) and the thresholds' labels. This is
// the only place the tab learns any of them: the views ask a `Vocabulary`, and the stylesheet
// reads the custom properties `applyTo` sets on the tab's root. Pure apart from `applyTo`, which
// only sets style properties, so it is tested in Node from a plain object.

const NORM_STAT = "l2_norm"; // the statistic the norm thresholds bound
// A newer writer's statistic this vocabulary does not know is still offered, under its own name,
// as a magnitude (most statistics are).
const UNKNOWN_STAT_SCALE = "log";

const rgb = (channels) => `rgb(${channels.join(", ")})`;

export class Vocabulary {
  /** `served`: the `vocabulary` member of the `thresholds` answer. */
  constructor({ stats = [], classes = [], severities = [], thresholds = [] } = {}) {
    this.stats = new Map(stats.map((stat) => [stat.name, stat]));
    this.classes = classes.map(({ norm_threshold: normThreshold, ...cls }) => ({ ...cls, normThreshold }));
    this.classNames = this.classes.map((cls) => cls.name);
    this.classCodes = new Map(this.classNames.map((name, code) => [name, code]));
    this.severities = severities;
    this.thresholds = thresholds;
    this.nonfiniteClass = this.classes.find((cls) => cls.nonfinite) || null;
    this.cssVariables = Object.freeze(cssVariables(this.classes, severities));
  }

  statLabel(name) {
    return this.stats.get(name)?.label ?? name;
  }

  /** "log", "linear", "fraction" or "count": how colours map the stat's values. */
  statScale(name) {
    return this.stats.get(name)?.scale ?? UNKNOWN_STAT_SCALE;
  }

  /** [[name, label]] of a tag's stats that can be a heatmap, in the tag's order. */
  heatmapStats(names) {
    return names.filter((name) => this.stats.get(name)?.heatmap !== false)
      .map((name) => [name, this.statLabel(name)]);
  }

  classOf(name) {
    return this.classes[this.classCodes.get(name)];
  }

  /** A class's code: its place in the worse-is-later order (an unknown name is an error). */
  classCode(name) {
    const code = this.classCodes.get(name);
    if (code === undefined) throw new Error(`unknown cell class ${JSON.stringify(name)}`);
    return code;
  }

  /** The legend's classes: those painted over the colour map first, the empty cell last. */
  legendClasses() {
    const shown = this.classes.filter((cls) => cls.legend);
    return [...shown.filter((cls) => !cls.empty), ...shown.filter((cls) => cls.empty)];
  }

  /** The norm thresholds drawn on a chart of `stat`: [{value, color}], in class order. */
  normLimits(stat, thresholds) {
    if (stat !== NORM_STAT) return [];
    return this.classes.filter((cls) => cls.normThreshold && thresholds[cls.normThreshold] > 0)
      .map((cls) => ({ value: Number(thresholds[cls.normThreshold]), color: cls.accent }));
  }

  /** The top of the colour scale's domain for `stat`: the upper norm threshold, if it has one. */
  scaleCeiling(stat, thresholds) {
    const upper = this.classes.find((cls) => cls.normThreshold && cls.extreme === "high");
    return stat === NORM_STAT && upper ? Number(thresholds[upper.normThreshold]) : Infinity;
  }

  /** 0 for the most urgent severity; unknown ones after every known one. */
  severityRank(name) {
    const rank = this.severities.findIndex((severity) => severity.name === name);
    return rank < 0 ? this.severities.length : rank;
  }

  severityColor(name) {
    return this.severities.find((severity) => severity.name === name)?.color ?? null;
  }

  /** The most urgent severity's colour: a clicked alert's cells are outlined in it. */
  get urgentColor() {
    return this.severities[0]?.color ?? null;
  }

  /** The thresholds offered in the form: [{name, label}] (every one is accepted in the hash). */
  formThresholds() {
    return this.thresholds.filter((threshold) => threshold.in_form);
  }

  /** Sets `cssVariables` on `root` (the tab's root element), where the stylesheet finds them. */
  applyTo(root) {
    for (const [name, value] of Object.entries(this.cssVariables)) root.style.setProperty(name, value);
  }

  /** `var(--class-<name>-<part>)` for an inline style, or null when the class has no such colour. */
  classVar(name, part) {
    const variable = `--class-${name}-${part}`;
    return variable in this.cssVariables ? `var(${variable})` : null;
  }

  /** `var(--severity-<name>)` for an inline style, or null for an unknown severity. */
  severityVar(name) {
    return this.severityColor(name) ? `var(--severity-${name})` : null;
  }
}

/**
 * The stylesheet's colours, `{"--class-<name>-<part>": css, "--severity-<name>": css}`: a class's
 * fill, hatch (and hatch-angle), accent and tooltip colour where it has one, each severity's.
 */
function cssVariables(classes, severities) {
  const variables = {};
  for (const cls of classes) {
    const prefix = `--class-${cls.name}`;
    if (cls.fill) variables[`${prefix}-fill`] = rgb(cls.fill);
    if (cls.hatch) {
      variables[`${prefix}-hatch`] = rgb(cls.hatch.rgb);
      variables[`${prefix}-hatch-angle`] = `${cls.hatch.angle}deg`;
    }
    if (cls.accent) variables[`${prefix}-accent`] = cls.accent;
    if (cls.tooltip) variables[`${prefix}-tooltip`] = cls.tooltip;
  }
  for (const severity of severities) variables[`--severity-${severity.name}`] = severity.color;
  return variables;
}
