// The vocabulary exactly as the plugin serves it (`thresholds` route, "vocabulary"): a copy of
// tensorboard_gradients/server/vocabulary.py's answer in served_vocabulary.json, which a Python
// test (tests/test_plugin_routes.py) keeps equal to the served one, so these tests can never
// drift from the backend. The tests build the tab's `Vocabulary` from it.

import { readFileSync } from "node:fs";

import { Vocabulary } from "../vocabulary.js";

export const SERVED = Object.freeze(
  JSON.parse(readFileSync(new URL("./served_vocabulary.json", import.meta.url), "utf8")),
);

export const VOCABULARY = new Vocabulary(SERVED);
export const CLASS_NAMES = SERVED.classes.map((cls) => cls.name);
