// The runs as the tab lists them and the one it opens on when the user has not picked one
// (pure, no DOM).

const COLLATOR = new Intl.Collator("en", { numeric: true });

/** Natural order of names: "run2" before "run10" (then plain code-point order among equals). */
export function naturalCompare(a, b) {
  return COLLATOR.compare(a, b) || (a < b ? -1 : a > b ? 1 : 0);
}

/**
 * The [run, tag] most in need of a look, from `found`: [[run, tag, alerts]] (each tag's alerts
 * as the `alerts` route answers them). The one whose most urgent alert is most urgent
 * (`rank(severity)`: 0 for the most urgent), then the one with the most alerts, then the first in
 * natural order; null when `found` is empty.
 */
export function mostSevere(found, rank) {
  const worst = (alerts) => alerts.reduce((best, alert) => Math.min(best, rank(alert.severity)), Infinity);
  const ranked = found.map(([run, tag, alerts]) => ({ run, tag, worst: worst(alerts), count: alerts.length }));
  ranked.sort((a, b) => a.worst - b.worst || b.count - a.count
    || naturalCompare(a.run, b.run) || naturalCompare(a.tag, b.tag));
  return ranked.length ? [ranked[0].run, ranked[0].tag] : null;
}
