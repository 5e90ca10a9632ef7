// Helpers every dashboard module shares: DOM, formatting, durations, the server's clock, JSON
// calls with the server's reasons, and the page's URL state. No module names a metric, stream
// or dimension: they all come from GET /api/v1/metrics and /api/v1/streams.

export const $ = (id) => document.getElementById(id);

export const PALETTE = ["#5aa9ff", "#ff7b72", "#3fb950", "#d29922", "#a371f7", "#39c5cf", "#f778ba", "#8b949e",
  "#e3b341", "#56d364"];
export const PERCENTILES = ["p50", "p90", "p95", "p99", "p99.9"];
export const BAND = ["p50", "p95", "p99"];

// The server's clock, as its heartbeats and pipeline messages tell it (a relative range ends at
// the server's "now", not at a drifting browser clock).
export const clock = { skewMs: 0 };
export const nowMs = () => Date.now() + clock.skewMs;

export function cssVar(name) { return getComputedStyle(document.documentElement).getPropertyValue(name).trim(); }

export function el(tag, attrs, children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined && v !== false) node.setAttribute(k, v);
  for (const c of children || []) if (c !== null && c !== undefined) node.append(c);
  return node;
}

export function pad(n, w) { return String(n).padStart(w || 2, "0"); }
export function fmtLocal(ms) { // Plotly's date string, in local time
  const d = new Date(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}
export function parseLocal(text) { // Plotly's or a datetime-local input's local time -> epoch ms
  return new Date(String(text).trim().replace(" ", "T")).getTime();
}
export function inputLocal(ms) { // epoch ms -> a datetime-local input's value (seconds)
  return fmtLocal(ms).slice(0, 19).replace(" ", "T");
}
// A hover's time: local, with the zone's offset, so the two instants of a DST fall-back hour
// (both 01:30 local) read apart.
export function fmtHover(ms) {
  const off = -new Date(ms).getTimezoneOffset();
  const zone = `UTC${off < 0 ? "−" : "+"}${pad(Math.floor(Math.abs(off) / 60))}:${pad(Math.abs(off) % 60)}`;
  return `${fmtLocal(ms).slice(0, 19)} (${zone})`;
}
// Charts put instants (epoch ms) on a linear x axis, never local date strings (Plotly has no
// time zones: local wall time folds a DST fall-back hour's two instants onto one x), and label
// it with these ticks in local time: about `count` of them over [start, end].
const TICK_STEPS = [1, 2, 5, 10, 15, 30].map((s) => s * 1e3).concat([1, 2, 5, 10, 15, 30].map((m) => m * 60e3),
  [1, 2, 3, 6, 12].map((h) => h * 3600e3), [1, 2, 7].map((d) => d * 86400e3));
export function timeTicks(start, end, count = 6) {
  const span = end - start;
  if (!(span > 0)) return { tickvals: [], ticktext: [] };
  const step = TICK_STEPS.find((s) => span / s <= count) || TICK_STEPS[TICK_STEPS.length - 1];
  const vals = [];
  if (step >= 86400e3) { // local midnights
    const d = new Date(start); d.setHours(0, 0, 0, 0);
    while (d.getTime() < start) d.setDate(d.getDate() + 1);
    for (; d.getTime() <= end && vals.length < 100; d.setDate(d.getDate() + step / 86400e3)) vals.push(d.getTime());
  } else { // whole steps of local time (the offset at the start), then step by step in real time
    const off = -new Date(start).getTimezoneOffset() * 60e3;
    for (let t = Math.ceil((start + off) / step) * step - off; t <= end && vals.length < 100; t += step) vals.push(t);
  }
  let lastDay = null;
  const text = vals.map((t) => {
    const s = fmtLocal(t), day = s.slice(0, 10);
    const time = step >= 86400e3 ? "" : (step < 60e3 ? s.slice(11, 19) : s.slice(11, 16));
    const label = day !== lastDay ? (time ? `${day.slice(5)} ${time}` : day) : time; // the date once a day
    lastDay = day;
    return label;
  });
  return { tickvals: vals, ticktext: text };
}
export function fmtTime(ms) { const d = new Date(ms); return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`; }
// Numbers in the browser's locale, every one through Intl (1234 and 1.234 must not both print
// "1.234", as they did in de-DE when only |v| >= 1000 was localized): from 1000 whole, every
// digit (a count of 1 234 567 is not 1 235 000), below it 4 significant digits; past 1e15 (or
// below 1e-6) in scientific notation, not hundreds of digits.
const NUM = new Intl.NumberFormat(undefined, { maximumSignificantDigits: 4 });
const NUM_WHOLE = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const NUM_SCI = new Intl.NumberFormat(undefined, { maximumSignificantDigits: 4, notation: "scientific" });
export function fmtNum(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  return (a >= 1e15 || (a > 0 && a < 1e-6) ? NUM_SCI : a >= 1000 ? NUM_WHOLE : NUM).format(v);
}
// Plotly renders its strings (trace names, hover text, annotations, titles) as pseudo-HTML:
// <a href>, <b>, <span style> ... An API-derived string (a producer's dimension value, a stream
// name, the server's reason quoting the URL) goes into Plotly through this, its & < > " as
// entities, which Plotly shows as the characters themselves (as alerts.js puts API text into
// the DOM as text nodes).
// (Plotly decodes &amp; &lt; &gt; and numeric entities, not &quot;.)
const PLOTLY_ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;" };
export function plotlyText(text) { return String(text).replace(/[&<>"]/g, (c) => PLOTLY_ENTITIES[c]); }
export function hexToRgba(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
}
export function groupLabel(group) {
  const parts = Object.entries(group || {}).map(([k, v]) => (v === "" ? `${k}=∅` : v));
  return parts.length ? parts.join(" · ") : "all";
}

const UNITS = { ms: 1, s: 1e3, m: 60e3, h: 3600e3, d: 86400e3, w: 604800e3 };
export function parseDuration(text) { // "15m" -> 900000; null when it is not a duration
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$/.exec(String(text || ""));
  return m ? Math.round(parseFloat(m[1]) * UNITS[m[2]]) : null;
}
function fmtDuration(ms) { // 900000 -> "15m"
  for (const unit of ["w", "d", "h", "m", "s"]) if (ms && ms % UNITS[unit] === 0) return `${ms / UNITS[unit]}${unit}`;
  return `${ms}ms`;
}
const NICE_STEPS = ["10s", "30s", "1m", "2m", "5m", "10m", "15m", "30m", "1h", "2h", "6h", "12h", "1d"].map(parseDuration);
// A step giving about `points` points over the span, a whole number of the stream's panes.
export function autoStep(spanMs, paneMs, points = 120) {
  const want = Math.max(spanMs / points, paneMs || 1);
  const nice = NICE_STEPS.find((s) => s >= want && (!paneMs || s % paneMs === 0));
  return fmtDuration(nice || Math.ceil(want / (paneMs || 1000)) * (paneMs || 1000));
}

export function parseList(text) { return String(text || "").split(/[,\n]/).map((s) => s.trim()).filter(Boolean); }
// A comma starts the next "k=v" item only before a name and "=" (a newline always), as the
// server splits filters (query/model.py `parse_filters`): a value may hold commas.
export const PAIR_SEPARATOR = /\n|,(?=\s*[A-Za-z_][A-Za-z0-9_]{0,62}=)/;
export function splitPairs(text) { return String(text || "").split(PAIR_SEPARATOR).map((s) => s.trim()).filter(Boolean); }
// "k=v, k2=v2" -> {k: v, k2: v2}; throws a message naming the bad item.
export function parsePairs(text, what) {
  const out = {};
  for (const item of splitPairs(text)) {
    const at = item.indexOf("=");
    if (at <= 0) throw new Error(`${what}: '${item}' is not name=value`);
    out[item.slice(0, at).trim()] = item.slice(at + 1).trim();
  }
  return out;
}
export function pairsText(obj) { return Object.entries(obj || {}).map(([k, v]) => `${k}=${v}`).join(", "); }

// FastAPI's {"detail": "..."} or, for a 422, {"detail": [{loc, msg}, ...]}.
export function detailOf(body, status) {
  if (body && typeof body.detail === "string") return body.detail;
  if (body && Array.isArray(body.detail)) {
    return body.detail.map((d) => (d.loc ? d.loc.filter((p) => p !== "body").join(".") + ": " : "") + d.msg).join("; ");
  }
  if (body && body.detail !== undefined) return JSON.stringify(body.detail);
  return `HTTP ${status}`;
}
// fetch + JSON: resolves {ok, status, body}; never rejects on an HTTP error status.
export async function call(method, url, body) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) { init.headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  const r = await fetch(url, init);
  const text = await r.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = { detail: text }; }
  return { ok: r.ok, status: r.status, body: parsed };
}

// Whether the server has a route (an API built without a component has none): asked of the
// OpenAPI document once, rather than collecting 404s the browser would log as errors.
let openapi = null;
export async function hasRoute(path) {
  openapi = openapi || fetch("/openapi.json").then((r) => (r.ok ? r.json() : null)).catch(() => null);
  const doc = await openapi;
  return !doc || !doc.paths || Object.prototype.hasOwnProperty.call(doc.paths, path);
}

// The page's state lives in the URL (shareable, survives a reload): every module reads and
// writes its own parameters here; null or "" removes one.
export function urlParams() { return new URLSearchParams(location.search); }
export function setUrlParams(values) {
  const q = urlParams();
  for (const [k, v] of Object.entries(values)) {
    if (v === null || v === undefined || v === "") q.delete(k); else q.set(k, String(v));
  }
  const url = `${location.pathname}${q.toString() ? "?" + q.toString() : ""}`;
  if (url !== location.pathname + location.search) history.replaceState(null, "", url);
}

// The stat choices of a metric, from its `stats` in GET /api/v1/metrics ("pNN": any percentile).
export function statChoices(metric, { band = true } = {}) {
  const out = [];
  for (const s of metric.stats || []) {
    if (s === "pNN") {
      if (band) out.push(["band", "p50–p99 band"]);
      for (const p of PERCENTILES) out.push([p, p]);
    } else out.push([s, s === "rate" ? "rate (/s)" : s.replace("_", " ")]);
  }
  return out;
}
export function fillSelect(select, options, value) {
  select.replaceChildren(...options.map(([v, label]) => el("option", { value: v }, [label])));
  if (options.some(([v]) => v === value)) select.value = value;
}
