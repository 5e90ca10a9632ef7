// Reprocessing runs (docs/reprocessing.md): each run's state, offsets done / to do, events/s, ETA
// and a progress bar, the time from which its output is complete, and the streams whose definition
// changed. Polled from GET /api/v1/reprocess every few seconds (the status feed does not carry runs),
// only while the API has the route. A run that has caught up and is not served gets a Switch
// button when the page's token may switch (admin scope: probed once with GET /api/v1/audit, which
// needs it; an open service has no tokens and allows it), else the exact curl command to run.
// Built with textContent only: names come from the server.

import { $, call, el, fmtNum, hasRoute } from "./util.js";

const API = "/api/v1/reprocess";
const POLL_MS = 2000;

const state = { admin: null, busy: new Set(), messages: new Map(), last: null };

function fmtDate(ms) {
  const d = new Date(ms);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function fmtEta(s) {
  if (s === null || s === undefined) return "ETA –";
  if (s < 60) return `ETA ${Math.round(s)} s`;
  if (s < 3600) return `ETA ${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `ETA ${(s / 3600).toFixed(1)} h`;
}

function curlFor(run) {
  return `curl -X POST -H "Authorization: Bearer $ADMIN_TOKEN" ${location.origin}${API}/${run.id}/switch`;
}

function switchable(run) { return run.state === "caught_up" && !run.serving; }

async function isAdmin() {
  if (state.admin !== null) return state.admin;
  if (!(await hasRoute("/api/v1/audit"))) return (state.admin = true); // no audit: an open service
  const r = await call("GET", "/api/v1/audit?limit=1");
  state.admin = r.ok;
  return state.admin;
}

async function doSwitch(run) {
  state.busy.add(run.id);
  state.messages.set(run.id, "switching…");
  render();
  const r = await call("POST", `${API}/${encodeURIComponent(run.id)}/switch`);
  state.busy.delete(run.id);
  if (r.ok && r.body.switching) { // read on first (a join's: in step) by a child process
    state.messages.set(run.id, r.body.message);
  } else if (r.ok) {
    state.messages.set(run.id, `switched: ${r.body.stream} is served from version ${r.body.serving_version.slice(0, 8)};` +
      ` the old output is kept as ${r.body.previous} (switch to it to switch back)`);
  } else {
    const why = r.body && typeof r.body.detail === "string" ? r.body.detail : `HTTP ${r.status}`;
    state.messages.set(run.id, `not switched (${r.status}): ${why}`);
    if (r.status === 401 || r.status === 403) state.admin = false; // show the command instead
  }
  await poll();
}

function runRow(run) {
  const p = run.progress;
  const pct = Math.round(p.fraction * 1000) / 10;
  // Offsets done / to do per partition (a table's run: of the streams enriched from it too), as the CLI's bar shows them.
  const perPartition = p.partitions.map((q) =>
    `${q.stream && q.stream !== run.stream ? q.stream + " " : ""}p${q.partition} ${fmtNum(q.done)}/${fmtNum(q.to_do)}`).join(" · ");
  const bar = el("progress", { max: "1", value: String(p.fraction), "data-testid": "reprocess-progress", title: perPartition });
  const badge = el("span", { class: "badge", "data-state": run.state }, [run.state]);
  if (run.error) badge.title = run.error;
  const head = el("div", { class: "reprocess-head" }, [el("b", {}, [run.id]), " ", badge,
    run.serving ? el("span", { class: "badge serving" }, ["serving"]) : null]);
  const numbers = el("div", { class: "reprocess-numbers", "data-testid": "reprocess-numbers" }, [
    `${pct}% · ${fmtNum(p.done)}/${fmtNum(p.to_do)} offsets · ` +
    (p.events_per_s === null || p.events_per_s === undefined ? "– ev/s" : `${fmtNum(p.events_per_s)} ev/s`) +
    ` · ${fmtEta(p.eta_s)}`]);
  const complete = el("div", { class: "reason", "data-testid": "reprocess-complete-from" },
    [`complete from ${fmtDate(run.complete_from_ms)}`]);
  const partitions = el("div", { class: "reprocess-partitions", "data-testid": "reprocess-partitions" }, [perPartition]);
  const li = el("li", { class: "reprocess-run", "data-run": run.id, "data-state": run.state },
    [head, bar, numbers, partitions, complete]);
  if (switchable(run)) {
    if (state.admin) {
      const button = el("button", { type: "button", "data-testid": "reprocess-switch" }, ["Switch"]);
      button.title = `serve this output: ${run.stream} from version ${run.version.slice(0, 8)}`;
      button.disabled = state.busy.has(run.id);
      button.addEventListener("click", () => doSwitch(run));
      li.append(button);
    } else {
      li.append(el("div", { class: "reason" }, ["switching needs a token with the admin scope:"]),
        el("code", { class: "reprocess-curl", "data-testid": "reprocess-curl" }, [curlFor(run)]));
    }
  }
  const message = state.messages.get(run.id);
  if (message) li.append(el("div", { class: "reason", "data-testid": "reprocess-message" }, [message]));
  return li;
}

function render() {
  const body = state.last;
  if (!body) return;
  const panel = $("reprocess-panel");
  const changed = Object.entries(body.changed || {});
  panel.hidden = !body.runs.length && !changed.length;
  $("reprocess-changed").replaceChildren(...changed.map(([stream, c]) => el("li", { "data-stream": stream }, [
    `${stream}: definition changed (served ${c.serving_version.slice(0, 8)}, configured ${c.configured_version.slice(0, 8)})`,
    " — ", el("code", {}, [`sketchboard reprocess ${stream}`])])));
  $("reprocess-runs").replaceChildren(...body.runs.slice().reverse().map(runRow)); // newest first
  panel.dataset.updates = String(+(panel.dataset.updates || 0) + 1);
}

async function poll() {
  const r = await call("GET", API);
  if (!r.ok) return;
  state.last = r.body;
  if (r.body.runs.some(switchable)) await isAdmin();
  render();
}

async function start() {
  if (!$("reprocess-panel") || !(await hasRoute(API))) return;
  await poll();
  setInterval(() => { poll().catch(() => {}); }, POLL_MS);
}

start().catch((e) => console.warn("sketchboard: reprocessing panel", e));
