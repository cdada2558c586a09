// Geometry of the heatmap and its charts (pure, no DOM): which cell is under a pixel, where rows
// and layer groups sit, which column holds a step and where on the axis it is, ticks, ranges.

/**
 * Row and column placement of a `rows` x `columns` matrix in a `width` x `height` plot area.
 * Cells may be fractions of a pixel (1,000 rows in 600 px): `cellAt` and `rowRange` map both ways.
 */
export function gridLayout(rows, columns, width, height) {
  const rowHeight = rows ? height / rows : 0;
  const columnWidth = columns ? width / columns : 0;
  return {
    rows,
    columns,
    width,
    height,
    rowHeight,
    columnWidth,
    /** The [row, column] under plot-area pixel (x, y), or null outside the matrix. */
    cellAt(x, y) {
      if (x < 0 || y < 0 || x >= width || y >= height || !rows || !columns) return null;
      return [Math.min(rows - 1, Math.floor(y / rowHeight)), Math.min(columns - 1, Math.floor(x / columnWidth))];
    },
    /** Top and bottom pixel of a row. */
    rowRange(row) {
      return [row * rowHeight, (row + 1) * rowHeight];
    },
    /** Left and right pixel of a column. */
    columnRange(column) {
      return [column * columnWidth, (column + 1) * columnWidth];
    },
  };
}

/** Consecutive rows of the same layer: [{layer, first, last}] in row order. */
export function layerGroups(layers) {
  const groups = [];
  layers.forEach((layer, row) => {
    const current = groups[groups.length - 1];
    if (current && current.layer === layer) current.last = row;
    else groups.push({ layer, first: row, last: row });
  });
  return groups;
}

/** The column holding `step` given each column's first and last step (-1 if none). */
export function columnOfStep(firstSteps, lastSteps, step) {
  let low = 0;
  let high = firstSteps.length - 1;
  while (low <= high) {
    const middle = (low + high) >> 1;
    if (step < firstSteps[middle]) high = middle - 1;
    else if (step > lastSteps[middle]) low = middle + 1;
    else return middle;
  }
  return -1;
}

/**
 * The columns that hold steps of [firstStep, lastStep]: [first, last] column, or null when none
 * does (the range lies outside the columns shown, or between two of them).
 */
export function columnSpan(firstSteps, lastSteps, firstStep, lastStep) {
  let first = 0;
  while (first < firstSteps.length && lastSteps[first] < firstStep) first += 1;
  let last = firstSteps.length - 1;
  while (last >= 0 && firstSteps[last] > lastStep) last -= 1;
  return first <= last ? [first, last] : null;
}

/** The x of `step` on a step axis laid out by `grid`: inside its column, by its place in the
 * column's step range (null when no column holds it). */
export function stepX(firstSteps, lastSteps, step, grid) {
  const column = columnOfStep(firstSteps, lastSteps, step);
  if (column < 0) return null;
  const [left, right] = grid.columnRange(column);
  const span = Math.max(1, lastSteps[column] - firstSteps[column] + 1);
  return left + ((step - firstSteps[column] + 0.5) / span) * (right - left);
}

/**
 * The mean of the finite values of `points` ([[step, value]], any order) in each column of the
 * epoch axis, whose column c starts at step `columnStarts[c]` (its epoch's first step, ascending)
 * and runs up to the next column's start: [{column, value}] in column order, a column without a
 * finite value left out. Steps before the first column join it, as the plugin's epoch columns
 * take the steps logged before the first epoch mark.
 */
export function columnMeans(points, columnStarts) {
  const sums = new Float64Array(columnStarts.length);
  const counts = new Uint32Array(columnStarts.length);
  for (const [step, value] of points) {
    if (!Number.isFinite(value) || !columnStarts.length) continue;
    let low = 0;
    let high = columnStarts.length - 1;
    while (low < high) { // the last column starting at or before `step`, else the first
      const middle = (low + high + 1) >> 1;
      if (columnStarts[middle] <= step) low = middle;
      else high = middle - 1;
    }
    sums[low] += value;
    counts[low] += 1;
  }
  return Array.from(counts, (count, column) => ({ column, value: sums[column] / count }))
    .filter(({ column }) => counts[column] > 0);
}

/** The index of the step nearest to `step` in a sorted array of steps. */
export function nearestIndex(steps, step) {
  let best = 0;
  for (let i = 1; i < steps.length; i++) {
    if (Math.abs(steps[i] - step) < Math.abs(steps[best] - step)) best = i;
  }
  return best;
}

/** Evenly spaced "nice" tick values (1, 2, 5 x 10^k) covering [low, high], at most ~`count`. */
export function niceTicks(low, high, count = 6) {
  if (!(high > low)) return [low];
  const raw = (high - low) / Math.max(1, count);
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
  const ticks = [];
  for (let v = Math.ceil(low / step) * step; v <= high + step * 1e-9; v += step) {
    ticks.push(Number(v.toPrecision(12)));
  }
  return ticks;
}

/**
 * The y range of a series chart: the data's, widened to show a threshold line only when the
 * line lies within `reach` (decades on a log axis) of the data. A far threshold (a vanishing
 * layer at 1e-9 against an exploding ceiling at 1e3) would flatten the data to a line; the
 * cell's class already says which side of it the data is. `lines`: values on the same axis.
 * Returns [low, high, the lines inside] or null when there is no data.
 */
export function chartRange(values, lines, reach = 2) {
  if (!values.length) return null;
  let low = Math.min(...values);
  let high = Math.max(...values);
  const shown = lines.filter((line) => line >= low - reach && line <= high + reach);
  for (const line of shown) [low, high] = [Math.min(low, line), Math.max(high, line)];
  if (high - low < 1e-9) [low, high] = [low - 0.5, high + 0.5];
  return [low, high, shown];
}

// A chart of positive values spanning more than this many decades gets a log axis: a diverging
// loss (2.1 to 4.9e16) is otherwise a flat line with a jump at its end.
const LOG_AXIS_DECADES = 2;

/**
 * The y scale of a chart of `values` (finite numbers, at least one): log10 when every value is
 * positive and they span more than `LOG_AXIS_DECADES` decades, else linear. Returns
 * {log, low, high, position(value)}: `position` runs from 0 at `low` (the smallest value) to 1
 * at `high` (the largest), 0.5 for all of them when they are equal.
 */
export function valueScale(values) {
  const low = values.reduce((a, b) => Math.min(a, b), Infinity);
  const high = values.reduce((a, b) => Math.max(a, b), -Infinity);
  const log = low > 0 && Math.log10(high / low) > LOG_AXIS_DECADES;
  const transform = log ? Math.log10 : (value) => value;
  const [bottom, top] = [transform(low), transform(high)];
  return {
    log, low, high,
    position: (value) => (top > bottom ? (transform(value) - bottom) / (top - bottom) : 0.5),
  };
}
