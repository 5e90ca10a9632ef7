// The page's one time range, shared by the explorer and every panel of the dashboard: a
// relative one ("last 15 m") keeps moving with the server's clock, an absolute one (custom, or
// a drag on any chart) stays still. Kept in the URL (range, from, to, step) so a link shows the
// same thing; a double click on a chart goes back to the range before the zoom. A custom range's
// from and to are instants: epoch ms in the URL (the same window in every time zone), local
// wall time only in the inputs (an old link's zone-less local form is still read).

import { $, autoStep, el, inputLocal, parseDuration, parseLocal, setUrlParams, urlParams } from "./util.js";

const CONTROLS = ["range", "from", "to", "step"];

export class TimeRange {
  constructor(onChange) {
    this.onChange = onChange;
    this.previous = [];
    for (const id of CONTROLS) $(id).addEventListener("change", () => this.changed());
  }

  // From the URL, else the dashboard's default range (e.g. "1h").
  load(defaultRange) {
    const q = urlParams();
    this.set(q.get("range") || defaultRange || "15m", instant(q.get("from")), instant(q.get("to")), q.get("step") || "auto");
  }

  // from, to: epoch ms, or null
  set(range, from, to, step) {
    if (range !== "custom" && parseDuration(range) === null) range = "15m";
    if (range !== "custom") this.ensureOption(range);
    $("range").value = range;
    this.from = Number.isFinite(from) ? from : null;
    this.to = Number.isFinite(to) ? to : null;
    $("from").value = this.from === null ? "" : inputLocal(this.from);
    $("to").value = this.to === null ? "" : inputLocal(this.to);
    $("step").value = [...$("step").options].some((o) => o.value === step) ? step : "auto";
    this.sync();
  }

  ensureOption(range) { // a dashboard's default range that the menu lacks, e.g. 30m
    if ([...$("range").options].some((o) => o.value === range)) return;
    const custom = [...$("range").options].find((o) => o.value === "custom");
    $("range").insertBefore(el("option", { value: range }, [`last ${range}`]), custom);
  }

  sync() {
    $("custom-range").hidden = $("range").value !== "custom";
    const v = this.values();
    setUrlParams({ range: v.range, from: v.range === "custom" ? v.from : null, to: v.range === "custom" ? v.to : null,
      step: v.step === "auto" ? null : v.step });
  }

  changed() {
    this.previous = [];
    // The inputs changed (or not): their local wall time, else what was there.
    const from = instant($("from").value), to = instant($("to").value);
    if (from === null || from !== instant(inputLocal(this.from ?? NaN))) this.from = from;
    if (to === null || to !== instant(inputLocal(this.to ?? NaN))) this.to = to;
    this.sync();
    this.onChange();
  }

  reset(range) { this.previous = []; this.set(range, null, null, "auto"); } // the caller redraws

  // from, to: epoch ms or null
  values() { return { range: $("range").value, from: this.from ?? null, to: this.to ?? null, step: $("step").value }; }

  get relative() { return $("range").value !== "custom"; }

  // The from/to/step of a query over this range: `step` the panel's own, else the step menu's,
  // else about 120 points, a whole number of the stream's pane.
  query(paneMs, step) {
    const v = this.values();
    const chosen = step || (v.step !== "auto" ? v.step : null);
    if (v.range !== "custom") {
      return { from: `now-${v.range}`, to: "now", step: chosen || autoStep(parseDuration(v.range), paneMs) };
    }
    const to = v.to ?? Date.now();
    const from = v.from ?? to - 3600e3;
    return { from: String(from), to: String(to), step: chosen || autoStep(Math.max(1000, to - from), paneMs) };
  }

  zoom(startMs, endMs) {
    if (!(endMs > startMs)) return;
    this.previous.push(this.values());
    this.set("custom", Math.floor(startMs / 1000) * 1000, Math.ceil(endMs / 1000) * 1000, $("step").value);
    this.onChange();
  }

  zoomOut() {
    const back = this.previous.pop();
    if (!back) return;
    this.set(back.range, back.from, back.to, back.step);
    this.onChange();
  }

  describe() {
    const v = this.values();
    const show = (ms) => (ms === null ? "…" : inputLocal(ms).replace("T", " "));
    return v.range === "custom" ? `${show(v.from)} – ${show(v.to)}` : `last ${v.range}`;
  }
}

// A URL's or an input's time -> epoch ms (null: none): epoch ms, an ISO time with its offset or
// Z, or (an input's value, an old link's) local wall time with no zone.
function instant(text) {
  const s = String(text ?? "").trim();
  if (!s) return null;
  if (/^-?\d+$/.test(s)) return Number(s);
  const ms = /(Z|[+-]\d\d:?\d\d)$/i.test(s) ? Date.parse(s) : parseLocal(s);
  return Number.isFinite(ms) ? ms : null;
}
