// Building dashboards in the page: new, duplicate, settings (title, range, refresh) and delete
// for the dashboard; add, edit and remove for its panels. Every change is saved through
// /api/v1/dashboards, whose 400s name the field at fault. A change names the version it edited
// (`updated_ms`): one made elsewhere since is not overwritten, the server's 409 is shown with a
// button that reloads the dashboard (a 404: it was deleted meanwhile). The panel being edited is in the URL
// (`edit=<index>` or `edit=new`), so a link opens the editor on it. Choices and placeholders come
// from GET /api/v1/metrics.

import { $, call, detailOf, el, fillSelect, pairsText, parsePairs, setUrlParams, statChoices, urlParams } from "./util.js";
import { panelTitle } from "./panels.js";

const API = "/api/v1/dashboards";
const KINDS = [["line", "line"], ["area", "area / band"], ["bar", "bar"], ["stat", "single value"],
  ["heatmap", "heatmap (distribution)"], ["table", "table of top groups"]];

export class Editor {
  constructor(page, dashboards) {
    this.page = page;
    this.dashboards = dashboards;
    this.editing = null; // a panel index, "new", or null
  }

  start() {
    const metrics = Object.keys(this.page.metrics);
    fillSelect($("pe-metric"), metrics.map((n) => [n, n]), metrics[0]);
    fillSelect($("pe-kind"), KINDS, "line");
    $("pe-metric").addEventListener("change", () => this.choices());
    $("pe-kind").addEventListener("change", () => this.choices());
    $("panel-editor").addEventListener("submit", (ev) => { ev.preventDefault(); this.applyPanel(); });
    $("panel-cancel").addEventListener("click", () => this.close());
    $("panel-remove").addEventListener("click", () => this.removePanel());
    $("panel-add").addEventListener("click", () => this.open("new"));
    $("dashboard-new").addEventListener("click", () => this.openForm("create"));
    $("dashboard-duplicate").addEventListener("click", () => this.openForm("duplicate"));
    $("dashboard-settings").addEventListener("click", () => this.openForm("settings"));
    $("dashboard-delete").addEventListener("click", () => this.deleteDashboard());
    $("dashboard-form").addEventListener("submit", (ev) => { ev.preventDefault(); this.submitForm(); });
    $("dashboard-form-cancel").addEventListener("click", () => { $("dashboard-form").hidden = true; });
    this.dashboards.listeners.push(() => this.shown());
    this.shown();
    const edit = urlParams().get("edit");
    if (edit !== null) this.open(edit === "new" ? "new" : Number(edit));
  }

  shown() { // a dashboard is shown: what may be done to it
    const d = this.dashboards.current, editable = this.dashboards.editable;
    for (const id of ["panel-add", "dashboard-settings", "dashboard-delete"]) $(id).disabled = !editable;
    $("dashboard-delete").disabled = !d || d.source !== "api";
    $("dashboard-duplicate").disabled = !d;
    $("dashboard-bar").dataset.editable = String(editable);
    if (this.editing !== null && (!editable || (this.editing !== "new" && !d.panels[this.editing]))) this.close();
  }

  // -------------------------------------------------------------- panels

  open(which) {
    const d = this.dashboards.current;
    if (!d || !this.dashboards.editable || (which !== "new" && !d.panels[which])) { setUrlParams({ edit: null }); return; }
    this.editing = which;
    setUrlParams({ edit: which });
    const panel = which === "new" ? { metric: $("pe-metric").value || Object.keys(this.page.metrics)[0], stat: "", kind: "line",
      group_by: [], filters: {}, title: "", window: null, step: null } : d.panels[which];
    $("panel-editor-title").textContent = which === "new" ? `New panel on ${d.title || d.name}` :
      `Panel ${which + 1}: ${panelTitle(panel, this.page.metrics[panel.metric])}`;
    $("pe-title").value = panel.title || "";
    $("pe-metric").value = panel.metric;
    $("pe-kind").value = panel.kind;
    this.choices(panel.stat, panel.group_by);
    $("pe-filters").value = pairsText(panel.filters);
    $("pe-window").value = panel.window || "";
    $("pe-step").value = panel.step || "";
    $("panel-remove").hidden = which === "new";
    $("panel-apply").textContent = which === "new" ? "add panel" : "apply";
    this.error(null);
    $("panel-editor").hidden = false;
    $("panel-editor").dataset.editing = String(which);
    for (const p of document.querySelectorAll("[data-testid=dash-panel]")) p.classList.toggle("editing", p.dataset.index === String(which));
  }

