// Alerts panel and rule editor (issue 6): what fires now, recent state changes, the rules with
// silence controls, and a form to create / edit / delete API rules. Talks to
//   GET /api/v1/alerts, GET|POST /api/v1/alerts/rules, PUT|DELETE /api/v1/alerts/rules/{name},
//   POST|DELETE /api/v1/alerts/rules/{name}/silence, GET /api/v1/metrics, GET /api/v1/streams
// and refreshes (debounced) on each websocket `alert` message, which status.js re-dispatches as the
// window event "sketchboard:alert"; every 15 s as well, in case a message was missed.
// Markup: #alerts-panel and #rule-editor in index.html. All API text goes in as text nodes.

import { $, PAIR_SEPARATOR, PERCENTILES, call, detailOf, el, hasRoute, pad, parseList } from "./util.js";

const API = "/api/v1/alerts";
const REFRESH_EVERY_MS = 15000;
const DEBOUNCE_MS = 250;
const HISTORY_LIMIT = 50;
const SILENCE_CHOICES = ["15m", "1h", "4h", "1d"];
const THRESHOLD_UNIT = { lag: "seconds of lag", dead_letters: "dead letters / s", trend: "ratio, diff or rate" };

const state = { rules: [], active: [], history: [], metrics: {}, streams: [], timer: null, inflight: null,
  again: false, refreshes: 0, alertMessages: 0, editing: null };
const SERVER_FIELDS = ["source", "silenced_until_ms", "created_ms", "updated_ms", "state"];

// ------------------------------------------------------------------ helpers

function isZero(duration) { return !duration || /^0+(\.0*)?[a-z]*$/.test(String(duration)); }
function hhmm(ms) { const d = new Date(ms); return pad(d.getHours()) + ":" + pad(d.getMinutes()); }
function hhmmss(ms) { const d = new Date(ms); return hhmm(ms) + ":" + pad(d.getSeconds()); }
function sameDay(a, b) { return new Date(a).toDateString() === new Date(b).toDateString(); }
function dayOf(ms) { const d = new Date(ms); return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()); }
function clock(ms) { // time of day, with the date when it is not today
  return sameDay(ms, Date.now()) ? hhmmss(ms) : dayOf(ms) + " " + hhmmss(ms);
}
function ago(ms) {
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 90) return s + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 129600) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}
function fmtValue(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 1000 ? Math.round(v).toLocaleString("en") : String(+v.toPrecision(4));
}
function silencedText(untilMs) {
  let text = "silenced until " + hhmm(untilMs);
  if (!sameDay(untilMs, Date.now())) {
    const tomorrow = new Date(); tomorrow.setDate(tomorrow.getDate() + 1);
    text += sameDay(untilMs, tomorrow.getTime()) ? " tomorrow" : " on " + dayOf(untilMs);
  }
  return text;
}
// The rule editor starts on the first metric with a value (thresholds on percentiles are the
// common rule), whatever the configuration names it.
function firstValueMetric() {
  return Object.keys(state.metrics).filter((n) => { return state.metrics[n].value; })[0] || null;
}
function ruleUrl(name) { return API + "/rules/" + encodeURIComponent(name); }
function labelPairs(labels, skip) {
  return Object.keys(labels || {}).sort().filter((k) => { return !skip || !skip(k, labels[k]); })
    .map((k) => { return k + "=" + labels[k]; });
}
function stateBadge(st) {
  return el("span", { class: "badge alert-state", "data-state": st || "normal" }, [st || "normal"]);
}

// ------------------------------------------------------------------ refresh

