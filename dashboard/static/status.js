// The status strip (pipeline rates, last batch, the Spark query's health, lag), the consumer-lag
// panel and the corrections list, fed by the websocket's topic messages.

import { $, PALETTE, cssVar, fmtHover, fmtNum, fmtTime, nowMs, clock, plotlyText, timeTicks } from "./util.js";

const LAG_CHART_MS = 1000; // the lag charts are redrawn at most this often (see onLag)

export class StatusPanels {
  // onCorrection(c): also marks the charts showing the corrected pane
  constructor(onCorrection) {
    this.onCorrectionHook = onCorrection;
    this.lastPipeline = null;
    this.lastLagStatus = null;
    this.lag = { keys: [], plotted: false, pending: [], timer: null, drawnAt: 0, consumers: null };
    this.corrections = 0;
    this.dropped = 0;
  }

  handle(msg) {
    switch (msg.type) {
      case "pipeline": this.onPipeline(msg); break;
      case "lag": this.onLag(msg); break;
      case "correction": this.onCorrection(msg); break;
      case "alert": window.dispatchEvent(new CustomEvent("sketchboard:alert", { detail: msg })); break; // alerts.js
      case "dropped":
        this.dropped += msg.count;
        $("status-connection").title = `${this.dropped} messages coalesced or dropped (slow connection)`;
        break;
      default: break;
    }
  }

  onPipeline(m) {
    this.lastPipeline = m;
    if (m.at_ms) clock.skewMs = m.at_ms - Date.now();
    $("status-events-in").textContent = `${fmtNum(m.events_in_per_second)} ev/s in`;
    $("status-aggregated").textContent = `${fmtNum(m.events_aggregated_per_second)} ev/s aggregated`;
    // Which partition holds a stream's watermark back, only while the lag status says the
    // pipeline is behind: with live traffic some partition almost always has a few unread records.
    const held = Object.entries(m.watermark_held_by || {});
    const behind = held.length && m.lag_events > 0 && this.lastLagStatus && this.lastLagStatus !== "OK";
    const heldText = behind ? held.map(([stream, p]) => `${stream}/${p}`).join(", ") : "";
    $("status-lag-events").textContent = `lag ${fmtNum(m.lag_events)} events` + (heldText ? ` · watermark held by ${heldText}` : "");
    $("status-lag-events").dataset.heldBy = heldText;
    this.updateLastBatch();
    updateQuery(m.query);
    updateEnrichMisses(m.enrich_misses || {});
    updateCdc(m.cdc || []);
  }

  updateLastBatch() {
    const m = this.lastPipeline;
    if (!m || m.last_batch_id === null || m.last_batch_id === undefined) return;
    const ago = m.last_commit_ms ? Math.max(0, (nowMs() - m.last_commit_ms) / 1000) : null;
    $("status-last-batch").textContent = `batch ${m.last_batch_id}` +
      (ago === null ? "" : ` · ${fmtTime(m.last_commit_ms)} (${ago < 100 ? ago.toFixed(1) : Math.round(ago)} s ago)`);
  }

  onLag(m) {
    // The badge and reason at once (cheap); the charts at most once per LAG_CHART_MS with every
    // sample since (one extendTraces per chart). Redrawing 2 charts of a trace per partition for
    // each message (2 a second at a 500 ms sampling interval) kept a busy machine's renderer so
    // far behind that the badge showed messages from a minute before.
    this.lastLagStatus = m.status;
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
    this.lag.pending.push({ x: m.at_ms || nowMs(), rows }); // an instant: see lagLayout
    if (m.consumers) this.lag.consumers = m.consumers;
    if (!this.lag.timer) {
      const wait = Math.max(0, this.lag.drawnAt + LAG_CHART_MS - Date.now());
      this.lag.timer = setTimeout(() => this.drawLag(), wait);
    }
  }

  drawLag() {
    const lag = this.lag;
    lag.timer = null;
    lag.drawnAt = Date.now();
    const samples = lag.pending.splice(0);
    if (!samples.length) return;
    const cfg = { displaylogo: false, responsive: true, displayModeBar: false };
    if (!lag.plotted) {
      Plotly.newPlot("lag-chart-events", [], lagLayout("lag (events)"), cfg);
      Plotly.newPlot("lag-chart-seconds", [], lagLayout("lag (seconds)"), cfg);
      lag.plotted = true;
    }
    for (const { rows } of samples) {
      for (const [key] of rows) {
        if (lag.keys.includes(key)) continue;
        const color = PALETTE[lag.keys.length % PALETTE.length];
        lag.keys.push(key);
        // The key names a stream and partition from the API: text, never Plotly markup or a template.
        const trace = { type: "scatter", mode: "lines+markers", marker: { size: 3 }, name: plotlyText(key), x: [], y: [],
          customdata: [], line: { color, width: 1.5 }, hovertemplate: "%{fullData.name}<br>%{customdata}<br>%{y}<extra></extra>" };
        Plotly.addTraces("lag-chart-events", trace);
        Plotly.addTraces("lag-chart-seconds", { ...trace });
      }
    }
    // Per trace, its points of every pending sample (a partition missing from one gets no point there).
    const xs = lag.keys.map(() => []), events = lag.keys.map(() => []), seconds = lag.keys.map(() => []);
    for (const { x, rows } of samples) {
      for (const [key, ev, secs] of rows) {
        const i = lag.keys.indexOf(key);
        xs[i].push(x); events[i].push(ev); seconds[i].push(secs);
      }
    }
    const idx = lag.keys.map((_, i) => i).filter((i) => xs[i].length);
    const hovers = idx.map((i) => xs[i].map(fmtHover));
    Plotly.extendTraces("lag-chart-events", { x: idx.map((i) => xs[i]), y: idx.map((i) => events[i]), customdata: hovers },
      idx, 600);
    Plotly.extendTraces("lag-chart-seconds", { x: idx.map((i) => xs[i]), y: idx.map((i) => seconds[i]),
      customdata: hovers }, idx, 600);
    this.lagTicks();
    $("lag-chart-events").dataset.updates = String(+($("lag-chart-events").dataset.updates || 0) + 1);
    if (lag.consumers) renderConsumers(lag.consumers);
    lag.consumers = null;
  }

