// The dashboard area: the dashboards of GET /api/v1/dashboards (provisioned, saved, or the one
// generated from the catalog), the chosen one's panels drawn over the page's time range, each
// one websocket subscription. The chosen dashboard is in the URL (`dashboard=`). Every few
// seconds the list is asked again: a dashboard changed or deleted elsewhere (the API, another
// page) is announced with a button that reloads it, as Grafana does, rather than drawn stale.

import { $, BAND, el, call, hasRoute, parseDuration, setUrlParams, urlParams } from "./util.js";
import { chartHandler } from "./connection.js";
import { LiveChart } from "./chart.js";
import { HEATMAP_STATS } from "./heatmap.js";

const API = "/api/v1/dashboards";
const CHECK_MS = 5000; // how often the shown dashboard's version is compared with the server's

function panelQuery(panel, time, paneMs) {
  const q = { metric: panel.metric, ...time.query(paneMs, panel.step) };
  if (panel.kind === "heatmap") q.stats = HEATMAP_STATS;
  else if (panel.stat === "band") q.stats = BAND;
  else q.stat = panel.stat;
  if (panel.group_by && panel.group_by.length && panel.kind !== "heatmap") q.group_by = panel.group_by;
  if (panel.filters && Object.keys(panel.filters).length) q.filters = panel.filters;
  if (panel.window) q.window = panel.window;
  return q;
}

export function panelTitle(panel, metric) {
  if (panel.title) return panel.title;
  const stat = panel.kind === "heatmap" ? "distribution" : panel.stat === "band" ? "p50 · p95 · p99" : panel.stat;
  const by = panel.group_by && panel.group_by.length && panel.kind !== "heatmap" ? ` by ${panel.group_by.join(", ")}` : "";
  return `${panel.metric} · ${stat}${by}${metric && metric.unit ? ` (${metric.unit})` : ""}`;
}

export class Dashboards {
  constructor(page) {
    this.page = page; // {metrics, panes, conn, time, charts, onZoom, onZoomOut}
    this.list = [];
    this.current = null; // the chosen dashboard, as the API shows it
    this.subs = [];
    this.enabled = false;
    this.ready = false; // panels are drawn once the page's time range is known
    this.listeners = []; // called after a dashboard is shown (the editor)
  }

  get editable() { return !!this.current && this.current.source !== "file"; }

  async start() {
    this.enabled = await hasRoute(API);
    if (!this.enabled) {
      $("dashboard-area").hidden = true;
      return null;
    }
    $("dashboard-select").addEventListener("change", () => this.choose($("dashboard-select").value, true));
    $("dashboard-notice-reload").addEventListener("click", () => this.reload($("dashboard-notice").dataset.reload || null, true));
    await this.reload(urlParams().get("dashboard"));
    setInterval(() => this.check(), CHECK_MS);
    return this.current;
  }

  // preferred: the dashboard to show; one that does not exist (a stale link, one deleted) is
  // said so rather than switched away from silently.
  async reload(preferred, resetTime = false) {
    const answer = await call("GET", API);
    this.list = answer.ok ? answer.body.dashboards : [];
    $("dashboard-select").replaceChildren(...this.list.map((d) =>
      el("option", { value: d.name }, [d.title ? `${d.title} (${d.name})` : d.name])));
    const found = this.list.some((d) => d.name === preferred);
    const name = found ? preferred : (this.list[0] || {}).name;
    this.choose(name, resetTime);
    if (preferred && !found && answer.ok) {
      this.notice(`There is no dashboard named "${preferred}" (deleted, or a mistyped link)` +
        (name ? `; showing "${name}" instead.` : "."));
    }
  }

  // A message above the panels; reloadName: what its reload button shows (undefined: no button).
  notice(text, reloadName) {
    $("dashboard-notice").hidden = !text;
    $("dashboard-notice-text").textContent = text || "";
    $("dashboard-notice-reload").hidden = reloadName === undefined;
    $("dashboard-notice").dataset.reload = reloadName || "";
  }

  // A change this page sends (the editor's saves and deletes): while one is on its way, what the
  // server holds may already be it, so check() compares nothing (it took this page's own save for
  // someone else's when its answer came first).
  async saving(send) {
    this.inFlight = (this.inFlight || 0) + 1;
    try { return await send(); } finally { this.inFlight -= 1; }
  }

