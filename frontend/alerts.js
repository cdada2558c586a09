// The alerts' place in the heatmap (pure, no DOM): which rows an alert or a group of alerts is
// about, in the rows the heatmap shows (variables or layers), each row's most urgent severity
// (the dots beside the labels), the earliest alert of a kind, and the panel's heading.

import { counted, formatStep } from "./format.js";

/**
 * A function from an alert to the heatmap rows it is about. By variable: its variable's row when
 * the matrix has that variable, else every row of its layer (a whole-layer alert, or a variable
 * the matrix lacks). By layer: its layer's row, whether the alert names a variable of the layer or
 * the whole layer. A whole-model alert names no row.
 */
export function alertRowFinder(matrix) {
  const rowOf = new Map(matrix.variables.map((variable, row) => [variable, row]));
  const byVariable = matrix.rowsBy !== "layers";
  return (alert) => {
    if (byVariable && alert.variable !== null && rowOf.has(alert.variable)) return [rowOf.get(alert.variable)];
    if (alert.layer !== null) return matrix.layers.flatMap((layer, row) => (layer === alert.layer ? [row] : []));
    return [];
  };
}

/**
 * What to outline for `alerts` (one clicked alert, or a group's): [{rows, firstStep, lastStep,
 * wholeColumns}], each alert's rows over its own steps, so a group outlines exactly its members'
 * cells. A whole-model alert (no row: a loss spike, the global norm) outlines its steps' columns;
 * one that names the variable that moved first (`moved_first`) also that variable's cells from
 * the step it began to move to the alert's first step: the precursor cells.
 */
export function alertSpans(alerts, rowsOf) {
  return alerts.flatMap((alert) => {
    const rows = rowsOf(alert);
    const spans = [{ rows, firstStep: alert.first_step, lastStep: alert.last_step, wholeColumns: !rows.length }];
    const mover = alert.moved_first;
    if (mover) {
      spans.push({
        rows: rowsOf({ variable: mover.variable, layer: mover.layer ?? null }),
        firstStep: mover.from_step, lastStep: alert.first_step, wholeColumns: false,
      });
    }
    return spans;
  });
}

/**
 * The loss spikes and the warnings before them, to mark over the loss curve: one mark per
 * `loss_spike` alert, {firstStep, lastStep, raisedStep, rule ("spike", or a precursor's: "precursor",
 * "update", "sustained", "jump"), severity},
 * in step order.
 */
export function lossSpikeMarks(alerts) {
  return alerts
    .filter((alert) => alert.kind === "loss_spike")
    .map((alert) => ({
      firstStep: alert.first_step, lastStep: alert.last_step, raisedStep: alert.raised_step,
      rule: alert.rule, severity: alert.severity,
    }))
    .sort((a, b) => a.firstStep - b.firstStep);
}

/**
 * The alerts panel's heading: "No alerts", "Alerts (1)", "Alerts (3)" when each alert is its own
 * finding, else "Alerts (1,000, in 1 finding)".
 */
export function alertsTitle(alertCount, groupCount) {
  if (!alertCount) return "No alerts";
  const count = formatStep(alertCount);
  return groupCount === alertCount ? `Alerts (${count})` : `Alerts (${count}, in ${counted(groupCount, "finding")})`;
}

/** The alerts of `group` (an entry of the `alerts` route's `groups`), from its indices. */
export function groupAlerts(group, alerts) {
  return group.alerts.map((index) => alerts[index]);
}

/** Row -> the most urgent severity of its alerts; `rank(severity)` is 0 for the most urgent. */
export function rowSeverities(alerts, rowsOf, rank) {
  const worst = new Map();
  for (const alert of alerts) {
    for (const row of rowsOf(alert)) {
      const current = worst.get(row);
      if (current === undefined || rank(alert.severity) < rank(current)) worst.set(row, alert.severity);
    }
  }
  return worst;
}

/** The alert of `kind` with the earliest first step (the first listed among equals), or null. */
export function firstAlertOf(alerts, kind) {
  let first = null;
  for (const alert of alerts) {
    if (alert.kind === kind && (first === null || alert.first_step < first.first_step)) first = alert;
  }
  return first;
}
