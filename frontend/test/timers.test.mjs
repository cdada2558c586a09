import assert from "node:assert/strict";
import { test } from "node:test";

import { Timers } from "../timers.js";

/** A clock that runs nothing by itself: `tick(ms)` fires what is due, in order. */
function fakeClock() {
  let now = 0;
  let nextId = 1;
  const pending = new Map(); // id -> {at, fn, every}
  const add = (every) => (fn, ms) => {
    const id = nextId++;
    pending.set(id, { at: now + ms, fn, every: every ? ms : null });
    return id;
  };
  const remove = (id) => { pending.delete(id); };
  return {
    setTimeout: add(false), setInterval: add(true), clearTimeout: remove, clearInterval: remove,
    pending,
    tick(ms) {
      const end = now + ms;
      for (;;) {
        const due = [...pending].filter(([, t]) => t.at <= end).sort(([, a], [, b]) => a.at - b.at)[0];
        if (!due) break;
        const [id, timer] = due;
        now = timer.at;
        if (timer.every) timer.at += timer.every;
        else pending.delete(id);
        timer.fn();
      }
      now = end;
    },
  };
}

test("a timer set again under its name replaces the first: it fires once", () => {
  const clock = fakeClock();
  const timers = new Timers(clock);
  const fired = [];
  timers.after("poll", 100, () => fired.push("first"));
  timers.after("poll", 100, () => fired.push("second"));
  assert.equal(clock.pending.size, 1);
  clock.tick(500);
  assert.deepEqual(fired, ["second"]);
  assert.deepEqual(timers.names(), [], "a fired timer is no longer live");
});

test("timers of different names run side by side, and a cleared one never fires", () => {
  const clock = fakeClock();
  const timers = new Timers(clock);
  const fired = [];
  timers.after("hover", 150, () => fired.push("hover"));
  timers.after("poll", 100, () => fired.push("poll"));
  assert.deepEqual(timers.names().sort(), ["hover", "poll"]);
  timers.clear("hover");
  timers.clear("nothing by this name");
  clock.tick(1000);
  assert.deepEqual(fired, ["poll"]);
  assert.equal(clock.pending.size, 0);
});

test("a repeating timer fires until cleared, and replacing it leaves one", () => {
  const clock = fakeClock();
  const timers = new Timers(clock);
  let count = 0;
  timers.every("refresh", 30, () => { count += 1; });
  timers.every("refresh", 30, () => { count += 1; });
  clock.tick(100);
  assert.equal(count, 3);
  assert.deepEqual(timers.names(), ["refresh"], "still live between its firings");
  timers.clear("refresh");
  clock.tick(100);
  assert.equal(count, 3);
  assert.equal(clock.pending.size, 0);
});

test("a timer may set itself again when it fires (a poll that goes on)", () => {
  const clock = fakeClock();
  const timers = new Timers(clock);
  let polls = 0;
  const poll = () => {
    polls += 1;
    if (polls < 3) timers.after("poll", 10, poll);
  };
  timers.after("poll", 10, poll);
  clock.tick(100);
  assert.equal(polls, 3);
  assert.deepEqual(timers.names(), []);
});

test("a wait resolves when its time is up, or at once when a newer wait replaces it", async () => {
  const clock = fakeClock();
  const timers = new Timers(clock);
  const order = [];
  const first = timers.wait("loss", 3000).then(() => order.push("first"));
  const second = timers.wait("loss", 3000).then(() => order.push("second"));
  await first;
  assert.deepEqual(order, ["first"], "the replaced wait gave up without its time passing");
  assert.equal(clock.pending.size, 1);
  clock.tick(3000);
  await second;
  assert.deepEqual(order, ["first", "second"]);
  assert.equal(clock.pending.size, 0);
});

test("stopping clears every timer, ends every wait and starts none after", async () => {
  const clock = fakeClock();
  const timers = new Timers(clock);
  const fired = [];
  timers.every("refresh", 30, () => fired.push("refresh"));
  timers.after("poll", 10, () => fired.push("poll"));
  const waited = timers.wait("loss", 3000);
  timers.stop();
  await waited;
  assert.equal(clock.pending.size, 0);
  timers.after("hover", 10, () => fired.push("hover"));
  await timers.wait("loss", 3000); // resolves at once: nothing is waited for on a stopped tab
  clock.tick(1000);
  assert.deepEqual(fired, []);
  assert.deepEqual(timers.names(), []);
  assert.equal(clock.pending.size, 0);
});
