// Colour scales for the heatmap (pure, no DOM): a perceptually uniform, colour-blind-safe map
// (viridis), over log10 of the value for magnitudes. The colours that mark cells by class are the
// vocabulary's (vocabulary.js), chosen outside viridis.

// matplotlib's viridis at 10 evenly spaced points; linear interpolation between them stays within
// a few RGB units of the full 256-entry table.
const VIRIDIS = [
  [68, 1, 84], [72, 40, 120], [62, 73, 137], [49, 104, 142], [38, 130, 142],
  [31, 158, 137], [53, 183, 121], [110, 206, 88], [181, 222, 43], [253, 231, 37],
];

// The tab's accent blue, for canvas lines that must read on viridis (the selected cell), and
// before the stylesheet's --accent (the same blue in the light theme, a lighter one in the dark)
// has loaded.
export const ACCENT = "#1a73e8";

// The dashed line where an epoch starts, over the cells of the step axis (and its legend chip):
// a translucent white that reads on every colour of the map.
export const EPOCH_LINE = Object.freeze({ color: "rgba(255,255,255,0.7)", dash: Object.freeze([3, 3]) });

/** viridis(t) for t in [0, 1] -> [r, g, b]. */
export function viridis(t) {
  const x = Math.min(1, Math.max(0, t)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(x));
  const f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}

/** `size` colours of viridis as a flat RGBA table (fast per-cell lookup while drawing). */
export function colorTable(size = 256) {
  const table = new Uint8ClampedArray(size * 4);
  for (let i = 0; i < size; i++) {
    table.set([...viridis(i / (size - 1)), 255], i * 4);
  }
  return table;
}

function percentile(sorted, q) {
  if (sorted.length === 0) return NaN;
  const position = (sorted.length - 1) * q;
  const low = Math.floor(position);
  const high = Math.min(sorted.length - 1, low + 1);
  return sorted[low] + (position - low) * (sorted[high] - sorted[low]);
}

/**
 * A scale for one matrix of values of a stat whose scale kind (vocabulary.statScale) is `kind`:
 * "log" (magnitudes), "linear" (signed values), "fraction" ([0, 1]) or "count" (from 0).
 *
 * Log scales span the 1st-99th percentile of log10 of the finite positive values (one huge
 * cell would otherwise flatten every other row; the class colours and outlines still show it),
 * at least one decade wide, and never above `ceiling` when one is given (the exploding
 * threshold: cells above it are hatched anyway, and a run that blew up to 1e15 for its last
 * steps would otherwise paint the whole build-up before it in one colour). `position(v)` is in
 * [0, 1] (clamped), or NaN for values the colour map does not show (NaN, Inf, and zero or
 * negative values on a log scale).
 */
export function makeScale(values, kind, ceiling = Infinity) {
  const finite = [];
  let smallest = Infinity;
  let largest = -Infinity;
  for (const v of values) {
    if (!Number.isFinite(v) || (kind === "log" && v <= 0)) continue;
    const x = kind === "log" ? Math.log10(v) : v;
    finite.push(x);
    if (x < smallest) smallest = x;
    if (x > largest) largest = x;
  }
  let low;
  let high;
  if (kind === "fraction") [low, high] = [0, 1];
  else if (kind === "count") [low, high] = [0, Math.max(1, largest)];
  else if (kind === "linear") [low, high] = [smallest, largest];
  else {
    // Percentiles of at most ~100,000 evenly strided values: the same domain, several times
    // faster on a 1,000 x 1,000 matrix.
    const stride = Math.max(1, Math.floor(finite.length / 100000));
    const sample = stride === 1 ? finite : finite.filter((_, i) => i % stride === 0);
    const sorted = Float64Array.from(sample).sort();
    [low, high] = [percentile(sorted, 0.01), percentile(sorted, 0.99)];
    if (ceiling > 0 && high > Math.log10(ceiling)) {
      high = Math.log10(ceiling);
      low = Math.min(low, high - 1);
    }
  }
  if (!Number.isFinite(low) || !Number.isFinite(high)) [low, high] = kind === "log" ? [-1, 0] : [0, 1];
  const minimumWidth = kind === "log" ? 1 : Math.max(Math.abs(high) * 1e-6, 1e-12);
  if (high - low < minimumWidth) {
    const middle = (low + high) / 2;
    [low, high] = [middle - minimumWidth / 2, middle + minimumWidth / 2];
  }
  const transform = kind === "log" ? (v) => (v > 0 ? Math.log10(v) : NaN) : (v) => v;
  return {
    kind,
    // The domain in the stat's own units (what the colour bar is labelled with).
    domain: kind === "log" ? [10 ** low, 10 ** high] : [low, high],
    position(value) {
      if (!Number.isFinite(value)) return NaN;
      const x = transform(value);
      if (Number.isNaN(x)) return NaN;
      return Math.min(1, Math.max(0, (x - low) / (high - low)));
    },
    /** The value at position t (the inverse, for colour bar ticks). */
    valueAt(t) {
      const x = low + t * (high - low);
      return kind === "log" ? 10 ** x : x;
    },
  };
}
