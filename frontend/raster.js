// The heatmap's pixels (pure, no DOM): matrix + scale -> RGBA, ready for `putImageData`.
//
// When several cells fall on one pixel (more rows or columns than pixels), the pixel shows the
// worst of them, as the backend does when it merges steps: one alarming cell among thousands
// still colours its pixel. What each class looks like comes from the vocabulary (`classPaints`).

import { colorTable } from "./colormap.js";

const LEVELS = 256;
const TABLE = colorTable(LEVELS);
const HATCH_SPACING = 4; // device pixels between hatch lines

/**
 * How to paint each class, indexed by class code, from the vocabulary's classes (in their
 * worse-is-later order, which `decodeHeatmap` gives the codes): `empty` (left transparent),
 * `fill` (RGB replacing the value's colour), `hatch` (`{rgb, dx, dy}`: pixel (x, y) is on a
 * stripe when `(x * dx + y * dy) % HATCH_SPACING === 0`, the stripes CSS draws for the same
 * `angle` in a repeating-linear-gradient, at multiples of 45 degrees), `extreme` (+1: a merged
 * cell keeps the largest value of the class, -1 the smallest, 0 the first).
 */
export function classPaints(classes) {
  return classes.map((cls) => {
    const radians = ((cls.hatch ? cls.hatch.angle : 0) * Math.PI) / 180;
    return {
      empty: Boolean(cls.empty),
      fill: cls.fill || null,
      // The stripes run across the gradient's direction (sin a, -cos a) in screen coordinates.
      hatch: cls.hatch ? { rgb: cls.hatch.rgb, dx: Math.round(Math.sin(radians)), dy: Math.round(-Math.cos(radians)) } : null,
      extreme: { high: 1, low: -1 }[cls.extreme] || 0,
    };
  });
}

/**
 * `fold(state, cls, value, at)` folds cells into one representative, `state` ({cls, value, at}
 * starting at {cls: -1}): the worst class (the larger code) and, among cells of that class, its
 * most extreme value; `at` (optional) is where that cell is. The heatmap's pixels and the details
 * of a merged cell pick the same cell by it.
 */
export function makeFolder(paints) {
  const extreme = Int8Array.from(paints, (paint) => paint.extreme);
  return function fold(state, cls, value, at) {
    if (cls > state.cls) {
      state.cls = cls;
      state.value = value;
      state.at = at;
    } else if (cls === state.cls) {
      // A value beats none (a stat not logged at a norms-only step): NaN never compares.
      const better = Number.isNaN(state.value) ? !Number.isNaN(value)
        : extreme[cls] > 0 ? value > state.value : extreme[cls] < 0 && value < state.value;
      if (better) {
        state.value = value;
        state.at = at;
      }
    }
  };
}

// The representative (class, value) of each column over rows [firstRow, endRow).
function reduceBand(matrix, firstRow, endRow, fold, outClass, outValue) {
  const { columns, values, classes } = matrix;
  const state = { cls: -1, value: NaN };
  for (let c = 0; c < columns; c++) {
    state.cls = -1;
    state.value = NaN;
    for (let r = firstRow; r < endRow; r++) fold(state, classes[r * columns + c], values[r * columns + c]);
    outClass[c] = state.cls;
    outValue[c] = state.value;
  }
}

/** [first, end) of the cells a pixel covers: at least one, all of them over the pixels. */
function cellSpan(pixel, pixels, cells) {
  const first = Math.min(cells - 1, Math.floor((pixel * cells) / pixels));
  return [first, Math.max(first + 1, Math.min(cells, Math.floor(((pixel + 1) * cells) / pixels)))];
}

/**
 * RGBA pixels (`Uint8ClampedArray`, width x height x 4) of a decoded matrix (see decode.js)
 * drawn with `scale` (colormap.makeScale) and `paints` (classPaints) into a width x height plot.
 */
export function rasterize(matrix, scale, width, height, paints) {
  const pixels = new Uint8ClampedArray(width * height * 4);
  const { rows, columns } = matrix;
  if (!rows || !columns || !width || !height) return pixels;
  const fold = makeFolder(paints);
  const bandClass = new Int16Array(columns);
  const bandValue = new Float64Array(columns);
  const columnSpans = Array.from({ length: width }, (_, x) => cellSpan(x, width, columns));
  const pixelClass = new Int16Array(width);
  const rowColors = new Uint8ClampedArray(width * 4); // one pixel row of the current band
  const hatched = []; // x of the band's hatched pixels
  const state = { cls: -1, value: NaN };
  let previousBand = "";
  for (let y = 0; y < height; y++) {
    const [firstRow, endRow] = cellSpan(y, height, rows);
    if (`${firstRow}:${endRow}` !== previousBand) {
      previousBand = `${firstRow}:${endRow}`;
      reduceBand(matrix, firstRow, endRow, fold, bandClass, bandValue);
      hatched.length = 0;
      rowColors.fill(0);
      for (let x = 0; x < width; x++) {
        state.cls = -1;
        state.value = NaN;
        const [firstColumn, endColumn] = columnSpans[x];
        for (let c = firstColumn; c < endColumn; c++) fold(state, bandClass[c], bandValue[c]);
        const paint = paints[state.cls];
        pixelClass[x] = state.cls;
        // Transparent: the empty background shows; so does a cell coloured by a value it lacks
        // (a stat not logged at that norms-only step).
        if (paint.empty || (!paint.fill && Number.isNaN(state.value))) continue;
        if (paint.fill) {
          rowColors.set(paint.fill, x * 4);
        } else {
          const t = scale.position(state.value);
          const level = (Number.isNaN(t) ? 0 : Math.round(t * (LEVELS - 1))) * 4;
          rowColors[x * 4] = TABLE[level];
          rowColors[x * 4 + 1] = TABLE[level + 1];
          rowColors[x * 4 + 2] = TABLE[level + 2];
        }
        if (paint.hatch) hatched.push(x);
        rowColors[x * 4 + 3] = 255;
      }
    }
    pixels.set(rowColors, y * width * 4);
    for (const x of hatched) {
      const { hatch } = paints[pixelClass[x]];
      if ((x * hatch.dx + y * hatch.dy) % HATCH_SPACING === 0) pixels.set(hatch.rgb, (y * width + x) * 4);
    }
  }
  return pixels;
}
