// The heatmap's pixels (pure, no DOM): matrix + scale -> RGBA, ready for `putImageData`.
//
// When several cells fall on one pixel (more rows or columns than pixels), the pixel shows the
// worst of them, as the backend does when it merges steps: one exploding cell among thousands
// still colours its pixel.

import { CLASS_COLORS, colorTable } from "./colormap.js";

const LEVELS = 256;
const TABLE = colorTable(LEVELS);
const HATCH_SPACING = 4; // device pixels between hatch lines

/** Class codes by name for a decoded matrix's `classNames`. */
function codes(classNames) {
  return Object.fromEntries(classNames.map((name, code) => [name, code]));
}

// Folds cells into one representative: the worst class (the backend's order, analysis.CLASSES:
// a larger code is worse) and, among cells of that class, the most extreme value (max when
// exploding or non-finite, min when vanishing, the first one otherwise).
function makeFolder(code) {
  const keepLargest = new Set([code.exploding, code.nonfinite]);
  return function fold(state, cls, value) {
    if (cls > state.cls) {
      state.cls = cls;
      state.value = value;
    } else if (cls === state.cls) {
      if (keepLargest.has(cls) ? value > state.value : cls === code.vanishing && value < state.value) {
        state.value = value;
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
 * drawn with `scale` (colormap.makeScale) into a width x height plot area.
 */
export function rasterize(matrix, scale, width, height) {
  const pixels = new Uint8ClampedArray(width * height * 4);
  const { rows, columns } = matrix;
  if (!rows || !columns || !width || !height) return pixels;
  const code = codes(matrix.classNames);
  const fold = makeFolder(code);
  const bandClass = new Int16Array(columns);
  const bandValue = new Float64Array(columns);
  const columnSpans = Array.from({ length: width }, (_, x) => cellSpan(x, width, columns));
  const pixelClass = new Int16Array(width);
  const rowColors = new Uint8ClampedArray(width * 4); // one pixel row of the current band
  const hatched = []; // x of the band's vanishing / exploding pixels
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
        const cls = state.cls;
        pixelClass[x] = cls;
        if (cls === code.missing) continue; // transparent: the empty background shows
        if (cls === code.nonfinite) {
          rowColors.set(CLASS_COLORS.nonfinite, x * 4);
        } else {
          const t = scale.position(state.value);
          const level = (Number.isNaN(t) ? 0 : Math.round(t * (LEVELS - 1))) * 4;
          rowColors[x * 4] = TABLE[level];
          rowColors[x * 4 + 1] = TABLE[level + 1];
          rowColors[x * 4 + 2] = TABLE[level + 2];
          if (cls === code.vanishing || cls === code.exploding) hatched.push(x);
        }
        rowColors[x * 4 + 3] = 255;
      }
    }
    pixels.set(rowColors, y * width * 4);
    for (const x of hatched) {
      if (pixelClass[x] === code.vanishing ? (x + y) % HATCH_SPACING === 0
        : (x - y + height * HATCH_SPACING) % HATCH_SPACING === 0) {
        const hatch = pixelClass[x] === code.vanishing ? CLASS_COLORS.vanishingHatch : CLASS_COLORS.explodingHatch;
        pixels.set(hatch, (y * width + x) * 4);
      }
    }
  }
  return pixels;
}
