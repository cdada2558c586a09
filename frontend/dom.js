// A tiny DOM builder (and attribute updater), and canvas sizing for sharp drawing at any device
// pixel ratio. Text always goes in as text (variable names come from user models, and
// `<img src=x onerror=...>` must render as those characters), never as HTML.

/** `el("div", {class: "x", onclick: f}, "text", child, ...)`. */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "dataset") Object.assign(node.dataset, value);
    else setAttributes(node, { [name]: value });
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/**
 * Sets `attributes` on an existing node as `el` would on a new one: null, undefined or false
 * removes the attribute (`{title: null, disabled: false}`).
 */
export function setAttributes(node, attributes) {
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) node.removeAttribute(name);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
}

/** Replaces a node's children. */
export function replaceChildren(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

/**
 * Sizes `canvas` to width x height CSS px at `ratio` device pixels per CSS px (its pixels are
 * only reset when that changes) and returns its 2D context, drawing in CSS px.
 */
export function sizeCanvas(canvas, width, height, ratio) {
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  const pixelWidth = Math.round(width * ratio);
  const pixelHeight = Math.round(height * ratio);
  if (canvas.width !== pixelWidth) canvas.width = pixelWidth;
  if (canvas.height !== pixelHeight) canvas.height = pixelHeight;
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  return context;
}