  close() {
    this.editing = null;
    setUrlParams({ edit: null });
    $("panel-editor").hidden = true;
    delete $("panel-editor").dataset.editing;
    for (const p of document.querySelectorAll("[data-testid=dash-panel].editing")) p.classList.remove("editing");
  }

  choices(stat, groupBy) { // the metric's stats and dimensions; placeholders from them
    const metric = this.page.metrics[$("pe-metric").value];
    if (!metric) return;
    const kind = $("pe-kind").value;
    const keep = stat !== undefined ? stat : $("pe-stat").value;
    fillSelect($("pe-stat"), statChoices(metric, { band: kind === "line" || kind === "area" }), keep);
    if (!$("pe-stat").value || $("pe-stat").value !== keep) $("pe-stat").value = metric.value && kind === "area" ? "band" : metric.stats[0];
    $("pe-stat").disabled = kind === "heatmap";
    const chosen = groupBy !== undefined ? groupBy : [...$("pe-group-by").selectedOptions].map((o) => o.value);
    $("pe-group-by").replaceChildren(...metric.dimensions.map((dim) => {
      const o = el("option", { value: dim }, [dim]);
      o.selected = chosen.includes(dim);
      return o;
    }));
    $("pe-group-by").disabled = !metric.dimensions.length || kind === "heatmap";
    $("pe-filters").placeholder = metric.dimensions.length ? metric.dimensions.slice(0, 2).map((dim) => `${dim}=…`).join(", ")
      : "no dimensions";
    $("pe-dimensions").textContent = metric.dimensions.length ? `dimensions: ${metric.dimensions.join(", ")}` : "";
  }

  panelFromForm() {
    const kind = $("pe-kind").value;
    const panel = { title: $("pe-title").value.trim(), metric: $("pe-metric").value, kind,
      stat: kind === "heatmap" ? "count" : $("pe-stat").value,
      group_by: kind === "heatmap" ? [] : [...$("pe-group-by").selectedOptions].map((o) => o.value),
      filters: parsePairs($("pe-filters").value, "filters") };
    if ($("pe-window").value.trim()) panel.window = $("pe-window").value.trim();
    if ($("pe-step").value.trim()) panel.step = $("pe-step").value.trim();
    return panel;
  }

  async applyPanel() {
    let panel;
    try { panel = this.panelFromForm(); } catch (e) { this.error(e.message); return; }
    const d = this.dashboards.current;
    const panels = [...d.panels];
    const index = this.editing === "new" ? panels.length : this.editing;
    panels[index] = panel;
    if (await this.save({ ...d, panels }, "panels[" + index + "]")) this.close();
  }

  async removePanel() {
    const d = this.dashboards.current;
    if (this.editing === null || this.editing === "new") return;
    if (await this.save({ ...d, panels: d.panels.filter((_, i) => i !== this.editing) })) this.close();
  }

  async save(definition, within) { // PUT the whole dashboard; the error names the field
    const answer = await this.dashboards.saving(() => call("PUT", `${API}/${encodeURIComponent(definition.name)}`, strip(definition)));
    if (!answer.ok) {
      this.conflict(answer, definition.name);
      const where = answer.body && answer.body.param ? answer.body.param : "";
      this.error(within && where.startsWith(within) ? detailOf(answer.body, answer.status).replace(within + ".", "")
        : detailOf(answer.body, answer.status));
      return false;
    }
    this.dashboards.replaceCurrent(answer.body);
    return true;
  }

