// The explorer: any metric, stat, group-by and filter over the page's time range, in the
// big chart, its choices from GET /api/v1/metrics and its state in the URL.

import { $, BAND, el, fillSelect, setUrlParams, splitPairs, statChoices, urlParams } from "./util.js";
import { chartHandler } from "./connection.js";
import { LiveChart } from "./chart.js";

export class Explorer {
  constructor(page) {
    this.page = page; // {metrics, panes, conn, time, charts, onZoom, onZoomOut}
    this.chart = new LiveChart($("chart-main"), { onZoom: page.onZoom, onZoomOut: page.onZoomOut });
    page.charts.set("main", this.chart);
    // The form never submits (Enter in the filter box would reload the page); a listener, not an
    // inline onsubmit: the CSP allows no inline script.
    $("explorer").addEventListener("submit", (ev) => ev.preventDefault());
  }

  start() {
    const metrics = this.page.metrics, names = Object.keys(metrics);
    fillSelect($("metric"), names.map((n) => [n, n]), null);
    const q = urlParams();
    // With no choice in the URL: the first metric with a value (its percentiles say the most).
    const first = names.find((n) => metrics[n].value) || names[0];
    $("metric").value = names.includes(q.get("metric")) ? q.get("metric") : first;
    $("filter").value = q.get("filter") || "";
    this.sync(q.get("stat") || "band", q.get("group_by") || "");
    for (const id of ["metric", "stat", "group-by", "filter"]) $(id).addEventListener("change", () => this.apply());
    this.apply();
  }

  sync(stat, groupBy) {
    const metric = this.page.metrics[$("metric").value];
    fillSelect($("stat"), statChoices(metric), stat);
    if ($("stat").value !== stat) $("stat").value = metric.value ? "band" : "count";
    fillSelect($("group-by"), [["", "(none)"], ...metric.dimensions.map((d) => [d, d])], groupBy);
    // Placeholders from the metric's own dimensions, never from a configuration's names.
    const dims = metric.dimensions;
    $("filter").placeholder = dims.length ? dims.slice(0, 2).map((d) => `${d}=…`).join(", ") : "no dimensions";
    $("filter").disabled = !dims.length;
  }

  apply() {
    this.sync($("stat").value, $("group-by").value);
    const v = { metric: $("metric").value, stat: $("stat").value, group_by: $("group-by").value, filter: $("filter").value.trim() };
    setUrlParams(v);
    const metric = this.page.metrics[v.metric];
    const statText = $("stat").selectedOptions[0] ? $("stat").selectedOptions[0].textContent : v.stat;
    $("main-title").replaceChildren(`${metric.name} · ${statText}${v.group_by ? " by " + v.group_by : ""}` +
      `${v.filter ? " · " + v.filter : ""}${metric.unit ? " (" + metric.unit + ")" : ""}`,
    el("small", { class: "reason time-label" }, [this.page.time.describe()]));
    this.chart.opts.band = v.stat === "band";
    this.chart.opts.errorBars = v.stat === "distinct";
    const query = { metric: v.metric, ...this.page.time.query(this.page.panes[metric.stream]) };
    if (v.stat === "band") query.stats = BAND; else query.stat = v.stat;
    if (v.group_by) query.group_by = [v.group_by];
    if (v.filter) query.filter = splitPairs(v.filter);  // a value may hold commas (util.js PAIR_SEPARATOR)
    this.chart.reset(query);
    // Under the same id: the server replaces the subscription (docs/websocket.md), one message
    // rather than an unsubscribe and a subscribe.
    this.page.conn.subscribe("main", query, chartHandler(this.chart));
    // The same series over REST (one stat there: a band's p99).
    const rest = new URLSearchParams({ metric: v.metric, stat: v.stat === "band" ? "p99" : v.stat,
      from: query.from, to: query.to, step: query.step });
    for (const g of query.group_by || []) rest.append("group_by", g);
    for (const f of query.filter || []) rest.append("filter", f);
    $("query-link").href = `/api/v1/query?${rest}`;
  }
}
