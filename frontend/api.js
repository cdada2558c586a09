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

// Scalars logged once per epoch (Keras' `epoch_loss`, Lightning's `train_loss_epoch`) and
// held-out losses (`val_loss`, the Trainer's `eval/loss`).
const EPOCH_LEVEL = /(^|\/)epoch_|_epoch$/;
const HELD_OUT = /(^|[/_])(val|valid|validation|eval|test)([/_]|$)/;
// Most specific first: a custom loop's `loss` and the Trainer's `train/loss`, Lightning's
// `train_loss` / `train_loss_step`, Keras' `batch_loss`, then any loss.
const PREFERRED = [/(^|\/)loss$/, /(^|[/_])train(ing)?[/_]loss(_step)?$/, /(^|\/)batch_loss$/, /loss/];

/**
 * The run's training-loss scalar tag to draw above the step axis, or null.
 *
 * Only tags logged per optimizer step line up with the heatmap: Keras' `TensorBoard` callback
 * writes `epoch_loss` at the epoch index (0, 1, 2...), which would squeeze the whole curve into
 * the first columns, so an epoch-level tag is never picked; `batch_loss` (written with
 * `update_freq="batch"`), a custom loop's `loss`, Lightning's `train_loss(_step)` and the
 * Trainer's `train/loss` are. A training loss wins over a held-out one (`val_loss`,
 * `eval/loss`), which is drawn only when it is the run's only per-step loss.
 */
export function lossTag(tags) {
  const perStep = tags.filter((tag) => !EPOCH_LEVEL.test(tag));
  const training = perStep.filter((tag) => !HELD_OUT.test(tag));
  for (const candidates of [training, perStep]) {
    for (const pattern of PREFERRED) {
      const found = candidates.find((tag) => pattern.test(tag));
      if (found) return found;
    }
  }
  return null;
}