function refresh() {
  if (state.inflight) { state.again = true; return state.inflight; }
  state.inflight = Promise.all([
    call("GET", API + "?limit=" + HISTORY_LIMIT),
    call("GET", API + "/rules"),
  ]).then((answers) => {
    let alerts = answers[0], rules = answers[1];
    if (!alerts.ok || !rules.ok) {
      const bad = !alerts.ok ? alerts : rules;
      showUnavailable("alerts API: " + detailOf(bad.body, bad.status));
      return;
    }
    state.active = alerts.body.active || [];
    state.history = alerts.body.history || [];
    state.rules = rules.body.rules || [];
    state.refreshes += 1;
    render();
  }).catch((e) => {
    showUnavailable("alerts API unreachable: " + e.message);
  }).then(() => {
    state.inflight = null;
    if (state.again) { state.again = false; schedule(); }
  });
  return state.inflight;
}

function schedule() { // debounced: a burst of alert messages makes one refresh
  if (state.timer) clearTimeout(state.timer);
  state.timer = setTimeout(() => { state.timer = null; refresh(); }, DEBOUNCE_MS);
}

function showUnavailable(reason) {
  const panel = $("alerts-panel");
  panel.dataset.state = "error";
  $("alerts-updated").textContent = reason;
  ["alerts-active-empty", "alerts-history-empty", "alert-rules-empty"].forEach((id) => {
    if (!$(id).textContent || $(id).textContent === "loading…") $(id).textContent = "unavailable";
  });
}

function render() {
  const panel = $("alerts-panel");
  panel.dataset.state = "live";
  panel.dataset.refreshes = String(state.refreshes);
  $("alerts-updated").textContent = "updated " + hhmmss(Date.now());
  renderActive();
  renderHistory();
  renderRules();
}

function ruleByName(name) {
  for (let i = 0; i < state.rules.length; i++) if (state.rules[i].name === name) return state.rules[i];
  return null;
}
// The labels that tell an instance apart: not alertname, not the rule's own static labels.
function groupLabels(labels, ruleName) {
  let rule = ruleByName(ruleName);
  const own = (rule && rule.labels) || {};
  return labelPairs(labels, (k, v) => { return k === "alertname" || own[k] === v; });
}

function renderActive() {
  const list = $("alerts-active");
  const firing = state.active.filter((a) => { return a.state === "firing"; }).length;
  const badge = $("alerts-firing-count");
  badge.textContent = String(firing);
  badge.dataset.count = String(firing);
  badge.dataset.status = firing ? "firing" : (state.active.length ? "pending" : "none");
  const strip = $("status-alerts");
  if (strip) {
    strip.dataset.state = badge.dataset.status === "none" ? "ok" : badge.dataset.status;
    strip.textContent = firing ? firing + " alert" + (firing === 1 ? "" : "s") + " firing" :
      (state.active.length ? state.active.length + " alert" + (state.active.length === 1 ? "" : "s") + " pending"
        : "no alerts firing");
  }
  $("alerts-active-empty").textContent = "nothing firing";
  $("alerts-active-empty").hidden = state.active.length > 0;
  const order = { firing: 0, error: 1, nodata: 2, pending: 3 };
  const items = state.active.slice().sort((a, b) => {
    const d = (order[a.state] === undefined ? 9 : order[a.state]) - (order[b.state] === undefined ? 9 : order[b.state]);
    return d || (a.rule < b.rule ? -1 : a.rule > b.rule ? 1 : 0);
  }).map((a) => {
    const groups = groupLabels(a.labels, a.rule);
    const since = a.state === "firing" && a.fired_at_ms ? a.fired_at_ms : a.active_since_ms;
    const summary = a.annotations && (a.annotations.summary || a.annotations.description);
    return el("li", { class: "alert-instance", "data-rule": a.rule, "data-state": a.state,
      "data-fingerprint": a.fingerprint, "data-silenced": a.silenced ? "true" : "false" }, [
      stateBadge(a.state), " ",
      el("b", { class: "alert-rule-name" }, [a.rule]), " ",
      el("span", { class: "alert-labels" }, [groups.length ? groups.join(" ") : "(all)"]),
      a.silenced ? el("span", { class: "tag alert-silenced" }, ["silenced"]) : null,
      el("br"),
      el("span", { class: "alert-value" }, ["value " + fmtValue(a.value)]), " · ",
      el("span", { class: "alert-since", title: since ? new Date(since).toISOString() : "" },
        [since ? a.state + " since " + clock(since) + " (" + ago(since) + ")" : ""]),
      summary ? el("div", { class: "alert-summary" }, [summary]) : null,
      a.reason ? el("div", { class: "alert-reason" }, [a.reason]) : null,
    ]);
  });
  list.replaceChildren.apply(list, items);
}

