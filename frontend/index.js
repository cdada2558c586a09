// The Gradients tab's entry point: TensorBoard imports this module in the plugin's iframe and
// calls render().

import { App } from "./app.js";

export async function render() {
  const style = document.createElement("link");
  style.rel = "stylesheet";
  style.href = "static/style.css";
  document.head.append(style);
  const root = document.createElement("div");
  document.body.append(root);
  const app = new App(root);
  window.gradientsApp = app; // for debugging and the browser tests
  await app.start();
}
