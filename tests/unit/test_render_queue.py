"""The dashboard's render queue (dashboard/static/render_queue.js), run by Node with a fake
clock and fake charts whose drawing advances it: under no load every chart redraws as soon as
its interval allows; under load the drawing takes at most about half of the main thread, every
chart still gets its turn, the ones in view first; a removed chart is never drawn, and one that
fails to draw does not stop the others."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="no Node.js to run the page's modules")

HARNESS = """
import { RenderQueue } from "%(static)s/render_queue.js";

// A fake clock and timers: run() fires the earliest timer until none is left before `until`.
export function world() {
  const w = { t: 0, timers: [], seq: 0 };
  w.now = () => w.t;
  w.setTimer = (fn, ms) => { const id = w.seq++; w.timers.push({ at: w.t + Math.max(0, ms), id, fn }); return id; };
  w.run = (until) => {
    for (;;) {
      w.timers.sort((a, b) => a.at - b.at || a.id - b.id);
      if (!w.timers.length || w.timers[0].at > until) break;
      const next = w.timers.shift();
      w.t = Math.max(w.t, next.at);
      next.fn();
    }
    w.t = Math.max(w.t, until);
  };
  return w;
}

export function chart(w, name, costMs, visible = true) {
  return { name, visible, lastRender: null, draws: [],
    render() { this.draws.push(w.t); w.t += costMs; } };
}

export function queue(w) { return new RenderQueue({ now: w.now, setTimer: w.setTimer }); }
"""


def run_node(tmp_path, body: str):
    harness = tmp_path / "harness.mjs"
    harness.write_text(HARNESS % {"static": (REPO_ROOT / "dashboard" / "static").as_posix()})
    script = tmp_path / "case.mjs"
    script.write_text('import { world, chart, queue } from "./harness.mjs";\n' + body)
    done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_without_load_every_chart_redraws_as_soon_as_its_interval_allows(tmp_path):
    out = run_node(tmp_path, """
const w = world(), q = queue(w);
const charts = [0, 1, 2].map((i) => chart(w, "c" + i, 5));
for (const c of charts) q.request(c);
w.run(0);                                // all three in the first slice, at once
for (const c of charts) q.request(c);   // new data 100 ms later: not before 400 ms after the last draw
w.t = 100; w.run(1000);
q.request(charts[0]); w.run(5000);      // long after: drawn at once
console.log(JSON.stringify(charts.map((c) => c.draws)));
""")
    # c1 and c2 come due while c0 draws at 400: the next slice, after c0's 5 ms and as long a rest.
    assert out == [[0, 400, 1000], [5, 410], [10, 415]]


def test_under_load_drawing_takes_about_half_the_time_and_every_chart_gets_its_turn(tmp_path):
    out = run_node(tmp_path, """
const w = world(), q = queue(w);
const charts = Array.from({ length: 25 }, (_, i) => chart(w, "c" + i, 100));
// New points for every chart every second (the websocket's pushes), for 60 s.
for (let s = 0; s < 60; s++) { for (const c of charts) q.request(c); w.run(s * 1000 + 999); }
const drawn = charts.reduce((n, c) => n + c.draws.length, 0);
const gaps = charts.flatMap((c) => c.draws.slice(1).map((t, i) => t - c.draws[i]));
console.log(JSON.stringify({ drawn, busy: drawn * 100 / w.t, maxGap: Math.max(...gaps),
  first: Math.max(...charts.map((c) => c.draws[0])) }));
""")
    # Each slice draws one 100 ms chart, then rests as long: 5 draws a second, half the thread.
    assert out["busy"] <= 0.51
    assert out["drawn"] >= 290
    assert out["first"] <= 25 * 200  # all 25 drawn within their first round
    assert out["maxGap"] <= 25 * 200 + 100  # round robin: nobody starves


def test_charts_in_view_are_drawn_before_the_others(tmp_path):
    out = run_node(tmp_path, """
const w = world(), q = queue(w);
const hidden = Array.from({ length: 10 }, (_, i) => chart(w, "h" + i, 100, false));
const shown = Array.from({ length: 3 }, (_, i) => chart(w, "v" + i, 100, true));
for (const c of [...hidden, ...shown]) q.request(c);
w.run(500);
const drawn = [...hidden, ...shown].filter((c) => c.draws.length);
console.log(JSON.stringify({ order: drawn.sort((a, b) => a.draws[0] - b.draws[0]).map((c) => c.name) }));
""")
    assert out["order"][:3] == ["v0", "v1", "v2"]


def test_a_removed_chart_is_not_drawn_and_a_failing_one_does_not_stop_the_others(tmp_path):
    out = run_node(tmp_path, """
const w = world(), q = queue(w);
const errors = [];
console.error = (...a) => errors.push(String(a[0]));
const gone = chart(w, "gone", 5), bad = chart(w, "bad", 5), good = chart(w, "good", 5);
bad.render = () => { throw new Error("no"); };
for (const c of [gone, bad, good]) q.request(c);
q.forget(gone);
w.run(1000);
q.request(good); w.run(2000);
console.log(JSON.stringify({ gone: gone.draws, good: good.draws, errors }));
""")
    assert out["gone"] == []
    assert out["good"] == [0, 1000]
    assert out["errors"] == ["sketchboard: a chart could not be drawn"]
