// The Gradients tab's entry point: TensorBoard imports this module in the plugin's iframe and
// calls render(). The tab wears TensorBoard's theme (theme.js) from its first paint on, and
// changes with it.

import { App } from "./app.js";
import { themeOf } from "./theme.js";

export async function render() {
  const root = document.createElement("div");
  const app = new App(root);
  followTheme((theme) => {
    document.documentElement.dataset.theme = theme;
    app.themeChanged();
  });
  const style = document.createElement("link");
  style.rel = "stylesheet";
  style.href = "static/style.css";
  document.head.append(style);
  document.body.append(root);
  window.gradientsApp = app; // for debugging and the browser tests
  // The frame goes for good (TensorBoard closed or navigated away): nothing the tab started runs
  // on. A frame kept for the back button (`persisted`) keeps its timers, paused by the browser.
  window.addEventListener("pagehide", (event) => {
    if (!event.persisted) app.stop();
  });
  await app.start();
}

/**
 * Calls `apply(theme)` now and whenever the theme changes: TensorBoard's body class (its theme
 * menu) when the tab is in its frame, the browser's colour scheme otherwise.
 */
function followTheme(apply) {
  const browserDark = window.matchMedia("(prefers-color-scheme: dark)");
  const host = hostBody();
  const update = () => apply(themeOf({
    hostClasses: host ? [...host.classList] : null, prefersDark: browserDark.matches,
  }));
  browserDark.addEventListener("change", update);
  if (host) new MutationObserver(update).observe(host, { attributes: true, attributeFilter: ["class"] });
  update();
}

// TensorBoard's body around the tab's frame, or null: the tab opened alone, or framed by a page
// of another origin (which it may not read).
function hostBody() {
  try {
    return window.parent !== window ? window.parent.document.body : null;
  } catch {
    return null;
  }
}