function renderHistory() {
  const list = $("alerts-history");
  $("alerts-history-empty").textContent = "no state changes yet";
  $("alerts-history-empty").hidden = state.history.length > 0;
  const items = state.history.map((e) => {
    const groups = groupLabels(e.labels, e.rule);
    return el("li", { class: "alert-event", "data-rule": e.rule, "data-from": e.from_state, "data-to": e.to_state,
      "data-id": e.id, title: e.reason || "" }, [
      el("span", { class: "alert-at", title: e.at_ms ? new Date(e.at_ms).toISOString() : "" }, [clock(e.at_ms)]), " ",
      el("b", { class: "alert-rule-name" }, [e.rule]), " ",
      el("span", { class: "alert-transition" }, [
        el("span", { class: "alert-from", "data-state": e.from_state }, [e.from_state]), " → ",
        el("span", { class: "alert-to", "data-state": e.to_state }, [e.to_state])]), " ",
      el("span", { class: "alert-value" }, [fmtValue(e.value)]),
      e.corrections_since ? el("span", { class: "tag alert-corrected",
        title: "the window this was decided on was corrected since (late events); the decision stands" },
        ["window corrected " + e.corrections_since + "×"]) : null,
      groups.length ? el("div", { class: "alert-labels" }, [groups.join(" ")]) : null,
    ]);
  });
  list.replaceChildren.apply(list, items);
}

function describe(rule) { // one line saying what the rule watches
  const by = rule.group_by && rule.group_by.length ? " by " + rule.group_by.join(", ") : "";
  let where = labelPairs(rule.filters).join(", ");
  where = where ? " where " + where : "";
  const cmp = rule.op !== undefined && rule.op !== null && rule.threshold !== undefined && rule.threshold !== null
    ? " " + rule.op + " " + fmtValue(rule.threshold) : "";
  switch (rule.kind) {
    case "threshold":
      return rule.metric + " " + rule.stat + " over " + rule.window + by + where + cmp;
    case "trend":
      return rule.metric + " " + rule.stat + " over " + rule.window + " " + (rule.mode || "ratio") + " vs " +
        (rule.against || "previous") + by + where + cmp;
    case "absence":
      return "no events on " + rule.stream + " for " + rule.duration + by + where;
    case "lag":
      return "lag seconds" + (rule.stream ? " of " + rule.stream : "") + cmp;
    case "lag_status":
      return "lag status" + (rule.stream ? " of " + rule.stream : "") + " in " + (rule.statuses || []).join(", ");
    case "dead_letters":
      return "dead letters/s" + (rule.stream ? " of " + rule.stream : "") + (rule.window ? " over " + rule.window : "") +
        (cmp || " > " + fmtValue(rule.threshold));
    case "pattern":
      return "each match of pattern " + rule.pattern;
    default:
      return rule.kind;
  }
}

