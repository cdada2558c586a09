// The tab's timers, each under a name: setting one again replaces it (never two polls, two
// hover pauses or two loss waits at once), and `stop` clears them all when the tab goes, after
// which none starts. Pure but for the clock it is given (the browser's by default).

export class Timers {
  /** `clock`: setTimeout, clearTimeout, setInterval and clearInterval (the tests' fake clock). */
  constructor(clock = globalThis) {
    this.clock = clock;
    this.live = new Map(); // name -> {id, clear, cleared}
    this.stopped = false;
  }

  /** Calls `fn` once after `ms`, in place of the timer named `name`. */
  after(name, ms, fn) {
    this.#start(name, ms, fn, "Timeout");
  }

  /** Calls `fn` every `ms`, in place of the timer named `name`. */
  every(name, ms, fn) {
    this.#start(name, ms, fn, "Interval");
  }

  /**
   * Resolves after `ms`, or at once when the timer named `name` is replaced or cleared: a newer
   * wait took over, or the tab stopped, and whoever waited should go on to find that out.
   */
  wait(name, ms) {
    return new Promise((resolve) => this.#start(name, ms, resolve, "Timeout", resolve));
  }

  /** Clears the timer named `name`, if any. */
  clear(name) {
    const timer = this.live.get(name);
    if (!timer) return;
    this.live.delete(name);
    timer.clear();
    timer.cleared();
  }

  /** Clears every timer and starts none from now on (the tab is torn down). */
  stop() {
    this.stopped = true;
    for (const name of [...this.live.keys()]) this.clear(name);
  }

  /** The names of the timers still to fire. */
  names() {
    return [...this.live.keys()];
  }

  #start(name, ms, fn, kind, cleared = () => {}) {
    this.clear(name);
    if (this.stopped) {
      cleared();
      return;
    }
    const timer = { cleared };
    const fire = () => {
      if (kind === "Timeout") this.live.delete(name);
      fn();
    };
    const id = this.clock[`set${kind}`](fire, ms);
    timer.clear = () => this.clock[`clear${kind}`](id);
    this.live.set(name, timer);
  }
}
