import assert from "node:assert/strict";
import { test } from "node:test";

import { CLASS_COLORS, makeScale, viridis } from "../colormap.js";
import { rasterize } from "../raster.js";

const NAMES = ["missing", "ok", "vanishing", "exploding", "nonfinite"];

function matrixOf(values, classes) {
  const rows = values.length;
  const columns = values[0].length;
  const code = Object.fromEntries(NAMES.map((n, i) => [n, i]));
  return {
    rows, columns, classNames: NAMES,
    values: Float32Array.from(values.flat()),
    classes: Uint8Array.from(classes.flat().map((n) => code[n])),
  };
}

function pixel(pixels, width, x, y) {
  return [...pixels.slice((y * width + x) * 4, (y * width + x) * 4 + 4)];
}

test("healthy cells get the colour of their value; big cells fill their pixels", () => {
  const matrix = matrixOf([[1e-3, 1]], [["ok", "ok"]]);
  const scale = makeScale([1e-3, 1], "l2_norm");
  const pixels = rasterize(matrix, scale, 4, 2);
  const low = [...viridis(scale.position(1e-3)), 255];
  const high = [...viridis(scale.position(1)), 255];
  for (const y of [0, 1]) {
    assert.deepEqual(pixel(pixels, 4, 0, y), low);
    assert.deepEqual(pixel(pixels, 4, 1, y), low);
    assert.deepEqual(pixel(pixels, 4, 3, y), high);
  }
});

test("non-finite cells are solid red, missing ones empty, flagged ones hatched", () => {
  const matrix = matrixOf([[NaN, 1, 1e-9, 1e6]], [["missing", "nonfinite", "vanishing", "exploding"]]);
  const scale = makeScale([1, 1e-9, 1e6], "l2_norm");
  const size = 8;
  const pixels = rasterize(matrix, scale, 4 * size, size);
  assert.deepEqual(pixel(pixels, 4 * size, 3, 3), [0, 0, 0, 0]);
  assert.deepEqual(pixel(pixels, 4 * size, size + 3, 3), [...CLASS_COLORS.nonfinite, 255]);
  const colours = (column) => {
    const seen = new Set();
    for (let y = 0; y < size; y++) {
      for (let x = column * size; x < (column + 1) * size; x++) seen.add(pixel(pixels, 4 * size, x, y).join());
    }
    return seen;
  };
  assert.ok(colours(2).has([...CLASS_COLORS.vanishingHatch, 255].join()));
  assert.ok(colours(2).size === 2, "vanishing: its colour plus the hatch");
  assert.ok(colours(3).has([...CLASS_COLORS.explodingHatch, 255].join()));
  assert.ok(!colours(3).has([...CLASS_COLORS.vanishingHatch, 255].join()));
});

test("a pixel covering many rows and columns shows the worst cell", () => {
  const rows = 1000;
  const columns = 1000;
  const values = Array.from({ length: rows }, () => new Array(columns).fill(0.5));
  const classes = Array.from({ length: rows }, () => new Array(columns).fill("ok"));
  values[517][733] = NaN;
  classes[517][733] = "nonfinite";
  const matrix = matrixOf(values, classes);
  const pixels = rasterize(matrix, makeScale([0.5], "l2_norm"), 100, 100);
  assert.deepEqual(pixel(pixels, 100, 73, 51), [...CLASS_COLORS.nonfinite, 255]);
  let red = 0;
  for (let i = 0; i < pixels.length; i += 4) if (pixels[i] === 255 && pixels[i + 1] === 45) red++;
  assert.equal(red, 1);
});

test("an empty matrix draws nothing", () => {
  const pixels = rasterize({ rows: 0, columns: 0, classNames: NAMES }, makeScale([], "l2_norm"), 3, 3);
  assert.ok(pixels.every((v) => v === 0));
});