function renderRules() {
  const list = $("alert-rules");
  $("alert-rules-count").textContent = String(state.rules.length);
  $("alert-rules-empty").textContent = "no rules yet: create one below, or declare them in the alerts YAML file";
  $("alert-rules-empty").hidden = state.rules.length > 0;
  const editing = $("rule-editor").dataset.editing || "";
  const picked = {}; // a re-render (every refresh) keeps the durations picked but not yet applied
  list.querySelectorAll(".alert-rule").forEach((row) => {
    const select = row.querySelector(".silence-duration");
    if (select) picked[row.dataset.rule] = select.value;
  });
  const items = state.rules.slice().sort((a, b) => { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; })
    .map((rule) => {
      const silenced = rule.silenced_until_ms && rule.silenced_until_ms > Date.now();
      const controls = el("div", { class: "rule-controls" });
      if (silenced) {
        controls.append(
          el("span", { class: "silenced-until", title: new Date(rule.silenced_until_ms).toISOString() },
            [silencedText(rule.silenced_until_ms)]), " ",
          el("button", { type: "button", class: "unsilence-button", "data-rule": rule.name }, ["unsilence"]));
      } else {
        const select = el("select", { class: "silence-duration", "aria-label": "silence " + rule.name + " for" },
          SILENCE_CHOICES.map((d) => { return el("option", { value: d }, [d]); }));
        select.value = picked[rule.name] || "1h";
        controls.append(el("button", { type: "button", class: "silence-button", "data-rule": rule.name }, ["silence"]),
          " for ", select);
      }
      if (rule.source === "api") {
        controls.append(" ",
          el("button", { type: "button", class: "edit-rule", "data-rule": rule.name }, ["edit"]), " ",
          el("button", { type: "button", class: "delete-rule", "data-rule": rule.name }, ["delete"]));
      } else {
        controls.append(" ", el("span", { class: "rule-readonly" }, ["declared in the alerts YAML file"]));
      }
      return el("li", { class: "alert-rule", "data-rule": rule.name, "data-state": rule.state || "normal",
        "data-source": rule.source, "data-kind": rule.kind, "data-silenced": silenced ? "true" : "false",
        "data-editing": editing === rule.name ? "true" : null }, [
        stateBadge(rule.state), " ",
        el("b", { class: "alert-rule-name" }, [rule.name]), " ",
        el("span", { class: "tag rule-kind" }, [rule.kind]), " ",
        el("span", { class: "tag rule-source", "data-source": rule.source }, [rule.source]),
        el("div", { class: "rule-what", title: rule.description || "" },
          [describe(rule) + (isZero(rule.for) ? "" : " for " + rule.for)]),
        controls,
        el("div", { class: "rule-message", role: "status", hidden: "" }),
      ]);
    });
  list.replaceChildren.apply(list, items);
}

// Row buttons: silence / unsilence / edit / delete (one delegated listener).
function onRulesClick(ev) {
  const button = ev.target.closest("button");
  if (!button || !button.dataset.rule) return;
  const name = button.dataset.rule;
  const row = button.closest(".alert-rule");
  const message = row.querySelector(".rule-message");
  function done(res) {
    if (res && !res.ok) {
      message.textContent = detailOf(res.body, res.status);
      message.hidden = false;
      return;
    }
    refresh();
  }
  function failed(e) { message.textContent = "request failed: " + e.message; message.hidden = false; }
  if (button.classList.contains("silence-button")) {
    const duration = row.querySelector(".silence-duration").value;
    button.disabled = true;
    call("POST", ruleUrl(name) + "/silence", { duration: duration }).then(done, failed);
  } else if (button.classList.contains("unsilence-button")) {
    button.disabled = true;
    call("DELETE", ruleUrl(name) + "/silence").then(done, failed);
  } else if (button.classList.contains("edit-rule")) {
    let rule = ruleByName(name);
    if (rule) loadRule(rule);
  } else if (button.classList.contains("delete-rule")) {
    if (button.dataset.confirm !== "yes") { // two clicks, no modal dialog
      button.dataset.confirm = "yes";
      button.textContent = "really delete?";
      setTimeout(() => { button.dataset.confirm = ""; button.textContent = "delete"; }, 4000);
      return;
    }
    button.disabled = true;
    call("DELETE", ruleUrl(name)).then((res) => {
      if (res.ok && $("rule-editor").dataset.editing === name) clearForm();
      done(res);
    }, failed);
  }
}

