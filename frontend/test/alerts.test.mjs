import assert from "node:assert/strict";
import { test } from "node:test";

import {
  alertRowFinder, alertSpans, alertsTitle, firstAlertOf, groupAlerts, rowSeverities,
  lossSpikeMarks,
} from "../alerts.js";

const MATRIX = { variables: ["a/kernel", "a/bias", "b/kernel"], layers: ["a", "a", "b"] };
const alert = (fields) => ({ variable: null, layer: null, ...fields });

test("an alert's rows: its variable's, else its layer's", () => {
  const rowsOf = alertRowFinder(MATRIX);
  assert.deepEqual(rowsOf(alert({ variable: "b/kernel", layer: "b" })), [2]);
  assert.deepEqual(rowsOf(alert({ layer: "a" })), [0, 1]);
  assert.deepEqual(rowsOf(alert({ variable: "gone/kernel", layer: "a" })), [0, 1]);
  assert.deepEqual(rowsOf(alert({})), []);
});

// By layer the heatmap's `variables` and `layers` are both the layer names.
const BY_LAYER = { rowsBy: "layers", variables: ["a", "b"], layers: ["a", "b"] };

test("by layer, an alert's row is its layer's, whether it names a variable or the layer", () => {
  const rowsOf = alertRowFinder(BY_LAYER);
  assert.deepEqual(rowsOf(alert({ variable: "b/kernel", layer: "b" })), [1]);
  assert.deepEqual(rowsOf(alert({ layer: "a" })), [0]);
  // A variable named like another layer still belongs to its own layer.
  assert.deepEqual(rowsOf(alert({ variable: "a", layer: "b" })), [1]);
  assert.deepEqual(rowsOf(alert({})), []);
});

test("the dots by layer: a layer row gets the most urgent of its variables' alerts", () => {
  const rank = (severity) => ["critical", "warning", "info"].indexOf(severity);
  const alerts = [
    alert({ variable: "a/kernel", layer: "a", severity: "info" }),
    alert({ variable: "a/bias", layer: "a", severity: "critical" }),
    alert({ layer: "b", severity: "warning" }),
  ];
  assert.deepEqual([...rowSeverities(alerts, alertRowFinder(BY_LAYER), rank)].sort(),
    [[0, "critical"], [1, "warning"]]);
});

test("a group's alerts from its indices, and each one's rows over its own steps", () => {
  const alerts = [
    alert({ variable: "a/kernel", layer: "a", first_step: 3, last_step: 9 }),
    alert({ variable: "b/kernel", layer: "b", first_step: 1, last_step: 1 }),
    alert({ layer: "a", first_step: 5, last_step: 7 }),
  ];
  const group = { alerts: [2, 0] };
  assert.deepEqual(groupAlerts(group, alerts), [alerts[2], alerts[0]]);
  assert.deepEqual(alertSpans(groupAlerts(group, alerts), alertRowFinder(MATRIX)), [
    { rows: [0, 1], firstStep: 5, lastStep: 7, wholeColumns: false },
    { rows: [0], firstStep: 3, lastStep: 9, wholeColumns: false },
  ]);
  assert.deepEqual(alertSpans(groupAlerts(group, alerts), alertRowFinder(BY_LAYER)), [
    { rows: [0], firstStep: 5, lastStep: 7, wholeColumns: false },
    { rows: [0], firstStep: 3, lastStep: 9, wholeColumns: false },
  ]);
});

test("a loss spike outlines its columns and the cells of the variable that moved first", () => {
  const spike = alert({
    kind: "loss_spike", first_step: 40, last_step: 45,
    moved_first: { variable: "b/kernel", layer: "b", from_step: 33 },
  });
  assert.deepEqual(alertSpans([spike], alertRowFinder(MATRIX)), [
    { rows: [], firstStep: 40, lastStep: 45, wholeColumns: true },
    { rows: [2], firstStep: 33, lastStep: 40, wholeColumns: false },
  ]);
  assert.deepEqual(alertSpans([spike], alertRowFinder(BY_LAYER))[1].rows, [1], "by layer: its layer's row");
  const older = alert({ kind: "loss_spike", first_step: 40, last_step: 45, moved_first: { variable: "a/bias", from_step: 38 } });
  assert.deepEqual(alertSpans([older], alertRowFinder(MATRIX))[1].rows, [1], "no layer named: by variable");
});

test("each row gets its most urgent severity", () => {
  const rank = (severity) => ["critical", "warning", "info"].indexOf(severity);
  const alerts = [
    alert({ layer: "a", severity: "info" }), alert({ variable: "a/bias", severity: "critical" }),
    alert({ variable: "a/kernel", severity: "warning" }),
  ];
  assert.deepEqual([...rowSeverities(alerts, alertRowFinder(MATRIX), rank)].sort(),
    [[0, "warning"], [1, "critical"]]);
});

test("the earliest alert of a kind, the first listed among equals", () => {
  const alerts = [
    { kind: "spike", first_step: 1 }, { kind: "nan", first_step: 9, id: 1 },
    { kind: "nan", first_step: 4, id: 2 }, { kind: "nan", first_step: 4, id: 3 },
  ];
  assert.equal(firstAlertOf(alerts, "nan").id, 2);
  assert.equal(firstAlertOf(alerts, "dead"), null);
});

test("the panel's heading counts alerts and findings in the singular or plural", () => {
  assert.equal(alertsTitle(0, 0), "No alerts");
  assert.equal(alertsTitle(1, 1), "Alerts (1)");
  assert.equal(alertsTitle(3, 3), "Alerts (3)");
  assert.equal(alertsTitle(3, 1), "Alerts (3, in 1 finding)");
  assert.equal(alertsTitle(1000, 2), "Alerts (1,000, in 2 findings)");
});

test("the loss spikes and the warnings before them are marked in step order", () => {
  const alert = (kind, rule, first, last, severity) => ({
    kind, rule, first_step: first, last_step: last, raised_step: first, severity,
    variable: null, layer: null,
  });
  const marks = lossSpikeMarks([
    alert("loss_spike", "spike", 1103, 1120, "critical"),
    alert("exploding", "global", 1103, 1103, "critical"),
    alert("loss_spike", "precursor", 1100, 1102, "warning"),
  ]);
  assert.deepEqual(marks, [
    { firstStep: 1100, lastStep: 1102, raisedStep: 1100, rule: "precursor", severity: "warning" },
    { firstStep: 1103, lastStep: 1120, raisedStep: 1103, rule: "spike", severity: "critical" },
  ]);
  assert.deepEqual(lossSpikeMarks([]), []);
});