  // A 409 for a stale version, or a 404 (deleted since loaded): the reason, and a reload offered.
  conflict(answer, name) {
    if (answer.status === 409 && answer.body && answer.body.param === "updated_ms") {
      this.dashboards.notice(detailOf(answer.body, answer.status), name);
    } else if (answer.status === 404) this.dashboards.stale(name, false);
  }

  error(text) {
    $("panel-editor-error").hidden = !text;
    $("panel-editor-error").textContent = text || "";
  }

  // -------------------------------------------------------------- dashboards

  openForm(mode) {
    const d = this.dashboards.current;
    const form = $("dashboard-form");
    form.dataset.mode = mode;
    $("df-heading").textContent = { create: "New dashboard", duplicate: `Duplicate ${d ? d.name : ""}`,
      settings: `Settings of ${d ? d.name : ""}` }[mode];
    $("df-name").value = mode === "duplicate" && d ? `${d.name}-copy` : mode === "settings" && d ? d.name : "";
    $("df-name").readOnly = mode === "settings";
    $("df-title").value = mode === "create" || !d ? "" : d.title;
    $("df-range").value = mode === "create" || !d ? "1h" : d.range;
    $("df-refresh").value = mode === "create" || !d ? "5s" : d.refresh || "";
    for (const id of ["df-range", "df-refresh"]) $(id).closest("label").hidden = mode === "duplicate";
    $("df-submit").textContent = { create: "create", duplicate: "duplicate", settings: "save" }[mode];
    $("dashboard-form-error").hidden = true;
    form.hidden = false;
    $("df-name").focus();
  }

  async submitForm() {
    const mode = $("dashboard-form").dataset.mode, d = this.dashboards.current;
    const name = $("df-name").value.trim(), title = $("df-title").value.trim();
    const timing = { range: $("df-range").value.trim() || "1h", refresh: $("df-refresh").value.trim() || null };
    let answer;
    if (mode === "create") answer = await call("POST", API, { name, title, ...timing, panels: [] });
    else if (mode === "duplicate") answer = await call("POST", `${API}/${encodeURIComponent(d.name)}/duplicate`, { name, title });
    else answer = await this.dashboards.saving(() => call("PUT", `${API}/${encodeURIComponent(d.name)}`, strip({ ...d, title, ...timing })));
    if (!answer.ok) {
      if (mode === "settings") this.conflict(answer, d.name);
      $("dashboard-form-error").textContent = detailOf(answer.body, answer.status);
      $("dashboard-form-error").hidden = false;
      return;
    }
    $("dashboard-form").hidden = true;
    if (mode === "settings") { this.dashboards.replaceCurrent(answer.body); return; }
    await this.dashboards.reload(answer.body.name, true); // opens with its own range
  }

  async deleteDashboard() { // two clicks: the first arms the button
    const button = $("dashboard-delete"), d = this.dashboards.current;
    if (!d) return;
    if (button.dataset.armed !== "true") {
      button.dataset.armed = "true";
      button.textContent = `really delete ${d.name}?`;
      setTimeout(() => { button.dataset.armed = "false"; button.textContent = "delete"; }, 5000);
      return;
    }
    button.dataset.armed = "false";
    button.textContent = "delete";
    const version = d.source === "api" ? `?updated_ms=${d.updated_ms}` : "";
    const answer = await this.dashboards.saving(() => call("DELETE", `${API}/${encodeURIComponent(d.name)}${version}`));
    if (!answer.ok) {
      this.conflict(answer, d.name);
      $("dashboard-source").textContent = detailOf(answer.body, answer.status);
      return;
    }
    await this.dashboards.reload(null, true);
  }
}

function strip(d) { // what GET adds to a definition, but its version: the one this change was made to
  const out = { ...d };
  for (const k of ["source", "created_ms"]) delete out[k];
  // The generated dashboard's version (0) goes too: saved as new while it is still generated, and
  // refused (409) once another page saved it first. A provisioned one is refused anyway.
  if (d.source !== "api" && d.source !== "generated") delete out.updated_ms;
  return out;
}