// ------------------------------------------------------------------ the rule editor

// The definition fields the form edits; others (stale_after, lookback, no_data_state, ...) are kept
// as they were when an API rule is edited without changing its kind.
const FIELDS = ["name", "kind", "description", "metric", "stat", "stream", "pattern", "window", "duration", "group_by", "filters", "against",
  "mode", "op", "threshold", "statuses", "for", "keep_firing_for", "interval", "provisional", "labels", "annotations"];

function fieldBox(field) { return $("rule-editor").querySelector("[data-field='" + field + "']"); }
function shown(field) { return !fieldBox(field).hidden; }

function applyKind() {
  const kind = $("re-kind").value;
  $("rule-editor").querySelectorAll("[data-kinds]").forEach((box) => {
    box.hidden = box.dataset.kinds.split(" ").indexOf(kind) < 0;
  });
  $("re-threshold-unit").textContent = THRESHOLD_UNIT[kind] || "";
  // absence needs a stream; lag, lag_status and dead_letters may watch them all
  const all = $("re-stream").querySelector("option[value='']");
  if (all) all.hidden = all.disabled = kind === "absence";
  if (kind === "absence" && !$("re-stream").value && $("re-stream").options.length > 1) $("re-stream").selectedIndex = 1;
  applyMetric();
}

function applyMetric() {
  const kind = $("re-kind").value;
  const metric = state.metrics[$("re-metric").value];
  let stats = [];
  (metric ? metric.stats : []).forEach((s) => {
    if (s === "pNN") stats = stats.concat(PERCENTILES); else stats.push(s);
  });
  $("re-stat-options").replaceChildren.apply($("re-stat-options"),
    stats.map((s) => { return el("option", { value: s }); }));
  let dims = [];
  if (kind === "absence") {
    const stream = state.streams.filter((s) => { return s.name === $("re-stream").value; })[0];
    dims = stream ? stream.dimensions || [] : [];
  } else if (metric) {
    dims = metric.dimensions || [];
  }
  $("re-dimensions").textContent = dims.length ? "of: " + dims.join(", ") : "";
}

function parsePairs(text, what, separators) { // "k=v" items -> {k: v}; throws with a message on a bad item
  const out = {};
  text.split(separators).map((s) => { return s.trim(); }).filter(Boolean).forEach((item) => {
    let i = item.indexOf("=");
    if (i <= 0) throw new Error(what + ": expected key=value, got '" + item + "'");
    out[item.slice(0, i).trim()] = item.slice(i + 1).trim();
  });
  return out;
}
function pairsText(obj, sep) { return labelPairs(obj).join(sep); }

// The definition the form describes: the fields the kind shows, empty optional ones left out
// (the server applies its defaults and says which field is wrong, if one is).
function formBody() {
  let body = { name: $("re-name").value.trim(), kind: $("re-kind").value };
  const was = state.editing;
  if (was && was.kind === body.kind) {
    Object.keys(was).forEach((k) => {
      if (FIELDS.indexOf(k) < 0 && SERVER_FIELDS.indexOf(k) < 0) body[k] = was[k];
    });
  }
  if ($("re-description").value.trim()) body.description = $("re-description").value.trim();
  function text(field, id) { const v = $(id).value.trim(); if (shown(field) && v) body[field] = v; }
  text("metric", "re-metric");
  text("stat", "re-stat");
  text("stream", "re-stream");
  text("pattern", "re-pattern");
  text("window", "re-window");
  text("duration", "re-duration");
  if (shown("group_by") && $("re-group-by").value.trim()) body.group_by = parseList($("re-group-by").value);
  if (shown("filters") && $("re-filters").value.trim()) body.filters = parsePairs($("re-filters").value, "filters", PAIR_SEPARATOR);
  text("against", "re-against");
  text("mode", "re-mode");
  text("op", "re-op");
  if (shown("threshold") && $("re-threshold").value.trim() !== "") body.threshold = Number($("re-threshold").value);
  else if (shown("threshold") && $("re-threshold").validity.badInput) throw new Error("threshold: not a number");
  if (shown("statuses")) {
    body.statuses = Array.prototype.map.call($("re-statuses").querySelectorAll("input:checked"),
      (c) => { return c.value; });
  }
  text("for", "re-for");
  text("keep_firing_for", "re-keep-firing-for");
  text("interval", "re-interval");
  if (shown("provisional")) body.provisional = $("re-provisional").checked;
  const labels = parsePairs($("re-labels").value, "labels", /\n/);
  if (Object.keys(labels).length) body.labels = labels;
  const annotations = parsePairs($("re-annotations").value, "annotations", /\n/);
  if (Object.keys(annotations).length) body.annotations = annotations;
  return body;
}

