// The toolbar's kinds of control, built once and updated in place: a labelled picker (<select>)
// and a group of segmented buttons. Rebuilt on every load, a picker the user had open closed
// under the pointer and a focused control lost the keyboard's focus; updated in place, only what
// differs changes and both stay.

import { el, setAttributes } from "./dom.js";

export class Picker {
  /** A <select> labelled `label`; `onPick(value)` when the user picks an option. */
  constructor(label, testid, onPick) {
    this.select = el("select", { "data-testid": testid, onchange: (event) => onPick(event.target.value) });
    this.root = el("label", {}, label, this.select);
  }

  /**
   * Offers `options` ([value, text], in order) with `value` picked (the first when `value` is not
   * offered); `title` is the label's hover text, or null. The options are replaced only when they
   * differ from those offered.
   */
  show(options, value, title = null) {
    const offered = [...this.select.options].map((option) => [option.value, option.textContent]);
    if (JSON.stringify(offered) !== JSON.stringify(options)) {
      this.select.replaceChildren(...options.map(([optionValue, text]) => el("option", { value: optionValue }, text)));
    }
    if (this.select.value !== value) this.select.value = value;
    if (this.select.selectedIndex < 0 && options.length) this.select.selectedIndex = 0;
    setAttributes(this.root, { title });
  }
}

export class Segmented {
  /**
   * Buttons for `options` ([value, text, attributes]) in a group labelled `label`; `onPick(value)`
   * when one is clicked.
   */
  constructor(label, options, onPick) {
    this.buttons = new Map(options.map(([value, text, attributes = {}]) => [value,
      el("button", { type: "button", ...attributes, onclick: () => onPick(value) }, text)]));
    this.root = el("div", { class: "segmented", role: "group", "aria-label": label }, [...this.buttons.values()]);
  }

  /**
   * Presses the button of `pressed`; `attributes(value)` gives each button's attributes that
   * change with the view (`{title, disabled}`: null or false removes one).
   */
  show(pressed, attributes = () => ({})) {
    for (const [value, button] of this.buttons) {
      setAttributes(button, { "aria-pressed": String(value === pressed), ...attributes(value) });
    }
  }
}
