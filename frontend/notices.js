// What the tab says besides its views (DOM): the status line, the list of tags that cannot be
// read or lost steps (problems.js words them), and the empty state that shows how to log.

import { el, replaceChildren } from "./dom.js";
import { dataProblems, problemLine, problemsSummary } from "./problems.js";

const KERAS_SNIPPET = `from tensorboard_gradients.keras import GradientMonitor
model.fit(x, y, callbacks=[GradientMonitor(log_dir="logs")])`;
const LOOP_SNIPPET = `from tensorboard_gradients import summary
with writer.as_default(step=step):
    summary.gradients(grads, model.trainable_variables)`;

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

/** No tag has data yet: what is wrong with the ones there are, and how to log gradients. */
export function renderEmpty(node, runs) {
  replaceChildren(node, el("div", { class: "empty", "data-testid": "empty-state" },
    el("h2", {}, "No gradient data yet"),
    dataProblems(runs).map((problem) => el("p", { class: `status-${problem.severity}` }, problemLine(problem))),
    el("p", {}, "Log per-layer gradient statistics and they appear here. From Keras model.fit:"),
    el("pre", {}, KERAS_SNIPPET),
    el("p", {}, "From a custom TensorFlow training loop:"),
    el("pre", {}, LOOP_SNIPPET),
    el("p", {}, "PyTorch, JAX or numpy: tensorboard_gradients.GradientWriter (see the README).")));
}
