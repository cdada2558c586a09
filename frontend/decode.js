// Turning the plugin's JSON into typed arrays (pure, no DOM).

const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

/** A number from the plugin's JSON: TensorBoard sends NaN/Inf as the strings "NaN"/"Infinity". */
export function toNumber(value) {
  if (typeof value === "number") return value;
  if (value === null || value === undefined) return NaN;
  return value in NON_FINITE ? NON_FINITE[value] : Number(value);
}

function base64Bytes(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/**
 * The `heatmap` route's answer as a matrix: `values` (Float32Array) and `classes` (Uint8Array,
 * indexes into `classNames`), row-major `[rows][columns]`, from either encoding. The codes are
 * those of `vocabulary` (worse is later, see vocabulary.js), whatever order the answer used.
 */
export function decodeHeatmap(body, vocabulary) {
  const rows = body.variables.length;
  const columns = body.steps.length;
  const classNames = vocabulary.classNames;
  let values;
  let classes;
  if (body.encoding === "base64") {
    const [shapeRows, shapeColumns] = body.shape;
    if (shapeRows !== rows || shapeColumns !== columns) {
      throw new Error(`heatmap shape ${body.shape} does not match ${rows} rows x ${columns} columns`);
    }
    const valueBytes = base64Bytes(body.values);
    if (valueBytes.length !== rows * columns * 4) throw new Error("heatmap values do not fill its rows x columns");
    values = new Float32Array(rows * columns);
    const view = new DataView(valueBytes.buffer); // little-endian whatever the machine
    for (let i = 0; i < values.length; i++) values[i] = view.getFloat32(i * 4, true);
    classes = base64Bytes(body.classes);
    const codes = body.class_names.map((name) => vocabulary.classCode(name));
    if (codes.some((code, i) => code !== i)) {
      for (let i = 0; i < classes.length; i++) classes[i] = codes[classes[i]];
    }
  } else {
    const fits = (matrix) => matrix.length === rows && matrix.every((row) => row.length === columns);
    if (!fits(body.values) || !fits(body.classes)) {
      throw new Error("heatmap values do not fill its rows x columns");
    }
    values = new Float32Array(rows * columns);
    classes = new Uint8Array(rows * columns);
    body.values.forEach((row, r) => row.forEach((v, c) => { values[r * columns + c] = toNumber(v); }));
    body.classes.forEach((row, r) => row.forEach((name, c) => {
      classes[r * columns + c] = vocabulary.classCode(name);
    }));
  }
  if (classes.length !== rows * columns) throw new Error("heatmap classes do not fill its rows x columns");
  return {
    run: body.run,
    tag: body.tag,
    stat: body.stat,
    rows,
    columns,
    rowsBy: body.rows, // "variables", or "layers": then `variables` and `layers` are the layer names
    variables: body.variables,
    layers: body.layers,
    steps: body.steps,
    lastSteps: body.last_steps || body.steps,
    wallTimes: body.wall_times.map(toNumber),
    values,
    classes,
    classNames,
    epochs: body.epochs,
    epochIndex: body.epoch_index || null,
    downsampled: Boolean(body.downsampled),
    sampled: body.sampled || null,
    stepsToRead: body.steps_to_read || 0, // of a long run the plugin is still reading
    damaged: body.damaged || 0, // logged steps left out as damaged; `damage` says why
    damage: body.damage || [],
    value(row, column) { return values[row * columns + column]; },
    className(row, column) { return classNames[classes[row * columns + column]]; },
  };
}