function showError(text) {
  const box = $("rule-editor-error");
  box.textContent = text || "";
  box.hidden = !text;
}

function clearForm() {
  const form = $("rule-editor");
  form.reset(); // back to the markup's defaults
  form.dataset.mode = "create";
  delete form.dataset.editing;
  state.editing = null;
  $("re-name").readOnly = false;
  $("rule-editor-title").textContent = "New rule";
  $("rule-editor-submit").textContent = "create rule";
  $("rule-editor-reset").textContent = "clear";
  if ($("re-metric").options.length && firstValueMetric()) $("re-metric").value = firstValueMetric();
  showError("");
  applyKind();
  document.querySelectorAll("#alert-rules .alert-rule[data-editing]").forEach((r) => { delete r.dataset.editing; });
}

function loadRule(rule) {
  clearForm();
  const form = $("rule-editor");
  form.dataset.mode = "edit";
  form.dataset.editing = rule.name;
  state.editing = rule;
  $("rule-editor-title").textContent = "Edit rule " + rule.name;
  $("rule-editor-submit").textContent = "save changes";
  $("rule-editor-reset").textContent = "cancel";
  $("rule-editor-status").textContent = "";
  $("re-name").value = rule.name;
  $("re-name").readOnly = true;
  $("re-kind").value = rule.kind;
  if (rule.metric && !state.metrics[rule.metric]) { // a metric since removed from the configuration
    $("re-metric").append(el("option", { value: rule.metric }, [rule.metric + " (not defined)"]));
  }
  if (rule.stream && !Array.prototype.some.call($("re-stream").options, (o) => { return o.value === rule.stream; })) {
    $("re-stream").append(el("option", { value: rule.stream }, [rule.stream + " (not defined)"]));
  }
  function set(id, v) { $(id).value = v === null || v === undefined ? "" : String(v); }
  set("re-description", rule.description);
  set("re-metric", rule.metric);
  set("re-stat", rule.stat);
  set("re-stream", rule.stream || "");
  set("re-pattern", rule.pattern);
  set("re-window", rule.window);
  set("re-duration", rule.duration);
  set("re-group-by", (rule.group_by || []).join(", "));
  set("re-filters", pairsText(rule.filters, ", "));
  set("re-against", rule.against);
  if (rule.mode) set("re-mode", rule.mode);
  if (rule.op) set("re-op", rule.op);
  set("re-threshold", rule.threshold);
  $("re-statuses").querySelectorAll("input").forEach((c) => {
    c.checked = (rule.statuses || []).indexOf(c.value) >= 0;
  });
  set("re-for", isZero(rule.for) ? "" : rule.for);
  set("re-keep-firing-for", isZero(rule.keep_firing_for) ? "" : rule.keep_firing_for);
  set("re-interval", rule.interval);
  $("re-provisional").checked = !!rule.provisional;
  set("re-labels", pairsText(rule.labels, "\n"));
  set("re-annotations", pairsText(rule.annotations, "\n"));
  applyKind();
  const row = document.querySelector("#alert-rules .alert-rule[data-rule='" + CSS.escape(rule.name) + "']");
  if (row) row.dataset.editing = "true";
  form.scrollIntoView({ block: "nearest" });
  $("re-kind").focus();
}

