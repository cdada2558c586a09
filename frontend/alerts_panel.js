// The alerts panel: the plugin's groups of alerts (findings, most urgent first), each edged in
// its severity's colour, with the first NaN/Inf gradient called out above them. A group of
// several alerts expands to them (built on first opening: a diverging run can have a thousand);
// clicking a group outlines all its cells, clicking an alert its own.

import { alertsTitle, firstAlertOf, groupAlerts } from "./alerts.js";
import { el, replaceChildren } from "./dom.js";
import { formatStep, formatStepRange } from "./format.js";

/**
 * Fills `panel` with `groups` of `alerts` (the `alerts` route's answer); `onPick(alerts)` when a
 * group (all its alerts) or one alert (a list of one) is clicked.
 */
export function renderAlerts(panel, { alerts, groups, vocabulary, onPick }) {
  const color = (severity) => vocabulary.severityVar(severity);
  const edge = (severity) => color(severity) && `--severity-color: ${color(severity)}`;
  const heading = (item) => el("span", { class: "alert-kind" },
    `${item.severity} · ${item.kind} · ${formatStepRange(item.first_step, item.last_step)}`);
  const alertButton = (alert) => el("button", {
    type: "button", class: "alert-button", "data-testid": "alert", onclick: () => onPick([alert]),
  }, heading(alert), el("span", { class: "alert-message" }, alert.message));
  // A group of one is its alert; a group of several opens to its alerts.
  const groupContent = (group, members) => {
    if (members.length === 1) return alertButton(members[0]);
    const list = el("ol", { class: "alert-list alert-members" });
    const details = el("details", {
      class: "alert-group",
      ontoggle: () => {
        if (details.open && !list.childElementCount) {
          replaceChildren(list, members.map((alert) => el("li", { class: "alert", style: edge(alert.severity) },
            alertButton(alert))));
        }
      },
    },
    el("summary", { class: "alert-button", onclick: () => onPick(members) },
      heading(group),
      el("span", { class: "alert-message" }, group.message)),
    list);
    return details;
  };
  const groupItem = (group) => el("li", { class: "alert", style: edge(group.severity), "data-testid": "alert-group" },
    groupContent(group, groupAlerts(group, alerts)));
  const nonfinite = vocabulary.nonfiniteClass;
  const callout = nonfinite && firstAlertOf(alerts, nonfinite.name);
  const title = alertsTitle(alerts.length, groups.length);
  replaceChildren(panel,
    el("h2", {}, title),
    callout ? el("p", {
      class: "alert-callout", "data-testid": "first-nonfinite",
      style: color(callout.severity) && `color: ${color(callout.severity)}`,
    }, `First ${nonfinite.label} gradient: step ${formatStep(callout.first_step)} in ${callout.variable}`) : null,
    el("ol", { class: "alert-list" }, groups.map(groupItem)));
}
