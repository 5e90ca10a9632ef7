// One queue for every chart's redraws. Each chart asked to redraw at most every `minIntervalMs`,
// each on its own timer: on a loaded machine (25 charts of ~100 ms each, 2.5 redraws a second)
// the drawing alone took all of the page's main thread, and everything else waited behind it
// (the alerts panel showed a pushed alert 15-38 s late; a screenshot timed out). Here the
// drawing runs in slices of at most `budgetMs`, each followed by at least as long idle
// (`idleRatio` times what it took), so the websocket's messages, fetches and input always get
// their turn; charts in view come first, then the ones that waited longest. Under no load
// nothing changes: every chart still redraws as soon as its interval allows.
//
// Time and timers are passed in (`now`, `setTimer`): the browser tests drive it with a fake clock.

export class RenderQueue {
  constructor({ minIntervalMs = 400, budgetMs = 40, idleRatio = 1, now = () => performance.now(),
    setTimer = (fn, ms) => setTimeout(fn, ms) } = {}) {
    this.minIntervalMs = minIntervalMs;
    this.budgetMs = budgetMs;
    this.idleRatio = idleRatio;
    this.now = now;
    this.setTimer = setTimer;
    this.dirty = new Set(); // charts waiting for a redraw: {render(), lastRender, visible}
    this.timer = null; // the one pending slice
    this.timerAt = null; // when it runs
    this.restUntil = 0; // no slice before this: the idle time owed by the last one
    this.slices = 0;
    this.drawnMs = 0; // time spent drawing, over every slice
  }

  // A chart's data changed (or it came into view): draw it when its interval and the budget allow.
  request(chart) {
    this.dirty.add(chart);
    this.arm();
  }

  forget(chart) { this.dirty.delete(chart); }

  dueAt(chart) { return (chart.lastRender ?? -Infinity) + this.minIntervalMs; }

  // The next slice: when the earliest waiting chart is due, and not before the owed rest.
  arm() {
    if (!this.dirty.size) return;
    let due = Infinity;
    for (const chart of this.dirty) due = Math.min(due, this.dueAt(chart));
    const at = Math.max(due, this.restUntil, this.now());
    if (this.timer !== null && this.timerAt <= at) return;
    this.timerAt = at;
    this.timer = this.setTimer(() => { this.timer = null; this.timerAt = null; this.slice(); }, at - this.now());
  }

  // The due charts in the order they are drawn: in view first, then the longest waiting.
  order(now) {
    return [...this.dirty].filter((c) => this.dueAt(c) <= now).sort((a, b) => {
      if (!!a.visible !== !!b.visible) return a.visible ? -1 : 1;
      return (a.lastRender ?? -Infinity) - (b.lastRender ?? -Infinity);
    });
  }

  slice() {
    const began = this.now();
    for (const chart of this.order(began)) {
      if (this.now() - began >= this.budgetMs) break; // the rest wait for the next slice
      this.dirty.delete(chart);
      chart.lastRender = this.now();
      try {
        chart.render();
      } catch (e) {
        console.error("sketchboard: a chart could not be drawn", e);
      }
    }
    const spent = this.now() - began;
    this.slices += 1;
    this.drawnMs += spent;
    this.restUntil = this.now() + spent * this.idleRatio;
    this.arm();
  }
}

// The page's queue: every LiveChart of the page draws through it.
export const renderQueue = new RenderQueue();