function onSubmit(ev) {
  ev.preventDefault();
  const form = $("rule-editor");
  let body;
  try { body = formBody(); } catch (e) { showError(e.message); return; }
  const editing = form.dataset.editing;
  const submit = $("rule-editor-submit");
  submit.disabled = true;
  showError("");
  $("rule-editor-status").textContent = "…";
  const request = editing ? call("PUT", ruleUrl(editing), body) : call("POST", API + "/rules", body);
  request.then((res) => {
    if (!res.ok) {
      $("rule-editor-status").textContent = "";
      showError(detailOf(res.body, res.status));
      return;
    }
    clearForm();
    $("rule-editor-status").textContent = (editing ? "saved " : "created ") + res.body.name;
    return refresh();
  }).catch((e) => {
    $("rule-editor-status").textContent = "";
    showError("request failed: " + e.message);
  }).then(() => { submit.disabled = false; });
}

function loadChoices() { // metrics and streams for the selects
  return Promise.all([call("GET", "/api/v1/metrics"), call("GET", "/api/v1/streams")]).then((answers) => {
    const metrics = answers[0].ok ? answers[0].body.metrics : [];
    const streams = answers[1].ok ? answers[1].body.streams : [];
    state.streams = streams;
    metrics.forEach((m) => { state.metrics[m.name] = m; });
    $("re-metric").replaceChildren.apply($("re-metric"), metrics.map((m) => {
      return el("option", { value: m.name }, [m.name + (m.unit ? " (" + m.unit + ")" : "")]);
    }));
    if (firstValueMetric()) $("re-metric").value = firstValueMetric();
    $("re-stream").replaceChildren.apply($("re-stream"), [el("option", { value: "" }, ["(all streams)"])].concat(
      streams.map((s) => { return el("option", { value: s.name }, [s.name]); })));
    $("rule-editor").dataset.ready = "true";
    applyKind();
  }).catch((e) => { showError("cannot list metrics and streams: " + e.message); });
}

// ------------------------------------------------------------------ mount

function mount() {
  if (!$("alerts-panel")) return;
  $("alert-rules").addEventListener("click", onRulesClick);
  $("rule-editor").addEventListener("submit", onSubmit);
  $("rule-editor-reset").addEventListener("click", () => { clearForm(); $("rule-editor-status").textContent = ""; });
  $("re-kind").addEventListener("change", applyKind);
  $("re-metric").addEventListener("change", applyMetric);
  $("re-stream").addEventListener("change", applyMetric);
  FIELDS.forEach((f) => { if (!fieldBox(f)) console.warn("sketchboard alerts: no form field " + f); });
  applyKind();
  enabled().then((yes) => {
    if (!yes) { disable(); return; }
    loadChoices();
    refresh();
    window.addEventListener("sketchboard:alert", () => { // status.js: one per websocket `alert` message
      state.alertMessages += 1;
      schedule();
    });
    setInterval(refresh, REFRESH_EVERY_MS);
  });
}

// An API built without the alert service (create_app with no ctx.alerts) has no /api/v1/alerts
// routes: ask the OpenAPI document rather than collect 404s (the browser logs each as an error).
function enabled() { return hasRoute(API + "/rules"); }

function disable() {
  $("alerts-panel").dataset.state = "disabled";
  $("alerts-updated").textContent = "";
  ["alerts-active-empty", "alerts-history-empty", "alert-rules-empty"].forEach((id) => {
    $(id).textContent = "alerts are not enabled on this server";
  });
  $("rule-editor").querySelectorAll("input, select, textarea, button").forEach((c) => { c.disabled = true; });
  if ($("status-alerts")) $("status-alerts").hidden = true;
}

export const alerts = { refresh, schedule, state, loadRule, clearForm };
mount(); // a module runs once the page is parsed