  // The shown dashboard changed or deleted elsewhere since it was loaded (or last saved here)?
  async check() {
    const shown = this.current;
    if (!shown || document.hidden || !$("dashboard-notice").hidden || this.inFlight) return;
    const answer = await call("GET", API);
    // A save or a switch meanwhile (or still on its way): compare next time.
    if (!answer.ok || this.current !== shown || this.inFlight) return;
    const now = answer.body.dashboards.find((d) => d.name === shown.name);
    if (!now) this.stale(shown.name, false);
    else if (now.updated_ms !== shown.updated_ms) this.stale(shown.name, true);
  }

  stale(name, changed) {
    this.notice(changed ? `Dashboard "${name}" was changed elsewhere since you loaded it: reload it to see (and edit) the current one.`
      : `Dashboard "${name}" was deleted elsewhere.`, changed ? name : null);
  }

  // resetTime: a dashboard chosen from the menu opens with its own default range.
  choose(name, resetTime) {
    this.notice(null);
    this.current = this.list.find((d) => d.name === name) || null;
    $("dashboard-select").value = name || "";
    setUrlParams({ dashboard: name });
    if (resetTime && this.current) {
      setUrlParams({ edit: null });
      this.page.time.reset(this.current.range);
    }
    if (!this.ready) return;
    this.render(); // over the new range; the explorer follows it
    if (resetTime) this.page.explorer.apply();
  }

  // Replace the chosen dashboard with what the API answered (after a save).
  replaceCurrent(saved) {
    const at = this.list.findIndex((d) => d.name === saved.name);
    if (at >= 0) this.list[at] = saved; else this.list.push(saved);
    this.current = saved;
    this.render();
  }

  render() {
    // Panel i subscribes as `panel-<i>` (a new query replaces it, docs/websocket.md): only the
    // panels the new dashboard lacks are unsubscribed.
    const count = this.current ? this.current.panels.length : 0;
    for (const id of this.subs.slice(count)) this.page.conn.unsubscribe(id);
    this.subs = this.subs.slice(0, count);
    for (const [key, chart] of [...this.page.charts]) {
      if (key.startsWith("panel-")) { chart.dispose(); this.page.charts.delete(key); }
    }
    const d = this.current;
    const area = $("panels");
    area.replaceChildren();
    $("dashboard-area").dataset.dashboard = d ? d.name : "";
    $("dashboard-source").textContent = !d ? "no dashboard" : d.source === "file" ? "provisioned · read-only"
      : d.source === "generated" ? "generated from the metrics" : "saved";
    $("dashboard-source").dataset.source = d ? d.source : "";
    $("dashboard-description").textContent = d ? d.description : "";
    if (!d) return;
    d.panels.forEach((panel, i) => {
      const metric = this.page.metrics[panel.metric];
      const chartEl = el("div", { id: `panel-chart-${i}`, class: `chart chart-small chart-${panel.kind}`, "data-testid": "panel-chart" });
      const edit = el("button", { type: "button", class: "panel-edit", "data-testid": "panel-edit", title: "edit this panel" }, ["edit"]);
      edit.hidden = !this.editable;
      edit.addEventListener("click", () => this.page.editPanel(i));
      area.append(el("div", { class: "panel dash-panel", "data-testid": "dash-panel", "data-index": String(i),
        "data-kind": panel.kind, "data-metric": panel.metric }, [el("h3", {}, [el("span", { class: "panel-title" },
        [panelTitle(panel, metric)]), edit]), chartEl]));
      const chart = new LiveChart(chartEl, { kind: panel.kind, band: panel.stat === "band", errorBars: panel.stat === "distinct",
        onZoom: this.page.onZoom, onZoomOut: this.page.onZoomOut });
      chart.slideEveryMs = d.refresh ? parseDuration(d.refresh) : null;
      this.page.charts.set(`panel-${i}`, chart);
    });
    this.subscribe();
    for (const f of this.listeners) f(d);
  }

  // (Again) over the page's time range: one subscribe per panel under its stable id, which
  // replaces the panel's subscription on the server (no unsubscribe: a range change on a big
  // dashboard must stay within the server's per-socket message rate).
  subscribe() {
    if (!this.current) return;
    this.current.panels.forEach((panel, i) => {
      const chart = this.page.charts.get(`panel-${i}`);
      const metric = this.page.metrics[panel.metric];
      const id = `panel-${i}`;
      this.subs[i] = id;
      const query = panelQuery(panel, this.page.time, metric ? this.page.panes[metric.stream] : null);
      chart.reset(query);
      this.page.conn.subscribe(id, query, chartHandler(chart));
    });
  }
}
