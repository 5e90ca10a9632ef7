// A live chart: one websocket subscription's series, kept as a map of points (a `points`
// message upserts, a correction marks its pane), drawn as the panel's kind: line, area, bar,
// stat (the newest value with a sparkline), table (the top groups) or heatmap (heatmap.js).
// Plotly.react redraws in place, through the page's render queue (render_queue.js: at most every
// 400 ms, charts in view first, the drawing never taking all of the main thread). A drag on a
// time axis zooms the whole page.

import { renderQueue } from "./render_queue.js";
import { PALETTE, cssVar, el, fmtHover, fmtNum, groupLabel, hexToRgba, nowMs, plotlyText, timeTicks } from "./util.js";
import { distribution } from "./heatmap.js";

const PLOTTED = new Set(["line", "area", "bar", "heatmap"]);
const TABLE_ROWS = 10;
const NO_DATA = "no data"; // a stat whose newest step has no value (a percentile of no events)
// Viridis, with no events drawn as nothing rather than as the darkest colour.
const HEAT = [[0, "rgba(0,0,0,0)"], [1e-6, "#440154"], [0.25, "#3b528b"], [0.5, "#21918c"], [0.75, "#5ec962"], [1, "#fde725"]];

export class LiveChart {
  // opts: {kind, band, errorBars, onZoom(startMs, endMs), onZoomOut()}
  constructor(elem, opts) {
    this.el = elem;
    this.opts = { kind: "line", ...opts };
    this.series = new Map(); // "stat|group json" -> {stat, group, points: Map(t -> point)}
    this.result = null;
    this.corrections = [];
    this.lastRender = null; // set by the render queue
    this.visible = true; // in the viewport: drawn first (until the observer says otherwise)
    this.plotted = false;
    this.renders = 0;
    this.revision = 0; // a new query: Plotly forgets the user's zoom (uirevision)
    // A relative range is drawn up to viewEnd, which only slide() moves on (main.js: every second,
    // or at the dashboard's refresh; none: never), not a push or a redraw.
    this.viewEnd = null;
    if (typeof IntersectionObserver !== "undefined") {
      // Only the order of the queue's next slice changes: a chart scrolled into view goes first.
      this.observer = new IntersectionObserver((entries) => { for (const e of entries) this.visible = e.isIntersecting; });
      this.observer.observe(elem);
    }
  }

  // A removed chart (another dashboard, a new explorer query) is drawn no more.
  dispose() {
    this.disposed = true;
    renderQueue.forget(this);
    if (this.observer) this.observer.disconnect();
  }

  reset(query) {
    this.query = query;
    this.series.clear();
    this.result = null;
    this.corrections = [];
    this.error = null;
    this.revision += 1;
    this.schedule();
  }

  get relative() { return this.query && /^now/.test(String(this.query.from || "now-1h")); }
  get spanMs() { return this.result ? this.result.end - this.result.start : 0; }

  snapshot(result) {
    this.result = result;
    this.viewEnd = result.end;
    this.error = null;
    this.series.clear();
    for (const s of result.series) this.upsert(s);
    this.schedule();
  }

  points(msg) {
    if (!this.result) return;
    if (this.relative) { this.result.start = msg.start; this.result.end = msg.end; }
    this.result.watermark_ms = msg.watermark_ms;
    for (const s of msg.series) this.upsert(s);
    this.trim();
    this.schedule();
  }

  fail(reason) { this.error = reason; this.schedule(); }

  upsert(s) {
    const stat = s.stat || (this.result && this.result.stat);
    const key = stat + "|" + JSON.stringify(s.group);
    let entry = this.series.get(key);
    if (!entry) { entry = { stat, group: s.group, points: new Map() }; this.series.set(key, entry); }
    for (const p of s.points) entry.points.set(p.t, p);
  }

  // The view of a relative range moves on to the server's now (main.js, at the chart's pace).
  slide() {
    if (!this.relative || !this.result) return;
    this.viewEnd = nowMs();
    this.trim();
    this.schedule();
  }

  trim() {
    if (!this.relative || !this.result) return;
    const start = (this.viewEnd ?? nowMs()) - this.spanMs;
    for (const entry of this.series.values()) {
      for (const t of entry.points.keys()) if (t + this.result.step_ms < start) entry.points.delete(t);
    }
  }

