import assert from "node:assert/strict";
import { test } from "node:test";

import { makeScale } from "../colormap.js";
import { decodeHeatmap } from "../decode.js";
import { classPaints, rasterize } from "../raster.js";
import { Vocabulary } from "../vocabulary.js";
import { CLASS_NAMES, SERVED, VOCABULARY } from "./vocabulary_fixture.mjs";

test("the stat picker offers every heatmap stat of the tag, in the tag's order", () => {
  assert.deepEqual(VOCABULARY.heatmapStats(["nan_count", "l2_norm", "size", "mean"]), [
    ["nan_count", "NaN count"], ["l2_norm", "L2 norm"], ["mean", "mean"],
  ]);
});

test("a stat the vocabulary does not know appears under its own name, as a magnitude", () => {
  assert.deepEqual(VOCABULARY.heatmapStats(["l2_norm", "curvature"]), [["l2_norm", "L2 norm"], ["curvature", "curvature"]]);
  assert.equal(VOCABULARY.statLabel("curvature"), "curvature");
  assert.equal(VOCABULARY.statScale("curvature"), "log");
  assert.equal(VOCABULARY.statScale("zero_fraction"), "fraction");
  assert.equal(VOCABULARY.statScale("mean"), "linear");
});

test("the class order from the vocabulary decides which cell a merged pixel shows", () => {
  // The plugin's answer in its own order; the two vocabularies disagree on vanishing vs exploding.
  const body = {
    run: "r", tag: "t", stat: "l2_norm", variables: ["a"], layers: ["a"], steps: [0, 1], wall_times: [0, 0],
    encoding: "base64", shape: [1, 2], class_names: CLASS_NAMES,
    values: Buffer.from(new Float32Array([1e-9, 1e9]).buffer).toString("base64"),
    classes: Buffer.from(Uint8Array.from(["vanishing", "exploding"], (name) => CLASS_NAMES.indexOf(name)))
      .toString("base64"),
  };
  const shown = (vocabulary) => {
    const matrix = decodeHeatmap(body, vocabulary);
    const pixels = rasterize(matrix, makeScale([1e-9, 1e9], "log"), 1, 1, classPaints(vocabulary.classes));
    return [...pixels.slice(0, 3)];
  };
  const hatch = (name) => SERVED.classes.find((cls) => cls.name === name).hatch.rgb;
  assert.deepEqual(shown(VOCABULARY), hatch("exploding")); // pixel (0, 0) lies on both stripes
  const swapped = { vanishing: "exploding", exploding: "vanishing" };
  const vanishingWorse = new Vocabulary({
    ...SERVED,
    classes: SERVED.classes.map((cls) => SERVED.classes.find((other) => other.name === (swapped[cls.name] || cls.name))),
  });
  assert.deepEqual(shown(vanishingWorse), hatch("vanishing"));
});

test("CSS variables carry every class and severity colour", () => {
  assert.deepEqual(VOCABULARY.cssVariables, {
    "--class-vanishing-hatch": "rgb(200, 240, 255)",
    "--class-vanishing-hatch-angle": "-45deg",
    "--class-vanishing-accent": "#12b5cb",
    "--class-vanishing-tooltip": "#9be7ff",
    "--class-spike-hatch": "rgb(235, 0, 235)",
    "--class-spike-hatch-angle": "0deg",
    "--class-spike-accent": "#c51fc5",
    "--class-spike-tooltip": "#f48fff",
    "--class-exploding-hatch": "rgb(150, 0, 20)",
    "--class-exploding-hatch-angle": "45deg",
    "--class-exploding-accent": "#f29900",
    "--class-exploding-tooltip": "#ffb74d",
    "--class-nonfinite-fill": "rgb(255, 45, 85)",
    "--class-nonfinite-accent": "#ff2d55",
    "--class-nonfinite-tooltip": "#ff8a80",
    "--severity-critical": "#d93025",
    "--severity-warning": "#f29900",
    "--severity-info": "#1a73e8",
  });
  const set = {};
  VOCABULARY.applyTo({ style: { setProperty: (name, value) => { set[name] = value; } } });
  assert.deepEqual(set, VOCABULARY.cssVariables);
  assert.equal(VOCABULARY.classVar("vanishing", "hatch"), "var(--class-vanishing-hatch)");
  assert.equal(VOCABULARY.classVar("ok", "tooltip"), null);
  assert.equal(VOCABULARY.severityVar("warning"), "var(--severity-warning)");
  assert.equal(VOCABULARY.severityVar("apocalyptic"), null);
});

test("severities: most urgent first, unknown ones last", () => {
  assert.deepEqual(["info", "critical", "odd", "warning"].sort((a, b) => VOCABULARY.severityRank(a) - VOCABULARY.severityRank(b)),
    ["critical", "warning", "info", "odd"]);
  assert.equal(VOCABULARY.severityColor("warning"), "#f29900");
  assert.equal(VOCABULARY.urgentColor, "#d93025");
});

test("the legend lists the painted classes first, then the empty cell", () => {
  assert.deepEqual(VOCABULARY.legendClasses().map((cls) => cls.label), ["vanishing", "spike", "exploding", "NaN/Inf", "no gradient"]);
});

test("norm thresholds: lines on an L2 norm chart in their classes' accents, the colour scale's cap", () => {
  const thresholds = { vanishing_norm: 1e-7, exploding_norm: 1e3, depth_ratio: 1e-4 };
  assert.deepEqual(VOCABULARY.normLimits("l2_norm", thresholds), [
    { value: 1e-7, color: "#12b5cb" }, { value: 1e3, color: "#f29900" },
  ]);
  assert.deepEqual(VOCABULARY.normLimits("mean_abs", thresholds), []);
  assert.equal(VOCABULARY.scaleCeiling("l2_norm", thresholds), 1e3);
  assert.equal(VOCABULARY.scaleCeiling("abs_max", thresholds), Infinity);
});

test("the thresholds form and the non-finite class", () => {
  // The served table decides which thresholds the form offers, in the table's order.
  const offered = VOCABULARY.formThresholds().map((threshold) => threshold.name);
  assert.deepEqual(offered, SERVED.thresholds.filter((threshold) => threshold.in_form).map((threshold) => threshold.name));
  assert.deepEqual([...offered].sort(),
    ["depth_ratio", "exploding_norm", "loss_spike_ratio", "precursor_loss_ratio", "spike_zscore",
      "sustain_steps", "vanishing_norm"]);
  assert.ok(SERVED.thresholds.some((threshold) => !threshold.in_form), "not every threshold is in the form");
  assert.equal(VOCABULARY.nonfiniteClass.label, "NaN/Inf");
  assert.throws(() => VOCABULARY.classCode("melting"), /unknown cell class "melting"/);
});

test("an empty vocabulary knows nothing and breaks nothing", () => {
  const empty = new Vocabulary({});
  assert.deepEqual(empty.heatmapStats(["l2_norm"]), [["l2_norm", "l2_norm"]]);
  assert.deepEqual(empty.cssVariables, {});
  assert.equal(empty.nonfiniteClass, null);
});
