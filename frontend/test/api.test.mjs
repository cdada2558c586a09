import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError, getJson, lossTag, routeUrl } from "../api.js";

function fakeFetch(status, text) {
  const calls = [];
  const impl = async (url) => {
    calls.push(url);
    return { ok: status >= 200 && status < 300, status, text: async () => text };
  };
  impl.calls = calls;
  return impl;
}

test("builds relative URLs and parses JSON", async () => {
  const fetchImpl = fakeFetch(200, '{"a": 1}');
  const body = await getJson("heatmap", { run: "a b", tag: "t", skip: null }, fetchImpl);
  assert.deepEqual(body, { a: 1 });
  assert.deepEqual(fetchImpl.calls, ["heatmap?run=a+b&tag=t"]);
  assert.equal(routeUrl("export", { run: "r", format: "csv" }), "export?run=r&format=csv");
});

test("the plugin's error message reaches the user", async () => {
  await assert.rejects(getJson("heatmap", {}, fakeFetch(404, '{"error": "no gradients for run \'x\'"}')),
    (error) => error instanceof ApiError && error.status === 404 && /no gradients/.test(error.message));
  await assert.rejects(getJson("runs", {}, fakeFetch(500, "<html>oops</html>")),
    (error) => error.message === "HTTP 500 for runs");
  await assert.rejects(getJson("runs", {}, fakeFetch(200, "not json")), /did not answer JSON/);
  await assert.rejects(getJson("runs", {}, async () => { throw new Error("offline"); }),
    (error) => error.status === 0 && /did not answer \(offline\)/.test(error.message));
});

test("picks a per-step loss tag, never Keras' per-epoch one", () => {
  assert.equal(lossTag(["epoch_loss", "batch_loss", "epoch_accuracy"]), "batch_loss");
  assert.equal(lossTag(["batch_loss", "loss"]), "loss");
  assert.equal(lossTag(["train/loss", "accuracy"]), "train/loss");
  assert.equal(lossTag(["val_loss_total"]), "val_loss_total");
  assert.equal(lossTag(["epoch_loss", "epoch_accuracy"]), null);
  assert.equal(lossTag([]), null);
  // Hugging Face's Trainer and Lightning: the training loss, not the evaluation or epoch one.
  assert.equal(lossTag(["eval/loss", "train/loss", "train/grad_norm"]), "train/loss");
  assert.equal(lossTag(["train_loss_epoch", "val_loss", "train_loss_step"]), "train_loss_step");
  assert.equal(lossTag(["val_loss", "train_loss"]), "train_loss");
  assert.equal(lossTag(["my_loss", "test_loss"]), "my_loss");
});
