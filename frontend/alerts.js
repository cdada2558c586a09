// The alerts' place in the heatmap (pure, no DOM): which rows an alert is about, each row's most
// urgent severity (the dots beside the labels), and the earliest alert of a kind.

/** A function from an alert to the heatmap rows it is about: its variable's row when the matrix
 * has that variable, else every row of its layer. */
export function alertRowFinder(matrix) {
  const rowOf = new Map(matrix.variables.map((variable, row) => [variable, row]));
  return (alert) => {
    if (alert.variable !== null && rowOf.has(alert.variable)) return [rowOf.get(alert.variable)];
    if (alert.layer !== null) return matrix.layers.flatMap((layer, row) => (layer === alert.layer ? [row] : []));
    return [];
  };
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
