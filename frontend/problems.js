// What the tab cannot show as it was logged, in words (pure, no DOM): tags that cannot be read
// and logged steps left out as damaged, from the plugin's `runs` answer, and what TensorBoard's
// logdir holds when it holds no gradient data. One bad file must be named, never silently
// missing, while every other run is shown as usual; a mistyped logdir must read as one.

import { counted } from "./format.js";

/**
 * `[{run, tag, severity, text}]` from a `runs` answer: one "error" per tag that cannot be read,
 * one "warning" per sentence of a tag's `damage`. A sentence about a damaged file is repeated
 * on every tag of its run by the plugin; it is listed once per run here.
 */
export function dataProblems(runs) {
  const problems = [];
  const seen = new Set();
  for (const [run, tags] of Object.entries(runs || {})) {
    for (const [tag, info] of Object.entries(tags)) {
      if (info.error) problems.push({ run, tag, severity: "error", text: info.error });
      for (const text of info.damage || []) {
        const key = JSON.stringify([run, text]);
        if (seen.has(key)) continue;
        seen.add(key);
        problems.push({ run, tag, severity: "warning", text });
      }
    }
  }
  return problems;
}

/** One line of a problem, naming where it is: "run/tag: text". */
export function problemLine(problem) {
  return `${problem.run}/${problem.tag}: ${problem.text}`;
}

/** The heading of the problems list: "2 tags cannot be read; 1 has damaged steps". */
export function problemsSummary(problems) {
  const count = (severity) => new Set(problems.filter((p) => p.severity === severity)
    .map((p) => JSON.stringify([p.run, p.tag]))).size;
  const unreadable = count("error");
  const damaged = count("warning");
  const parts = [];
  if (unreadable) parts.push(`${counted(unreadable, "tag")} cannot be read`);
  if (damaged) parts.push(`${counted(damaged, "tag")} ${damaged === 1 ? "has" : "have"} damaged data`);
  return parts.join("; ");
}

/**
 * What TensorBoard's logdir holds, from the plugin's `inventory` answer: "TensorBoard's logdir
 * /x: 2 runs; scalars tags: loss.", or for a path that is no directory "TensorBoard's logdir
 * /x: no such directory. Check the path given to --logdir."
 */
export function logdirFinding({ location, exists, found }) {
  return `TensorBoard's logdir ${location}: ${found}.${exists ? "" : " Check the path given to --logdir."}`;
}
