import assert from "node:assert/strict";
import { test } from "node:test";

import { alertRowFinder, firstAlertOf, rowSeverities } from "../alerts.js";

const MATRIX = { variables: ["a/kernel", "a/bias", "b/kernel"], layers: ["a", "a", "b"] };
const alert = (fields) => ({ variable: null, layer: null, ...fields });

test("an alert's rows: its variable's, else its layer's", () => {
  const rowsOf = alertRowFinder(MATRIX);
  assert.deepEqual(rowsOf(alert({ variable: "b/kernel", layer: "b" })), [2]);
  assert.deepEqual(rowsOf(alert({ layer: "a" })), [0, 1]);
  assert.deepEqual(rowsOf(alert({ variable: "gone/kernel", layer: "a" })), [0, 1]);
  assert.deepEqual(rowsOf(alert({})), []);
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
