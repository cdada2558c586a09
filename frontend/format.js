// Number, step and name formatting for labels, tooltips and the colour bar (pure, no DOM).

/** A value as people read gradient statistics: 3-4 significant digits, exponent when tiny/huge. */
export function formatValue(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  if (value === 0) return "0";
  const magnitude = Math.abs(value);
  if (magnitude >= 1e4 || magnitude < 1e-3) {
    const [mantissa, exponent] = value.toExponential(2).split("e");
    return `${trimZeros(mantissa)}e${Number(exponent)}`;
  }
  return trimZeros(value.toPrecision(4));
}

function trimZeros(text) {
  return text.includes(".") ? text.replace(/\.?0+$/, "") : text;
}

/** A step number with thousands separators: 12345 -> "12,345". */
export function formatStep(step) {
  return Math.round(step).toLocaleString("en-US");
}

/** "1 finding", "3 findings", "1,000 alerts": a count and its noun, singular or plural. */
export function counted(count, noun, plural = `${noun}s`) {
  return `${formatStep(count)} ${count === 1 ? noun : plural}`;
}

/** "step 120" or "steps 120–129" for a merged column. */
export function formatStepRange(first, last) {
  return first === last ? `step ${formatStep(first)}` : `steps ${formatStep(first)}–${formatStep(last)}`;
}

/** Shortens `text` to fit `maxWidth` as measured by `measure(text)`, keeping its end (the
 * variable's own name) and eliding the middle of its path. */
export function ellipsize(text, maxWidth, measure) {
  if (measure(text) <= maxWidth) return text;
  let low = 0;
  let high = text.length;
  while (low < high) {
    const keep = Math.ceil((low + high) / 2);
    const candidate = "…" + text.slice(text.length - keep);
    if (measure(candidate) <= maxWidth) low = keep;
    else high = keep - 1;
  }
  return low === 0 ? "…" : "…" + text.slice(text.length - low);
}

// A layer's name that reads as a number: a PyTorch nn.Sequential names its layers "0", "1"...
// (and "1.0" in a Sequential nested in one).
const NUMBERED_LAYER = /^\d+(\.\d+)*$/;

/** A layer's name as the tab shows it alone: "layer 0" for a numbered layer, else the name. */
export function layerName(name) {
  return NUMBERED_LAYER.test(name) ? `layer ${name}` : name;
}

/** A heatmap row's name as the tab shows it: a layer's (`rowsBy` "layers") by `layerName`. */
export function rowName(rowsBy, name) {
  return rowsBy === "layers" ? layerName(name) : name;
}
