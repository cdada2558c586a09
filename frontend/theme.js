// Which theme the tab wears (pure, no DOM): TensorBoard's own. Its page marks dark mode with a
// `dark-mode` class on its body, whether the user picked Dark in its theme menu or left it on
// "Browser default" in a dark browser; the tab, in a frame of that page, follows the class. Opened
// on its own (no TensorBoard page around it), the tab follows the browser.

export const HOST_DARK_CLASS = "dark-mode";

/**
 * "dark" or "light": by `hostClasses`, the class names on TensorBoard's body (null when the tab
 * has no TensorBoard page around it, or cannot read it), else by `prefersDark`, whether the
 * browser asks for a dark colour scheme.
 */
export function themeOf({ hostClasses, prefersDark }) {
  const dark = hostClasses ? hostClasses.includes(HOST_DARK_CLASS) : prefersDark;
  return dark ? "dark" : "light";
}
