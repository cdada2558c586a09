import assert from "node:assert/strict";
import { test } from "node:test";

import { makeScale, viridis } from "../colormap.js";
import { classPaints, rasterize } from "../raster.js";
import { CLASS_NAMES, SERVED, VOCABULARY } from "./vocabulary_fixture.mjs";

const PAINTS = classPaints(VOCABULARY.classes);
const style = (name) => SERVED.classes.find((cls) => cls.name === name);
const NONFINITE = [...style("nonfinite").fill, 255];
const VANISHING_HATCH = [...style("vanishing").hatch.rgb, 255];
const EXPLODING_HATCH = [...style("exploding").hatch.rgb, 255];

function matrixOf(values, classes) {
  const rows = values.length;
  const columns = values[0].length;
  return {
    rows, columns, classNames: CLASS_NAMES,
    values: Float32Array.from(values.flat()),
    classes: Uint8Array.from(classes.flat().map((name) => VOCABULARY.classCode(name))),
  };
}

function pixel(pixels, width, x, y) {
  return [...pixels.slice((y * width + x) * 4, (y * width + x) * 4 + 4)];
}

test("healthy cells get the colour of their value; big cells fill their pixels", () => {
  const matrix = matrixOf([[1e-3, 1]], [["ok", "ok"]]);
  const scale = makeScale([1e-3, 1], "log");
  const pixels = rasterize(matrix, scale, 4, 2, PAINTS);
  const low = [...viridis(scale.position(1e-3)), 255];
  const high = [...viridis(scale.position(1)), 255];
  for (const y of [0, 1]) {
    assert.deepEqual(pixel(pixels, 4, 0, y), low);
    assert.deepEqual(pixel(pixels, 4, 1, y), low);
    assert.deepEqual(pixel(pixels, 4, 3, y), high);
  }
});

test("filled classes take their fill, empty ones stay empty, hatched ones are striped", () => {
  const matrix = matrixOf([[NaN, 1, 1e-9, 1e6]], [["missing", "nonfinite", "vanishing", "exploding"]]);
  const scale = makeScale([1, 1e-9, 1e6], "log");
  const size = 8;
  const pixels = rasterize(matrix, scale, 4 * size, size, PAINTS);
  assert.deepEqual(pixel(pixels, 4 * size, 3, 3), [0, 0, 0, 0]);
  assert.deepEqual(pixel(pixels, 4 * size, size + 3, 3), NONFINITE);
  const colours = (column) => {
    const seen = new Set();
    for (let y = 0; y < size; y++) {
      for (let x = column * size; x < (column + 1) * size; x++) seen.add(pixel(pixels, 4 * size, x, y).join());
    }
    return seen;
  };
  assert.ok(colours(2).has(VANISHING_HATCH.join()));
  assert.ok(colours(2).size === 2, "vanishing: its colour plus the hatch");
  assert.ok(colours(3).has(EXPLODING_HATCH.join()));
  assert.ok(!colours(3).has(VANISHING_HATCH.join()));
});

test("hatch stripes run as CSS draws the same angle", () => {
  // -45deg: "/" stripes, (x + y) constant; 45deg: "\" stripes, (x - y) constant.
  const [vanishing, exploding] = ["vanishing", "exploding"].map((name) => PAINTS[VOCABULARY.classCode(name)].hatch);
  assert.deepEqual([vanishing.dx, vanishing.dy], [-1, -1]);
  assert.deepEqual([exploding.dx, exploding.dy], [1, -1]);
  const pixels = rasterize(matrixOf([[1e-9]], [["vanishing"]]), makeScale([1e-9], "log"), 8, 8, PAINTS);
  for (let y = 0; y < 8; y++) {
    for (let x = 0; x < 8; x++) {
      assert.equal(pixel(pixels, 8, x, y).join() === VANISHING_HATCH.join(), (x + y) % 4 === 0, `${x},${y}`);
    }
  }
});

test("a pixel covering many rows and columns shows the worst cell", () => {
  const rows = 1000;
  const columns = 1000;
  const values = Array.from({ length: rows }, () => new Array(columns).fill(0.5));
  const classes = Array.from({ length: rows }, () => new Array(columns).fill("ok"));
  values[517][733] = NaN;
  classes[517][733] = "nonfinite";
  const matrix = matrixOf(values, classes);
  const pixels = rasterize(matrix, makeScale([0.5], "log"), 100, 100, PAINTS);
  assert.deepEqual(pixel(pixels, 100, 73, 51), NONFINITE);
  let filled = 0;
  for (let i = 0; i < pixels.length; i += 4) if (pixels[i] === NONFINITE[0] && pixels[i + 1] === NONFINITE[1]) filled++;
  assert.equal(filled, 1);
});

test("merged cells keep their class's extreme value", () => {
  // Pixel 1 of 2 covers columns 1 and 2, off the stripes: vanishing keeps the smaller value,
  // exploding the larger, ok the first.
  const scale = makeScale([1e-6, 1e6], "log");
  const second = (values, name) =>
    pixel(rasterize(matrixOf([values], [values.map(() => name)]), scale, 2, 1, PAINTS), 2, 1, 0);
  const colour = (value) => [...viridis(Math.round(scale.position(value) * 255) / 255), 255]; // 256 levels
  assert.deepEqual(second([1, 1e-4, 1e-6], "vanishing"), colour(1e-6));
  assert.deepEqual(second([1, 1e4, 1e6], "exploding"), colour(1e6));
  assert.deepEqual(second([1, 1e4, 1e6], "ok"), colour(1e4));
});

test("an empty matrix draws nothing", () => {
  const pixels = rasterize({ rows: 0, columns: 0, classNames: CLASS_NAMES }, makeScale([], "log"), 3, 3, PAINTS);
  assert.ok(pixels.every((v) => v === 0));
});

test("a cell without a value (a stat not logged at a norms-only step) stays empty", () => {
  const matrix = matrixOf([[NaN, 1]], [["ok", "ok"]]);
  const pixels = rasterize(matrix, makeScale([1e-3, 1], "log"), 2, 1, PAINTS);
  assert.deepEqual(pixel(pixels, 2, 0, 0), [0, 0, 0, 0]);
  assert.equal(pixel(pixels, 2, 1, 0)[3], 255);
});

test("a pixel merging steps with and without a value shows the value", () => {
  // Zoomed out: the norms-only steps between full ones must not blank the column.
  const matrix = matrixOf([[NaN, NaN, 0.5, NaN]], [["ok", "ok", "ok", "ok"]]);
  const scale = makeScale([1e-3, 1], "log");
  const merged = rasterize(matrix, scale, 1, 1, PAINTS);
  const alone = rasterize(matrixOf([[0.5]], [["ok"]]), scale, 1, 1, PAINTS);
  assert.deepEqual(pixel(merged, 1, 0, 0), pixel(alone, 1, 0, 0));
});
