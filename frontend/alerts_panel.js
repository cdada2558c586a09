// The alerts panel: the plugin's alerts (most urgent first), each edged in its severity's colour,
// with the first NaN/Inf gradient called out above them; clicking one outlines its cells.

import { firstAlertOf } from "./alerts.js";
import { el, replaceChildren } from "./dom.js";
import { formatStep } from "./format.js";

/** Fills `panel` with `alerts`; `onPick(alert)` when one is clicked. */
export function renderAlerts(panel, { alerts, vocabulary, onPick }) {
  const severityColor = (alert) => vocabulary.severityVar(alert.severity);
  const nonfinite = vocabulary.nonfiniteClass;
  const callout = nonfinite && firstAlertOf(alerts, nonfinite.name);
  const items = alerts.map((alert) => el("li", {
    class: "alert", style: severityColor(alert) && `--severity-color: ${severityColor(alert)}`,
  },
  el("button", { type: "button", class: "alert-button", "data-testid": "alert", onclick: () => onPick(alert) },
    el("span", { class: "alert-kind" }, `${alert.severity} · ${alert.kind}`),
    el("span", { class: "alert-message" }, alert.message))));
  replaceChildren(panel,
    el("h2", {}, alerts.length ? `Alerts (${alerts.length})` : "No alerts"),
    callout ? el("p", {
      class: "alert-callout", "data-testid": "first-nonfinite",
      style: severityColor(callout) && `color: ${severityColor(callout)}`,
    }, `First ${nonfinite.label} gradient: step ${formatStep(callout.first_step)} in ${callout.variable}`) : null,
    el("ol", { class: "alert-list" }, items));
}