  lagTicks() { // local-time labels over the samples the charts hold now
    const traces = $("lag-chart-events").data || [];
    const start = Math.min(...traces.map((t) => (t.x.length ? t.x[0] : Infinity)));
    const end = Math.max(...traces.map((t) => (t.x.length ? t.x[t.x.length - 1] : -Infinity)));
    if (!(end >= start)) return;
    const { tickvals, ticktext } = timeTicks(start, end, 4);
    const ticks = { "xaxis.tickvals": tickvals, "xaxis.ticktext": ticktext };
    Plotly.relayout("lag-chart-events", ticks);
    Plotly.relayout("lag-chart-seconds", ticks);
  }

  restyle() { // the theme changed
    if (!this.lag.plotted) return;
    Plotly.relayout("lag-chart-events", lagLayout("lag (events)"));
    Plotly.relayout("lag-chart-seconds", lagLayout("lag (seconds)"));
    this.lagTicks();
  }

  onCorrection(c) {
    this.corrections += 1;
    $("corrections-empty").hidden = true;
    $("corrections-count").textContent = String(this.corrections);
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
    this.onCorrectionHook(c);
  }
}

function updateQuery(q) { // the Spark query's health (lag.feed.query_health), null before it ever started
  const elem = $("status-query");
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
  elem.dataset.state = st;
  elem.textContent = text;
  elem.title = q && q.last_error ? `last error: ${q.last_error}` :
    "the pipeline's Spark query, as its listener reports it" + (q && q.batch_id !== null && q.batch_id !== undefined ? ` (batch ${q.batch_id})` : "");
}

function lagLayout(title) {
  const grid = cssVar("--grid"), muted = cssVar("--muted");
  return {
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { color: cssVar("--text"), size: 10 },
    margin: { l: 44, r: 6, t: 18, b: 24 }, title: { text: title, font: { size: 11 }, x: 0, xanchor: "left" },
    // Instants (epoch ms) on a linear axis, labelled in local time (util.js timeTicks, set by
    // lagTicks): local date strings on a date axis drew a DST fall-back hour's samples twice over one x.
    xaxis: { type: "linear", gridcolor: grid, color: muted, zeroline: false, tickmode: "array", tickvals: [], ticktext: [] },
    yaxis: { gridcolor: grid, color: muted, rangemode: "tozero" },
    showlegend: false, hovermode: "closest", uirevision: "keep",
  };
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

// Enrichment misses: shown once any event was enriched with "" (its key had no row then).
function updateEnrichMisses(misses) {
  const el = $("status-enrich-misses");
  const parts = [];
  for (const [stream, tables] of Object.entries(misses)) {
    for (const [table, n] of Object.entries(tables)) parts.push(`${stream}→${table} ${fmtNum(n)}`);
  }
  el.hidden = parts.length === 0;
  el.textContent = parts.length ? `enrich misses: ${parts.join(", ")}` : "";
}

// CDC sources: state and lag per table; an error or a changed source schema stands out.
function updateCdc(sources) {
  const el = $("status-cdc");
  el.hidden = sources.length === 0;
  if (!sources.length) return;
  const bad = sources.some((c) => c.state === "error" || c.error || (c.schema_changed || []).length);
  el.dataset.state = bad ? "error" : sources.every((c) => c.state === "streaming") ? "ok" : "starting";
  el.textContent = "CDC " + sources.map((c) => {
    const lag = c.lag_bytes === null || c.lag_bytes === undefined ? "" :
      ` lag ${fmtNum(c.lag_bytes)} B` + (c.lag_seconds === null || c.lag_seconds === undefined ? "" : ` / ${c.lag_seconds.toFixed(1)} s`);
    const schema = (c.schema_changed || []).length ? ` · schema changed (${c.schema_changed.join(" ")})` : "";
    const progress = c.snapshot_rows_done === null || c.snapshot_rows_done === undefined ? "" :
      ` ${fmtNum(c.snapshot_rows_done)}` + (c.snapshot_rows_estimate ? ` of ~${fmtNum(c.snapshot_rows_estimate)}` : "") + " rows";
    return `${c.stream}: ${c.state}${progress}${lag}${schema}${c.error ? " · " + c.error : ""}`;
  }).join(" · ");
}
