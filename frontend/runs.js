// The runs as the tab lists them and the one it opens on when the user has not picked one
// (pure, no DOM).

// A name as runs of digits and runs of anything else.
const TOKENS = /\d+|\D+/g;

/**
 * Natural order of names: "run2" before "run10", case aside, then plain code-point order among
 * equals. Text is compared by code point, so a run's path reads as a path: "exploding/train"
 * before "exploding_clipped/train" (a locale's collation puts "_" before "/", and the demo's
 * Run menu listed the clipped run first).
 */
export function naturalCompare(a, b) {
  const tokensA = a.match(TOKENS) || [];
  const tokensB = b.match(TOKENS) || [];
  for (let i = 0; i < Math.min(tokensA.length, tokensB.length); i++) {
    const order = compareTokens(tokensA[i], tokensB[i]);
    if (order) return order;
  }
  return tokensA.length - tokensB.length || codePointOrder(a, b);
}

// Numbers before text, numbers by value (of any length), text by code point ignoring case.
function compareTokens(a, b) {
  const [numberA, numberB] = [/^\d/.test(a), /^\d/.test(b)];
  if (numberA !== numberB) return numberA ? -1 : 1;
  if (numberA) {
    const [valueA, valueB] = [a.replace(/^0+(?=\d)/, ""), b.replace(/^0+(?=\d)/, "")];
    return valueA.length - valueB.length || codePointOrder(valueA, valueB);
  }
  return codePointOrder(a.toLowerCase(), b.toLowerCase());
}

function codePointOrder(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
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