  addCorrection(c) {
    if (!this.result || c.stream !== this.result.stream) return;
    this.corrections.push(c);
    if (this.corrections.length > 30) this.corrections.shift();
    this.schedule();
  }

  schedule() { if (!this.disposed) renderQueue.request(this); }

  isFinal(p) {
    const wm = this.result.watermark_ms;
    return p.final || (wm !== null && wm !== undefined && p.t + this.result.window_ms <= wm);
  }

  ordered() { // by group, then stat (a band's p50 first, then p99 so p95 can fill to it)
    const order = this.opts.band ? ["p50", "p99", "p95"] : null;
    return [...this.series.values()].sort((a, b) => {
      const ga = JSON.stringify(a.group), gb = JSON.stringify(b.group);
      if (ga !== gb) return ga < gb ? -1 : 1;
      return order ? order.indexOf(a.stat) - order.indexOf(b.stat) : (a.stat < b.stat ? -1 : 1);
    });
  }

  hoverText(p) {
    const fin = this.isFinal(p);
    let text = `${fmtHover(p.t)}<br>value: ${p.value === null ? "–" : p.value}<br>count: ${p.count}` +
      `<br>${fin ? "final" : "provisional"} · revision ${p.revision}${p.revision > 1 ? " (corrected)" : ""}`;
    if (p.error) {
      text += `<br>bounds: ${fmtNum(p.error.lower)} … ${fmtNum(p.error.upper)}`;
      if (p.error.relative_error !== null && p.error.relative_error !== undefined)
        text += ` (HLL rse ${(p.error.relative_error * 100).toFixed(2)} %)`;
      if (p.error.rank_error !== null && p.error.rank_error !== undefined)
        text += ` (KLL rank ±${(p.error.rank_error * 100).toFixed(2)} %)`;
    }
    return text;
  }

  traces() {
    const out = [];
    const entries = this.ordered();
    const groups = [...new Set(entries.map((e) => JSON.stringify(e.group)))].sort();
    const multiStat = this.opts.band || new Set(entries.map((e) => e.stat)).size > 1;
    const kind = this.opts.kind;
    for (const entry of entries) {
      const g = JSON.stringify(entry.group);
      const color = PALETTE[groups.indexOf(g) % PALETTE.length];
      const ts = [...entry.points.keys()].sort((a, b) => a - b);
      const pts = ts.map((t) => entry.points.get(t));
      const label = groupLabel(entry.group); // a producer's values: text, never Plotly markup
      const trace = {
        type: kind === "bar" ? "bar" : "scatter", x: ts, y: pts.map((p) => p.value), // instants (util.js timeTicks)
        customdata: pts.map((p) => this.hoverText(p)),
        name: plotlyText(multiStat ? `${label} ${entry.stat}` : label), legendgroup: g,
        hovertemplate: "<b>%{fullData.name}</b><br>%{customdata}<extra></extra>",
      };
      if (kind === "bar") {
        trace.marker = { color: pts.map((p) => hexToRgba(color, this.isFinal(p) ? 0.85 : 0.4)) };
      } else {
        const symbols = pts.map((p) => (p.revision > 1 ? "diamond" : "circle") + (this.isFinal(p) ? "" : "-open"));
        Object.assign(trace, {
          mode: "lines+markers", connectgaps: false, line: { color, width: 1.6, shape: "linear" },
          marker: { color, size: pts.map((p) => (p.count > 0 ? 6 : 2)), symbol: symbols, line: { color, width: 1.2 } },
        });
        if (kind === "area" && !this.opts.band) { trace.fill = groups.length > 1 ? "tonexty" : "tozeroy"; trace.fillcolor = hexToRgba(color, 0.15); }
      }
      if (this.opts.band) {
        if (entry.stat === "p99") { trace.fill = "tonexty"; trace.fillcolor = hexToRgba(color, 0.18); trace.line.dash = "dot"; }
        if (entry.stat === "p95") trace.line.dash = "dash";
        if (entry.stat !== "p50") trace.line.width = 1;
      }
      if (this.opts.errorBars && pts.some((p) => p.error)) {
        trace.error_y = {
          type: "data", symmetric: false, color: hexToRgba(color, 0.5), thickness: 1, width: 2,
          array: pts.map((p) => (p.error && p.value !== null ? p.error.upper - p.value : 0)),
          arrayminus: pts.map((p) => (p.error && p.value !== null ? p.value - p.error.lower : 0)),
        };
      }
      out.push(trace);
    }
    return out;
  }

