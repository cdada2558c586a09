// What the tab says besides its views (DOM): the status line, the list of tags that cannot be
// read or lost steps (problems.js words them), and the empty state: what the logdir holds and
// how to log gradients.

import { el, replaceChildren } from "./dom.js";
import { dataProblems, logdirFinding, problemLine, problemsSummary } from "./problems.js";

/** The status line: `text` styled as `kind` ("info", "loading", "warning" or "error"), or none. */
export function renderStatus(node, text, kind = "info") {
  replaceChildren(node, text ? el("span", { class: `status-${kind}` }, text) : null);
}

/** Names every tag that cannot be read or lost steps as damaged, whichever run is shown. */
export function renderProblems(panel, runs) {
  const problems = dataProblems(runs);
  panel.hidden = !problems.length;
  replaceChildren(panel, el("summary", {}, problemsSummary(problems)),
    el("ul", {}, problems.map((problem) =>
      el("li", { class: `problem problem-${problem.severity}` }, problemLine(problem)))));
}

/**
 * No tag has data yet: what TensorBoard's logdir holds (`inventory`, the plugin's `inventory`
 * answer, or null when it did not answer), what is wrong with the tags there are, and each
 * framework's way to log gradients.
 */
export function renderEmpty(node, runs, inventory) {
  replaceChildren(node, el("div", { class: "empty", "data-testid": "empty-state" },
    // "yet" while training may still log; a path that is no directory never will.
    el("h2", {}, inventory && !inventory.exists ? "No gradient data" : "No gradient data yet"),
    inventory && el("p", { "data-testid": "logdir-finding" }, logdirFinding(inventory)),
    dataProblems(runs).map((problem) => el("p", { class: `status-${problem.severity}` }, problemLine(problem))),
    inventory && [
      el("p", {}, "Attach a gradient writer to the training job, by its framework; what it logs appears here:"),
      el("ul", { class: "entry-points", "data-testid": "entry-points" },
        inventory.entry_points.map(({ framework, entry_point: entryPoint }) => el("li", {},
          `${framework}: `, el("code", {}, entryPoint)))),
      el("p", { class: "hint" }, "The user guide (docs/guide/) shows each one's call and options.")]));
}
