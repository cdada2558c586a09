// The plugin's HTTP routes, relative to the plugin's base URL (TensorBoard serves the tab from
// `data/plugin_entry.html` with `<base href="plugin/gradients/">`, so "runs" is our route and
// "../scalars/..." is the Scalars plugin's, under --path_prefix too).

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

/** GET a route's JSON; an error answer becomes an `ApiError` carrying the plugin's message. */
export async function getJson(route, params = {}, fetchImpl = fetch) {
  const query = new URLSearchParams(
    Object.entries(params).filter(([, v]) => v !== null && v !== undefined),
  ).toString();
  const url = query ? `${route}?${query}` : route;
  let response;
  try {
    response = await fetchImpl(url);
  } catch (error) {
    throw new ApiError(`TensorBoard did not answer (${error.message})`, 0);
  }
  const text = await response.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: reported below
  }
  if (!response.ok) {
    const message = body && body.error ? body.error : `HTTP ${response.status} for ${route}`;
    throw new ApiError(message, response.status);
  }
  if (body === null) throw new ApiError(`${route} did not answer JSON`, response.status);
  return body;
}

/** The URL of a route (for downloads). */
export function routeUrl(route, params = {}) {
  const query = new URLSearchParams(params).toString();
  return query ? `${route}?${query}` : route;
}

/**
 * The run's training-loss scalar tag to draw above the step axis, or null.
 *
 * Only tags logged per optimizer step line up with the heatmap: Keras' `TensorBoard` callback
 * writes `epoch_loss` at the epoch index (0, 1, 2...), which would squeeze the whole curve into
 * the first columns, so it is never picked; `batch_loss` (written with `update_freq="batch"`)
 * and a custom loop's `loss` are.
 */
export function lossTag(tags) {
  const perStep = tags.filter((tag) => !/(^|\/)epoch_/.test(tag));
  const preferred = [/(^|\/)loss$/, /(^|\/)batch_loss$/, /loss/];
  for (const pattern of preferred) {
    const found = perStep.find((tag) => pattern.test(tag));
    if (found) return found;
  }
  return null;
}
