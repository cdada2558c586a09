import assert from "node:assert/strict";
import { test } from "node:test";

import { themeOf } from "../theme.js";

test("in TensorBoard's frame the tab wears TensorBoard's theme, whatever the browser prefers", () => {
  assert.equal(themeOf({ hostClasses: ["dark-mode"], prefersDark: false }), "dark");
  assert.equal(themeOf({ hostClasses: ["mat-typography", "dark-mode"], prefersDark: false }), "dark");
  // The user picked Light in TensorBoard's menu while the browser is dark.
  assert.equal(themeOf({ hostClasses: [], prefersDark: true }), "light");
  assert.equal(themeOf({ hostClasses: ["mat-typography"], prefersDark: true }), "light");
});

test("opened alone, the tab follows the browser", () => {
  assert.equal(themeOf({ hostClasses: null, prefersDark: true }), "dark");
  assert.equal(themeOf({ hostClasses: null, prefersDark: false }), "light");
});
