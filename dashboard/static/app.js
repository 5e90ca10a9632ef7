/* Sketchboard live dashboard: one websocket (WS /api/v1/ws), Plotly charts updated in place
   with Plotly.react (throttled), page state in the URL. No build step, no external requests. */
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const RANGES = { "5m": 300e3, "15m": 900e3, "1h": 3600e3, "6h": 21600e3, "24h": 86400e3 };
  const AUTO_STEP = { "5m": "10s", "15m": "10s", "1h": "30s", "6h": "2m", "24h": "10m" };
  const BAND = ["p50", "p95", "p99"];
  const PERCENTILES = ["p50", "p90", "p95", "p99", "p99.9"];
  const PALETTE = ["#5aa9ff", "#ff7b72", "#3fb950", "#d29922", "#a371f7", "#39c5cf", "#f778ba", "#8b949e",
    "#e3b341", "#56d364"];
  const RENDER_EVERY_MS = 400;
  const state = { metrics: {}, skewMs: 0, charts: new Map(), dropped: 0 };
  const nowMs = () => Date.now() + state.skewMs;
  const cssVar = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  function pad(n, w) { return String(n).padStart(w || 2, "0"); }
  function fmtLocal(ms) { // Plotly date string in local time
    const d = new Date(ms);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }
  function fmtTime(ms) { const d = new Date(ms); return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`; }
  function fmtNum(v) {
    if (v === null || v === undefined) return "–";
    return Math.abs(v) >= 1000 ? Math.round(v).toLocaleString() : String(+v.toPrecision(4));
  }
  function hexToRgba(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
  }
  function groupLabel(group) {
    const parts = Object.entries(group || {}).map(([k, v]) => (v === "" ? `${k}=∅` : v));
    return parts.length ? parts.join(" · ") : "all";
  }

  // ---------------------------------------------------------------- live charts

  class LiveChart {
    constructor(el, opts) {
      this.el = el;
      this.opts = opts; // {band, errorBars, unit}
      this.series = new Map(); // "stat|group json" -> {stat, group, points: Map(t -> point)}
      this.result = null;
      this.corrections = [];
      this.timer = null;
      this.lastRender = 0;
      this.plotted = false;
      this.zoomed = false;
      this.renders = 0;
    }

    reset(query) {
      this.query = query;
      this.series.clear();
      this.result = null;
      this.corrections = [];
      this.error = null;
      this.schedule();
    }

    get relative() { return this.query && /^now/.test(String(this.query.from || "now-1h")); }
    get spanMs() { return this.result ? this.result.end - this.result.start : 0; }

    snapshot(result) {
      this.result = result;
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

    trim() {
      if (!this.relative || !this.result) return;
      const start = nowMs() - this.spanMs;
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

    schedule() {
      if (this.timer) return;
      const wait = Math.max(0, this.lastRender + RENDER_EVERY_MS - Date.now());
      this.timer = setTimeout(() => { this.timer = null; this.render(); }, wait);
    }

    isFinal(p) {
      const wm = this.result.watermark_ms;
      return p.final || (wm !== null && wm !== undefined && p.t + this.result.window_ms <= wm);
    }

    traces() {
      const out = [];
      const groups = [...new Set([...this.series.values()].map((e) => JSON.stringify(e.group)))].sort();
      const colorOf = (g) => PALETTE[groups.indexOf(g) % PALETTE.length];
      const ordered = [...this.series.values()].sort((a, b) => {
        const ga = JSON.stringify(a.group), gb = JSON.stringify(b.group);
        if (ga !== gb) return ga < gb ? -1 : 1;
        const order = this.opts.band ? ["p50", "p99", "p95"] : null;
        return order ? order.indexOf(a.stat) - order.indexOf(b.stat) : (a.stat < b.stat ? -1 : 1);
      });
      for (const entry of ordered) {
        const g = JSON.stringify(entry.group);
        const color = colorOf(g);
        const ts = [...entry.points.keys()].sort((a, b) => a - b);
        const pts = ts.map((t) => entry.points.get(t));
        const x = ts.map(fmtLocal);
        const y = pts.map((p) => p.value);
        const symbols = pts.map((p) => {
          const corrected = p.revision > 1;
          const fin = this.isFinal(p);
          return (corrected ? "diamond" : "circle") + (fin ? "" : "-open");
        });
        const custom = pts.map((p) => {
          const fin = this.isFinal(p);
          let text = `value: ${p.value === null ? "–" : p.value}<br>count: ${p.count}` +
            `<br>${fin ? "final" : "provisional"} · revision ${p.revision}${p.revision > 1 ? " (corrected)" : ""}`;
          if (p.error) {
            text += `<br>bounds: ${fmtNum(p.error.lower)} … ${fmtNum(p.error.upper)}`;
            if (p.error.relative_error !== null && p.error.relative_error !== undefined)
              text += ` (HLL rse ${(p.error.relative_error * 100).toFixed(2)} %)`;
            if (p.error.rank_error !== null && p.error.rank_error !== undefined)
              text += ` (KLL rank ±${(p.error.rank_error * 100).toFixed(2)} %)`;
          }
          return text;
        });
        const label = groupLabel(entry.group);
        const multiStat = this.opts.band || new Set([...this.series.values()].map((e) => e.stat)).size > 1;
        const trace = {
          type: "scatter", mode: "lines+markers", x, y, customdata: custom,
          name: multiStat ? `${label} ${entry.stat}` : label, legendgroup: g,
          line: { color, width: 1.6, shape: "linear" },
          marker: { color, size: pts.map((p) => (p.count > 0 ? 6 : 2)), symbol: symbols, line: { color, width: 1.2 } },
          hovertemplate: "<b>%{fullData.name}</b><br>%{x}<br>%{customdata}<extra></extra>",
          connectgaps: false,
        };
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

    layout() {
      const text = cssVar("--text"), muted = cssVar("--muted"), grid = cssVar("--grid");
      const layout = {
        paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)",
        font: { color: text, size: 11 }, margin: { l: 48, r: 10, t: 8, b: 30 },
        xaxis: { type: "date", gridcolor: grid, linecolor: grid, color: muted },
        yaxis: { gridcolor: grid, linecolor: grid, color: muted, rangemode: "tozero", automargin: true },
        showlegend: true, legend: { orientation: "h", y: -0.18, font: { size: 10 } },
        hovermode: "closest", uirevision: "keep", datarevision: this.renders,
        shapes: [], annotations: [],
      };
      if (this.result && !this.zoomed) {
        const end = this.relative ? nowMs() : this.result.end;
        const start = this.relative ? end - this.spanMs : this.result.start;
        layout.xaxis.range = [fmtLocal(start), fmtLocal(end)];
      }
      for (const c of this.corrections) {
        layout.shapes.push({ type: "rect", xref: "x", yref: "paper", x0: fmtLocal(c.pane_start_ms),
          x1: fmtLocal(c.pane_end_ms), y0: 0, y1: 1, fillcolor: cssVar("--correction"), opacity: 0.22,
          line: { width: 0 }, layer: "below" });
      }
      const msg = this.error ? `error: ${this.error}` : (!this.result ? "loading…" :
        (this.series.size === 0 ? "no data in this range yet" : null));
      if (msg) layout.annotations.push({ text: msg, xref: "paper", yref: "paper", x: 0.5, y: 0.5, showarrow: false,
        font: { color: this.error ? cssVar("--bad") : muted, size: 13 } });
      return layout;
    }

    render() {
      this.lastRender = Date.now();
      this.renders += 1;
      const traces = this.traces();
      const config = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
      Plotly.react(this.el, traces, this.layout(), config);
      if (!this.plotted) {
        this.plotted = true;
        this.el.on("plotly_relayout", (ev) => {
          if (ev["xaxis.range[0]"] !== undefined || ev["xaxis.range"]) this.zoomed = true;
          if (ev["xaxis.autorange"]) { this.zoomed = false; this.schedule(); }
        });
      }
      let n = 0, nonEmpty = 0;
      for (const e of this.series.values()) for (const p of e.points.values()) { n += 1; if (p.count > 0) nonEmpty += 1; }
      this.el.dataset.points = String(n);
      this.el.dataset.nonEmptyPoints = String(nonEmpty);
      this.el.dataset.renders = String(this.renders);
      this.el.dataset.state = this.error ? "error" : (this.result ? "live" : "loading");
    }

    totalCount() {
      let n = 0;
      for (const e of this.series.values()) if (e.stat === (this.result && this.result.stats[0])) for (const p of e.points.values()) n += p.count;
      return n;
    }
  }

  // ---------------------------------------------------------------- the websocket

  class Connection {
    constructor() {
      this.subs = new Map(); // id -> {query, handler}
      this.backoff = 500;
      this.ws = null;
      this.lastMessage = 0;
      this.connect();
      setInterval(() => { // a silent socket is a dead one: heartbeats come at least every few seconds
        if (this.ws && this.ws.readyState === WebSocket.OPEN && Date.now() - this.lastMessage > 35000) this.ws.close();
      }, 5000);
    }

    connect() {
      setConnState("connecting", "connecting…");
      const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/v1/ws`,
                               window.SketchboardAuth ? window.SketchboardAuth.protocols() : []);
      this.ws = ws;
      ws.onopen = () => {
        this.backoff = 500;
        this.lastMessage = Date.now();
        setConnState("open", "live");
        for (const [id, s] of this.subs) this.send({ type: "subscribe", id, query: s.query });
      };
      ws.onmessage = (ev) => {
        this.lastMessage = Date.now();
        let msg;
        try { msg = JSON.parse(ev.data); } catch (e) { return; }
        dispatch(msg, this);
      };
      ws.onclose = () => {
        if (this.ws !== ws) return;
        const wait = this.backoff;
        this.backoff = Math.min(this.backoff * 2, 10000);
        setConnState("closed", `disconnected · retrying in ${Math.round(wait / 1000)} s`);
        setTimeout(() => this.connect(), wait);
      };
      ws.onerror = () => {}; // onclose follows and reconnects
    }

    send(msg) { if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(msg)); }

    subscribe(id, query, handler) {
      this.subs.set(id, { query, handler });
      this.send({ type: "subscribe", id, query });
    }
  }

  function setConnState(stateName, text) {
    const el = $("status-connection");
    el.dataset.state = stateName;
    el.textContent = text;
  }

  function dispatch(msg, conn) {
    switch (msg.type) {
      case "snapshot": case "points": case "error": {
        const sub = msg.id !== null && msg.id !== undefined ? conn.subs.get(msg.id) : null;
        if (sub) sub.handler(msg);
        else if (msg.type === "error") console.warn("sketchboard:", msg.reason);
        break;
      }
      case "pipeline": onPipeline(msg); break;
      case "lag": onLag(msg); break;
      case "correction": onCorrection(msg); break;
      case "alert": window.dispatchEvent(new CustomEvent("sketchboard:alert", { detail: msg })); break; // alerts.js
      case "heartbeat": state.skewMs = msg.at_ms - Date.now(); break;
      case "dropped":
        state.dropped += msg.count;
        $("status-connection").title = `${state.dropped} messages coalesced or dropped (slow connection)`;
        break;
      default: break;
    }
  }

  function chartHandler(chart) {
    return (msg) => {
      if (msg.type === "snapshot") chart.snapshot(msg.result);
      else if (msg.type === "points") chart.points(msg);
      else if (msg.type === "error") chart.fail(msg.reason);
    };
  }

  // ---------------------------------------------------------------- status, lag, corrections

  let lastPipeline = null;
  function onPipeline(m) {
    lastPipeline = m;
    if (m.at_ms) state.skewMs = m.at_ms - Date.now();
    $("status-events-in").textContent = `${fmtNum(m.events_in_per_second)} ev/s in`;
    $("status-aggregated").textContent = `${fmtNum(m.events_aggregated_per_second)} ev/s aggregated`;
    // Which partition holds a stream's watermark back, only while the lag status says the
    // pipeline is behind: with live traffic some partition almost always has a few unread records.
    const held = Object.entries(m.watermark_held_by || {});
    const behind = held.length && m.lag_events > 0 && lastLagStatus && lastLagStatus !== "OK";
    const heldText = behind ? held.map(([stream, p]) => `${stream}/${p}`).join(", ") : "";
    $("status-lag-events").textContent = `lag ${fmtNum(m.lag_events)} events` + (heldText ? ` · watermark held by ${heldText}` : "");
    $("status-lag-events").dataset.heldBy = heldText;
    updateLastBatch();
    updateQuery(m.query);
  }
  function updateQuery(q) { // the Spark query's health (lag.feed.query_health), null before it ever started
    const el = $("status-query");
    let st, text;
    if (!q) { st = "none"; text = "query not started"; }
    else if (q.running) {
      st = "running";
      text = "query running" + (q.batch_duration_ms !== null && q.batch_duration_ms !== undefined
        ? ` · batch ${fmtNum(q.batch_duration_ms)} ms` : "") +
        (q.processed_rows_per_second !== null && q.processed_rows_per_second !== undefined
          ? ` · ${fmtNum(q.processed_rows_per_second)} rows/s` : "");
    } else if (q.stale) { st = "stale"; text = `query silent for ${Math.round(q.seconds_since_last_event)} s`; }
    else if (q.last_error) { st = "failed"; text = "query failed"; }
    else { st = "stopped"; text = "query stopped" + (q.terminated_at_ms ? ` at ${fmtTime(q.terminated_at_ms)}` : ""); }
    el.dataset.state = st;
    el.textContent = text;
    el.title = q && q.last_error ? `last error: ${q.last_error}` :
      "the pipeline's Spark query, as its listener reports it" + (q && q.batch_id !== null && q.batch_id !== undefined ? ` (batch ${q.batch_id})` : "");
  }
  function updateLastBatch() {
    const m = lastPipeline;
    if (!m || m.last_batch_id === null || m.last_batch_id === undefined) return;
    const ago = m.last_commit_ms ? Math.max(0, (nowMs() - m.last_commit_ms) / 1000) : null;
    $("status-last-batch").textContent = `batch ${m.last_batch_id}` +
      (ago === null ? "" : ` · ${fmtTime(m.last_commit_ms)} (${ago < 100 ? ago.toFixed(1) : Math.round(ago)} s ago)`);
  }

  const lag = { keys: [], plotted: false };
  function lagLayout(title) {
    const grid = cssVar("--grid"), muted = cssVar("--muted");
    return {
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: cssVar("--text"), size: 10 },
      margin: { l: 44, r: 6, t: 18, b: 24 }, title: { text: title, font: { size: 11 }, x: 0, xanchor: "left" },
      xaxis: { type: "date", gridcolor: grid, color: muted }, yaxis: { gridcolor: grid, color: muted, rangemode: "tozero" },
      showlegend: false, hovermode: "closest", uirevision: "keep",
    };
  }
  let lastLagStatus = null;
  function onLag(m) {
    lastLagStatus = m.status;
    const badge = $("lag-status");
    badge.textContent = m.status;
    badge.dataset.status = m.status;
    $("lag-reason").textContent = m.reason || "";
    const rows = [];
    for (const [stream, s] of Object.entries(m.streams || {})) {
      const parts = Object.entries(s.partitions || {});
      if (!parts.length) rows.push([stream, s.lag_events, s.lag_seconds]);
      for (const [p, v] of parts) rows.push([`${stream}/${p}`, v.lag_events, v.lag_seconds]);
    }
    if (!rows.length) rows.push([m.pipeline || "total", m.lag_events, m.lag_seconds]);
    const cfg = { displaylogo: false, responsive: true, displayModeBar: false };
    if (!lag.plotted) {
      Plotly.newPlot("lag-chart-events", [], lagLayout("lag (events)"), cfg);
      Plotly.newPlot("lag-chart-seconds", [], lagLayout("lag (seconds)"), cfg);
      lag.plotted = true;
    }
    const x = fmtLocal(m.at_ms || nowMs());
    for (const [key] of rows) {
      if (!lag.keys.includes(key)) {
        const color = PALETTE[lag.keys.length % PALETTE.length];
        lag.keys.push(key);
        const trace = { type: "scatter", mode: "lines+markers", marker: { size: 3 }, name: key, x: [], y: [], line: { color, width: 1.5 },
          hovertemplate: `${key}<br>%{x}<br>%{y}<extra></extra>` };
        Plotly.addTraces("lag-chart-events", trace);
        Plotly.addTraces("lag-chart-seconds", { ...trace });
      }
    }
    const idx = rows.map(([key]) => lag.keys.indexOf(key));
    Plotly.extendTraces("lag-chart-events", { x: rows.map(() => [x]), y: rows.map((r) => [r[1]]) }, idx, 600);
    Plotly.extendTraces("lag-chart-seconds", { x: rows.map(() => [x]), y: rows.map((r) => [r[2]]) }, idx, 600);
    $("lag-chart-events").dataset.updates = String(+($("lag-chart-events").dataset.updates || 0) + 1);
    if (m.consumers) renderConsumers(m.consumers);
  }

  // Fan-out: one row per pipeline reading the log (the serving one first), with its committed
  // offsets per partition. Built with textContent only: names come from the server.
  function renderConsumers(consumers) {
    const table = $("lag-consumers"), body = table.querySelector("tbody");
    table.hidden = consumers.length < 2 && !consumers.some((c) => !c.serving);
    const cell = (text, cls) => {
      const td = document.createElement("td");
      td.textContent = text;
      if (cls) td.className = cls;
      return td;
    };
    body.replaceChildren(...consumers.map((c) => {
      const tr = document.createElement("tr");
      tr.dataset.consumer = c.name;
      const name = c.name + (c.serving ? " (serving)" : "") + (c.started_from ? ` · from ${c.started_from}` : "");
      const status = document.createElement("td");
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.dataset.status = c.status;
      badge.textContent = c.status;
      badge.title = c.reason || "";
      status.appendChild(badge);
      const offsets = Object.entries(c.streams || {}).map(([stream, s]) =>
        `${stream} ` + Object.entries(s.partitions || {}).map(([p, v]) => `${p}:${v.committed ?? "–"}`).join(" ")).join(" · ");
      const seconds = c.lag_seconds === null || c.lag_seconds === undefined ? "–" : c.lag_seconds.toFixed(1);
      tr.append(cell(name), status, cell(fmtNum(c.lag_events), "num"), cell(seconds, "num"), cell(offsets, "offsets"));
      if (c.group_commit_error) tr.title = `Kafka consumer group copy failing (${c.group_commits_failed}): ${c.group_commit_error}`;
      return tr;
    }));
  }

  let corrections = 0;
  function onCorrection(c) {
    corrections += 1;
    $("corrections-empty").hidden = true;
    $("corrections-count").textContent = String(corrections);
    const li = document.createElement("li");
    li.dataset.testid = "correction";
    li.className = "correction";
    const dims = Object.entries(c.dims || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    const oldN = c.old ? c.old.count : "?", newN = c.new ? c.new.count : "?";
    li.innerHTML = "<b></b> <span class='when'></span><br><span class='what'></span><br><span class='dims'></span>";
    li.querySelector("b").textContent = c.stream;
    li.querySelector(".when").textContent = `${fmtTime(c.pane_start_ms)}–${fmtTime(c.pane_end_ms)}`;
    li.querySelector(".what").textContent =
      `rev ${c.revision_from}→${c.revision_to} · +${c.events_added} events · count ${oldN}→${newN}` +
      (c.batch_id !== undefined ? ` · batch ${c.batch_id}` : "");
    li.querySelector(".dims").textContent = dims;
    li.title = JSON.stringify({ old: c.old, new: c.new }, null, 1);
    const list = $("corrections-list");
    list.prepend(li);
    while (list.children.length > 50) list.lastChild.remove();
    for (const chart of state.charts.values()) chart.addCorrection(c);
  }

  // ---------------------------------------------------------------- explorer and URL state
  // The form never submits (Enter in the filter box would reload the page); a listener, not an
  // inline onsubmit: the CSP allows no inline script.
  document.getElementById("explorer").addEventListener("submit", (ev) => ev.preventDefault());

  const controls = ["metric", "stat", "group-by", "filter", "range", "from", "to", "step"];
  function readUrl() {
    const q = new URLSearchParams(location.search);
    return {
      metric: q.get("metric"), stat: q.get("stat"), group_by: q.get("group_by") || "", filter: q.get("filter") || "",
      range: q.get("range") || "15m", from: q.get("from") || "", to: q.get("to") || "", step: q.get("step") || "auto",
    };
  }
  function writeUrl(v) {
    const q = new URLSearchParams(location.search);
    const set = (k, val, dflt) => (val && val !== dflt ? q.set(k, val) : q.delete(k));
    set("metric", v.metric); set("stat", v.stat); set("group_by", v.group_by); set("filter", v.filter);
    set("range", v.range, "15m"); set("step", v.step, "auto");
    set("from", v.range === "custom" ? v.from : ""); set("to", v.range === "custom" ? v.to : "");
    const url = `${location.pathname}${q.toString() ? "?" + q.toString() : ""}`;
    if (url !== location.pathname + location.search) history.replaceState(null, "", url);
  }
  function statOptions(metric) {
    const out = [["count", "count"], ["rate", "rate (/s)"]];
    if (metric.value) {
      out.push(["band", "p50–p99 band"], ["avg", "avg"], ["sum", "sum"], ["min", "min"], ["max", "max"]);
      for (const p of PERCENTILES) out.push([p, p]);
    }
    if (metric.distinct) out.push(["distinct", "distinct"]);
    return out;
  }
  function fill(select, options, value) {
    select.innerHTML = "";
    for (const [v, label] of options) {
      const o = document.createElement("option");
      o.value = v; o.textContent = label;
      select.appendChild(o);
    }
    if (options.some(([v]) => v === value)) select.value = value;
  }
  function explorerValues() {
    return {
      metric: $("metric").value, stat: $("stat").value, group_by: $("group-by").value, filter: $("filter").value.trim(),
      range: $("range").value, from: $("from").value, to: $("to").value, step: $("step").value,
    };
  }
  function queryOf(v) {
    const q = { metric: v.metric };
    if (v.stat === "band") q.stats = BAND; else q.stat = v.stat;
    if (v.range === "custom") {
      const from = v.from ? new Date(v.from) : new Date(Date.now() - 3600e3);
      const to = v.to ? new Date(v.to) : new Date();
      q.from = String(from.getTime());
      q.to = String(to.getTime());
      if (v.step !== "auto") q.step = v.step;
    } else {
      q.from = `now-${v.range}`;
      q.to = "now";
      q.step = v.step === "auto" ? AUTO_STEP[v.range] : v.step;
    }
    if (v.group_by) q.group_by = [v.group_by];
    if (v.filter) q.filter = v.filter.split(",").map((s) => s.trim()).filter(Boolean);
    return q;
  }
  function syncControls(v) {
    const metric = state.metrics[v.metric];
    fill($("stat"), statOptions(metric), v.stat);
    if ($("stat").value !== v.stat) $("stat").value = metric.value ? "band" : "count";
    fill($("group-by"), [["", "(none)"], ...metric.dimensions.map((d) => [d, d])], v.group_by);
    $("custom-range").hidden = $("range").value !== "custom";
  }

  let mainSeq = 0;
  function applyExplorer(conn) {
    const v = explorerValues();
    syncControls(v);
    const fixed = explorerValues();
    writeUrl(fixed);
    const metric = state.metrics[fixed.metric];
    const statText = $("stat").selectedOptions[0] ? $("stat").selectedOptions[0].textContent : fixed.stat;
    $("main-title").textContent = `${metric.name} · ${statText}${fixed.group_by ? " by " + fixed.group_by : ""}` +
      `${fixed.filter ? " · " + fixed.filter : ""}${metric.unit ? " (" + metric.unit + ")" : ""}`;
    const old = `main-${mainSeq}`;
    if (conn.subs.has(old)) { conn.send({ type: "unsubscribe", id: old }); conn.subs.delete(old); }
    mainSeq += 1;
    const chart = state.charts.get("main");
    chart.opts.band = fixed.stat === "band";
    chart.opts.errorBars = fixed.stat === "distinct";
    chart.zoomed = false;
    const query = queryOf(fixed);
    chart.reset(query);
    conn.subscribe(`main-${mainSeq}`, query, chartHandler(chart));
  }

  async function start() {
    const conn = new Connection();
    state.conn = conn;
    state.charts.set("main", new LiveChart($("chart-main"), { band: false }));
    const answer = await fetch("/api/v1/metrics").then((r) => r.json());
    for (const m of answer.metrics) state.metrics[m.name] = m;
    const names = Object.keys(state.metrics);
    fill($("metric"), names.map((n) => [n, n]), null);
    const v = readUrl();
    $("metric").value = names.includes(v.metric) ? v.metric : (names.includes("latency") ? "latency" : names[0]);
    $("range").value = RANGES[v.range] || v.range === "custom" ? v.range : "15m";
    $("step").value = [...$("step").options].some((o) => o.value === v.step) ? v.step : "auto";
    $("filter").value = v.filter;
    $("from").value = v.from; $("to").value = v.to;
    syncControls({ ...v, metric: $("metric").value, stat: v.stat || "band" });
    for (const id of controls) $(id).addEventListener("change", () => applyExplorer(conn));
    applyExplorer(conn);

    const overview = [
      ["rate", "chart-rate", { metric: "requests", stat: "rate", group_by: ["endpoint"] }, {}],
      ["latency", "chart-latency", { metric: "latency", stats: BAND }, { band: true }],
      ["avg", "chart-avg", { metric: "latency", stat: "avg", group_by: ["region"] }, {}],
      ["users", "chart-users", { metric: "requests", stat: "distinct" }, { errorBars: true }],
    ];
    for (const [name, el, q, opts] of overview) {
      if (!state.metrics[q.metric]) { $(el).closest(".panel").hidden = true; continue; }
      const chart = new LiveChart($(el), opts);
      state.charts.set(name, chart);
      const query = { ...q, from: "now-15m", to: "now", step: "10s" };
      chart.reset(query);
      conn.subscribe(`overview-${name}`, query, chartHandler(chart));
    }
    setInterval(() => { // relative ranges slide with time; 'x s ago' counts up
      for (const chart of state.charts.values()) if (chart.relative && chart.result) { chart.trim(); chart.schedule(); }
      updateLastBatch();
    }, 1000);
  }

  $("theme-toggle").addEventListener("click", () => {
    const next = document.documentElement.dataset.theme === "light" ? "dark" : "light";
    document.documentElement.dataset.theme = next;
    try { localStorage.setItem("sketchboard.theme", next); } catch (e) { /* private mode */ }
    for (const chart of state.charts.values()) chart.schedule();
    if (lag.plotted) {
      Plotly.relayout("lag-chart-events", lagLayout("lag (events)"));
      Plotly.relayout("lag-chart-seconds", lagLayout("lag (seconds)"));
    }
  });

  window.sketchboard = state; // for the browser tests and for poking around in the console
  start().catch((e) => { console.error("sketchboard: could not start", e); setConnState("closed", "error: " + e.message); });
})();
