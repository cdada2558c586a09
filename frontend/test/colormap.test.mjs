import assert from "node:assert/strict";
import { test } from "node:test";

import { colorTable, makeScale, viridis } from "../colormap.js";

test("viridis runs from dark purple to yellow and is monotonic in lightness", () => {
  assert.deepEqual(viridis(0), [68, 1, 84]);
  assert.deepEqual(viridis(1), [253, 231, 37]);
  assert.deepEqual(viridis(-3), viridis(0));
  const lightness = ([r, g, b]) => 0.2126 * r + 0.7152 * g + 0.0722 * b;
  let previous = -1;
  for (let i = 0; i <= 100; i++) {
    const current = lightness(viridis(i / 100));
    assert.ok(current > previous, `lightness must grow at ${i}`);
    previous = current;
  }
});

test("the colour table has one opaque RGBA entry per level", () => {
  const table = colorTable(16);
  assert.equal(table.length, 64);
  assert.deepEqual([...table.slice(60)], [253, 231, 37, 255]);
  assert.equal(table[3], 255);
});

test("log scale spans the bulk of the values and clamps outliers", () => {
  const values = [];
  for (let i = 0; i < 1000; i++) values.push(10 ** (-3 + (3 * i) / 999)); // 1e-3 .. 1
  values.push(1e9, NaN, Infinity, 0);
  const scale = makeScale(values, "log");
  assert.equal(scale.kind, "log");
  assert.ok(scale.domain[0] > 1e-3 && scale.domain[0] < 1.2e-3);
  assert.ok(scale.domain[1] > 0.9 && scale.domain[1] < 1.01);
  assert.equal(scale.position(1e9), 1);
  assert.ok(Math.abs(scale.position(Math.sqrt(scale.domain[0] * scale.domain[1])) - 0.5) < 1e-9);
  assert.ok(Number.isNaN(scale.position(NaN)));
  assert.ok(Number.isNaN(scale.position(Infinity)));
  assert.ok(Number.isNaN(scale.position(0)));
  assert.ok(Math.abs(scale.valueAt(0.5) - Math.sqrt(scale.domain[0] * scale.domain[1])) < 1e-9);
});

test("a constant matrix still gets a one-decade scale; empty input a default one", () => {
  const scale = makeScale([2, 2, 2], "log");
  assert.ok(Math.abs(Math.log10(scale.domain[1] / scale.domain[0]) - 1) < 1e-9);
  assert.equal(scale.position(2), 0.5);
  assert.deepEqual(makeScale([NaN], "log").domain.map((v) => +v.toFixed(6)), [0.1, 1]);
});

test("fractions, counts and signed values are linear", () => {
  assert.deepEqual(makeScale([0.2, 0.4], "fraction").domain, [0, 1]);
  const counts = makeScale([0, 3, 12], "count");
  assert.deepEqual(counts.domain, [0, 12]);
  assert.equal(counts.position(3), 0.25);
  const many = new Array(300000).fill(1);
  many[123457] = 40; // one large count must set the top even when percentiles are sampled
  assert.deepEqual(makeScale(many, "count").domain, [0, 40]);
  assert.deepEqual(makeScale([-2, 3], "linear").domain, [-2, 3]);
});

test("a log scale stops at the exploding ceiling so the build-up below it keeps its colours", () => {
  const values = [];
  for (let i = 0; i < 90; i++) values.push(10 ** (-1 + (3 * i) / 89)); // 0.1 .. 100
  for (let i = 0; i < 10; i++) values.push(1e15); // the last steps blew up
  assert.ok(makeScale(values, "log").domain[1] > 1e14);
  const capped = makeScale(values, "log", 1e3);
  assert.ok(Math.abs(capped.domain[1] - 1e3) < 1e-6);
  assert.equal(capped.position(1e15), 1);
  assert.ok(capped.position(10) < 0.8);
  assert.deepEqual(makeScale([1e6, 1e7], "log", 1e3).domain.map((v) => Math.round(Math.log10(v))), [2, 3]);
});
