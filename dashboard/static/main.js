// Sketchboard's live dashboard, as native ES modules (no build step): one websocket
// (connection.js), Plotly charts updated in place (chart.js), the page's one time range
// (timerange.js), the explorer (explorer.js), the chosen dashboard's panels (panels.js) and
// their editor (editor.js), the status strip, lag and corrections (status.js). Page state is
// in the URL. Nothing is asked of any other host.

import "./auth.js"; // first: every fetch below carries the token
import "./membership.js";
import "./alerts.js";
import "./reprocess.js";
import { $, call, parseDuration } from "./util.js";
import { Connection } from "./connection.js";
import { Dashboards } from "./panels.js";
import { Editor } from "./editor.js";
import { Explorer } from "./explorer.js";
import { StatusPanels } from "./status.js";
import { TimeRange } from "./timerange.js";

const page = { metrics: {}, panes: {}, charts: new Map() };
const RESUBSCRIBE_MS = 150;
window.sketchboard = page; // for the browser tests and for poking around in the console

async function start() {
  const status = new StatusPanels((c) => { for (const chart of page.charts.values()) chart.addCorrection(c); });
  page.status = status;
  page.conn = new Connection((msg) => status.handle(msg));
  page.onZoom = (startMs, endMs) => page.time.zoom(startMs, endMs);
  page.onZoomOut = () => page.time.zoomOut();
  // Range changes in quick succession (arrow keys on the range menu, a zoom then a double click)
  // are coalesced: one resubscribe round once they pause for RESUBSCRIBE_MS, each round one
  // message per chart (the server closes a socket past ws_message_rate / ws_message_burst).
  let resubscribe = null;
  page.time = new TimeRange(() => {
    clearTimeout(resubscribe);
    resubscribe = setTimeout(() => { resubscribe = null; page.explorer.apply(); page.dashboards.subscribe(); }, RESUBSCRIBE_MS);
  });
  const [metrics, streams] = await Promise.all([call("GET", "/api/v1/metrics"), call("GET", "/api/v1/streams")]);
  if (!metrics.ok) throw new Error(`GET /api/v1/metrics: HTTP ${metrics.status}`);
  for (const m of metrics.body.metrics) page.metrics[m.name] = m;
  for (const s of streams.ok ? streams.body.streams : []) page.panes[s.name] = parseDuration(s.pane);
  page.explorer = new Explorer(page);
  page.dashboards = new Dashboards(page);
  const current = await page.dashboards.start();
  page.time.load(current ? current.range : null);
  page.dashboards.ready = true;
  page.dashboards.render();
  page.explorer.start();
  page.editor = new Editor(page, page.dashboards);
  page.editPanel = (i) => page.editor.open(i);
  if (page.dashboards.enabled) page.editor.start();
  // Last: "live" in the status strip says the page is set up, every chart subscribed.
  page.conn.connect();
  setInterval(slide, 1000);
}

// Relative ranges move on with time: the explorer every second, a panel at its dashboard's
// refresh (none: it stays still between pushes); 'x s ago' counts up.
function slide() {
  const now = Date.now();
  for (const chart of page.charts.values()) {
    if (!chart.relative || !chart.result || chart.slideEveryMs === null) continue;
    if (chart.slideEveryMs && now - (chart.lastSlide || 0) < chart.slideEveryMs) continue;
    chart.lastSlide = now;
    chart.slide();
  }
  page.status.updateLastBatch();
}

$("theme-toggle").addEventListener("click", () => {
  const next = document.documentElement.dataset.theme === "light" ? "dark" : "light";
  document.documentElement.dataset.theme = next;
  try { localStorage.setItem("sketchboard.theme", next); } catch (e) { /* private mode */ }
  for (const chart of page.charts.values()) chart.schedule();
  if (page.status) page.status.restyle();
});

start().catch((e) => {
  console.error("sketchboard: could not start", e);
  const conn = $("status-connection");
  conn.dataset.state = "closed";
  conn.textContent = "error: " + e.message;
});
