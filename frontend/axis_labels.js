// Which labels of an axis to draw (pure, no DOM): every k-th one, for the smallest k at which no
// two overlap and none runs off the axis. Evenly spaced labels read as a scale; overlapping ones
// read as nothing.

/**
 * `labels`: [{x, width}] in increasing x, each to be centred at x on an axis `length` px long,
 * `width` as measured in the axis' font; `gap`: the least space between two drawn labels.
 * Returns [{index, left}] of the labels to draw, `left` the x of a label's left edge (moved
 * inside the axis when its centre is too near an end).
 */
export function thinLabels(labels, length, gap = 8) {
  const placed = labels.map(({ x, width }, index) => ({
    index, width, left: Math.max(0, Math.min(length - width, x - width / 2)),
  }));
  if (!placed.length) return [];
  // No fewer labels can be dropped than this: even the narrowest ones, side by side, must fit.
  const narrowest = Math.min(...placed.map((label) => label.width));
  let every = Math.max(1, Math.floor((placed.length * (narrowest + gap)) / (length + gap)));
  for (; every < placed.length; every++) {
    const kept = placed.filter((_, i) => i % every === 0);
    if (kept.every((label, i) => i === 0 || label.left >= kept[i - 1].left + kept[i - 1].width + gap)) {
      return kept.map(({ index, left }) => ({ index, left }));
    }
  }
  return [{ index: 0, left: placed[0].left }];
}
