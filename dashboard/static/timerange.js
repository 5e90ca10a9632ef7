// The page's one time range, shared by the explorer and every panel of the dashboard: a
// relative one ("last 15 m") keeps moving with the server's clock, an absolute one (custom, or
// a drag on any chart) stays still. Kept in the URL (range, from, to, step) so a link shows the
// same thing; a double click on a chart goes back to the range before the zoom.

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
    this.set(q.get("range") || defaultRange || "15m", q.get("from") || "", q.get("to") || "", q.get("step") || "auto");
  }

  set(range, from, to, step) {
    if (range !== "custom" && parseDuration(range) === null) range = "15m";
    if (range !== "custom") this.ensureOption(range);
    $("range").value = range;
    $("from").value = from || "";
    $("to").value = to || "";
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

  changed() { this.previous = []; this.sync(); this.onChange(); }

  reset(range) { this.previous = []; this.set(range, "", "", "auto"); } // the caller redraws

  values() { return { range: $("range").value, from: $("from").value, to: $("to").value, step: $("step").value }; }

  get relative() { return $("range").value !== "custom"; }

  // The from/to/step of a query over this range: `step` the panel's own, else the step menu's,
  // else about 120 points, a whole number of the stream's pane.
  query(paneMs, step) {
    const v = this.values();
    const chosen = step || (v.step !== "auto" ? v.step : null);
    if (v.range !== "custom") {
      return { from: `now-${v.range}`, to: "now", step: chosen || autoStep(parseDuration(v.range), paneMs) };
    }
    const to = v.to ? parseLocal(v.to) : Date.now();
    const from = v.from ? parseLocal(v.from) : to - 3600e3;
    return { from: String(from), to: String(to), step: chosen || autoStep(Math.max(1000, to - from), paneMs) };
  }

  zoom(startMs, endMs) {
    if (!(endMs > startMs)) return;
    this.previous.push(this.values());
    this.set("custom", inputLocal(Math.floor(startMs / 1000) * 1000), inputLocal(Math.ceil(endMs / 1000) * 1000), $("step").value);
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
    return v.range === "custom" ? `${v.from.replace("T", " ")} – ${v.to.replace("T", " ")}` : `last ${v.range}`;
  }
}
