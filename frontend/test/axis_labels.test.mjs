import assert from "node:assert/strict";
import { test } from "node:test";

import { thinLabels } from "../axis_labels.js";

// Widths as an 11 px sans-serif font measures them: about 6.1 px per digit.
const measured = (texts) => texts.map((text) => text.length * 6.1);

function labelsAt(texts, length) {
  const widths = measured(texts);
  return texts.map((_, i) => ({ x: ((i + 0.5) * length) / texts.length, width: widths[i] }));
}

function assertNoOverlap(kept, labels, length, gap) {
  kept.forEach(({ index, left }, i) => {
    assert.ok(left >= 0 && left + labels[index].width <= length + 1e-9, `label ${index} inside`);
    if (i) {
      const previous = kept[i - 1];
      assert.ok(left >= previous.left + labels[previous.index].width + gap, `${previous.index} and ${index}`);
    }
  });
}

test("labels that fit are all kept, centred on their positions", () => {
  const labels = labelsAt(["0", "1", "2", "3"], 400);
  const kept = thinLabels(labels, 400, 8);
  assert.deepEqual(kept.map(({ index }) => index), [0, 1, 2, 3]);
  assert.ok(Math.abs(kept[1].left - (150 - labels[1].width / 2)) < 1e-9);
});

test("crowded labels are thinned to every k-th, and none overlap", () => {
  const texts = Array.from({ length: 300 }, (_, i) => String(i));
  const labels = labelsAt(texts, 600);
  const kept = thinLabels(labels, 600, 8);
  assertNoOverlap(kept, labels, 600, 8);
  const every = kept[1].index - kept[0].index;
  assert.ok(kept.every(({ index }, i) => index === i * every), "evenly spaced");
  assert.ok(kept.length >= 10, `enough labels to read the axis: ${kept.length}`);
  // The smallest step that fits: one fewer would overlap.
  const denser = labels.filter((_, i) => i % (every - 1) === 0);
  assert.ok(denser.some((label, i) => i && label.x - label.width / 2 < denser[i - 1].x + denser[i - 1].width / 2 + 8)
    || every === 1);
});

test("labels near the ends are moved inside the axis, and wide ones thinned for it", () => {
  const labels = [{ x: 0, width: 40 }, { x: 50, width: 40 }, { x: 100, width: 40 }];
  const kept = thinLabels(labels, 100, 4);
  assertNoOverlap(kept, labels, 100, 4);
  assert.equal(kept[0].left, 0);
  assert.deepEqual(thinLabels([{ x: 10, width: 500 }], 100), [{ index: 0, left: 0 }]);
  assert.deepEqual(thinLabels([], 100), []);
});