  heatmapTraces() {
    const byT = new Map();
    for (const entry of this.series.values()) {
      for (const [t, p] of entry.points) {
        if (!byT.has(t)) byT.set(t, { t, count: 0, values: {} });
        const step = byT.get(t);
        if (entry.stat === "count") step.count = p.value || 0; else step.values[entry.stat] = p.value;
      }
    }
    const steps = [...byT.values()].sort((a, b) => a.t - b.t);
    const d = distribution(steps);
    const when = d.x.map(fmtHover);
    return [{ type: "heatmap", x: d.x, y: d.y, z: d.z, colorscale: HEAT, zmin: 0, showscale: false,
      customdata: d.y.map(() => when), hovertemplate: "%{customdata}<br>≈ %{y:.4g}: %{z:.0f} events<extra></extra>" }];
  }

  layout() {
    const text = cssVar("--text"), muted = cssVar("--muted"), grid = cssVar("--grid");
    const layout = {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: text, size: 11 }, margin: { l: 48, r: 10, t: 8, b: 30 },
      // Instants on a linear axis, labelled in local time (util.js timeTicks): not a date axis,
      // whose local wall time folds a DST fall-back hour.
      xaxis: { type: "linear", gridcolor: grid, linecolor: grid, color: muted, zeroline: false, tickmode: "array",
        tickvals: [], ticktext: [] },
      yaxis: { gridcolor: grid, linecolor: grid, color: muted, rangemode: "tozero", automargin: true },
      showlegend: this.opts.kind !== "heatmap", legend: { orientation: "h", y: -0.18, font: { size: 10 } },
      hovermode: "closest", uirevision: this.revision, datarevision: this.renders, bargap: 0.1,
      shapes: [], annotations: [],
    };
    if (this.opts.kind === "heatmap") layout.yaxis.rangemode = "normal";
    if (this.result) {
      const end = this.relative ? (this.viewEnd ?? this.result.end) : this.result.end;
      const start = this.relative ? end - this.spanMs : this.result.start;
      layout.xaxis.range = [start, end];
      Object.assign(layout.xaxis, timeTicks(start, end));
    }
    for (const c of this.corrections) {
      layout.shapes.push({ type: "rect", xref: "x", yref: "paper", x0: c.pane_start_ms,
        x1: c.pane_end_ms, y0: 0, y1: 1, fillcolor: cssVar("--correction"), opacity: 0.22,
        line: { width: 0 }, layer: "below" });
    }
    const msg = this.message();
    // The server's reason may quote the URL's filter: text, never Plotly markup.
    if (msg) layout.annotations.push({ text: plotlyText(msg), xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
      font: { color: this.error ? cssVar("--bad") : muted, size: 13 } });
    return layout;
  }

  message() {
    return this.error ? `error: ${this.error}` : (!this.result ? "loading…" :
      (this.series.size === 0 ? "no data in this range yet" : null));
  }

  render() { // called by the render queue, which sets lastRender
    this.renders += 1;
    const kind = this.opts.kind;
    if (PLOTTED.has(kind)) this.renderPlot();
    else if (kind === "stat") this.renderStat();
    else this.renderTable();
    let n = 0, nonEmpty = 0;
    for (const e of this.series.values()) for (const p of e.points.values()) { n += 1; if (p.count > 0) nonEmpty += 1; }
    this.el.dataset.points = String(n);
    this.el.dataset.nonEmptyPoints = String(nonEmpty);
    this.el.dataset.renders = String(this.renders);
    this.el.dataset.state = this.error ? "error" : (this.result ? "live" : "loading");
    if (this.query) { this.el.dataset.from = String(this.query.from); this.el.dataset.to = String(this.query.to); }
  }

  renderPlot() {
    const traces = this.opts.kind === "heatmap" ? this.heatmapTraces() : this.traces();
    const config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
    Plotly.react(this.el, traces, this.layout(), config);
    if (!this.plotted) {
      this.plotted = true;
      this.el.on("plotly_relayout", (ev) => { // a drag on the time axis zooms every chart of the page
        const a = ev["xaxis.range[0]"] ?? (ev["xaxis.range"] || [])[0];
        const b = ev["xaxis.range[1]"] ?? (ev["xaxis.range"] || [])[1];
        if (a !== undefined && b !== undefined && this.opts.onZoom) this.opts.onZoom(Number(a), Number(b)); // instants
        else if (ev["xaxis.autorange"] && this.opts.onZoomOut) this.opts.onZoomOut();
      });
    }
  }

  // The newest step: only the one still filling with no event yet is passed over. A final step
  // without events is the newest value (0 for a count or a rate; no value for a percentile, which
  // the stat shows as "no data"), never an older step's value from before the traffic stopped.
  latest(entry) {
    const ts = [...entry.points.keys()].sort((a, b) => b - a);
    for (const t of ts) { const p = entry.points.get(t); if (p.count > 0 || this.isFinal(p)) return p; }
    return null;
  }

  renderStat() {
    if (!this.statEl) {
      this.statEl = el("div", { class: "stat-values", "data-testid": "stat-value" });
      this.sparkEl = el("div", { class: "sparkline" });
      this.el.replaceChildren(this.statEl, this.sparkEl);
    }
    const msg = this.message();
    const entries = this.ordered().slice(0, 4);
    this.statEl.replaceChildren(...(msg && !entries.length ? [el("span", { class: "reason" }, [msg])] :
      entries.map((e) => {
        const p = this.latest(e);
        const v = p ? p.value : null;
        return el("span", { class: "stat-value" }, [el("b", {}, [v === null || v === undefined ? NO_DATA : fmtNum(v)]),
          entries.length > 1 ? el("small", {}, [groupLabel(e.group)]) : null]);
      })));
    const traces = entries.map((e, i) => {
      const ts = [...e.points.keys()].sort((a, b) => a - b);
      return { type: "scatter", mode: "lines", x: ts, y: ts.map((t) => e.points.get(t).value),
        line: { color: PALETTE[i % PALETTE.length], width: 1.4 }, fill: "tozeroy",
        fillcolor: hexToRgba(PALETTE[i % PALETTE.length], 0.12), hoverinfo: "skip" };
    });
    Plotly.react(this.sparkEl, traces, { paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
      margin: { l: 0, r: 0, t: 0, b: 0 }, showlegend: false, xaxis: { visible: false }, yaxis: { visible: false } },
    { displayModeBar: false, staticPlot: true, responsive: true });
  }

  renderTable() { // the top groups by their newest value; the peak beside it
    const rows = this.ordered().map((e) => {
      const p = this.latest(e);
      const values = [...e.points.values()].map((q) => q.value).filter((v) => v !== null && v !== undefined);
      return { label: groupLabel(e.group), value: p ? p.value : null, peak: values.length ? Math.max(...values) : null };
    }).sort((a, b) => (b.value ?? -Infinity) - (a.value ?? -Infinity)).slice(0, TABLE_ROWS);
    const msg = this.message();
    const head = el("tr", {}, [el("th", {}, ["group"]), el("th", {}, ["newest"]), el("th", {}, ["peak"])]);
    const body = rows.map((r) => el("tr", { "data-group": r.label }, [el("td", {}, [r.label]),
      el("td", { class: "num" }, [fmtNum(r.value)]), el("td", { class: "num" }, [fmtNum(r.peak)])]));
    this.el.replaceChildren(msg && !rows.length ? el("p", { class: "reason" }, [msg]) :
      el("table", { class: "top-groups", "data-testid": "top-groups" }, [el("thead", {}, [head]), el("tbody", {}, body)]));
  }

  totalCount() {
    let n = 0;
    for (const e of this.series.values()) if (e.stat === (this.result && this.result.stats[0])) for (const p of e.points.values()) n += p.count;
    return n;
  }
}
