// The one websocket (WS /api/v1/ws): subscriptions survive reconnects (re-sent on open), a
// socket silent for three heartbeat intervals (the server's setting: the `pong` to the ping
// sent on open says it) is taken for dead and replaced at once; a closed one is reopened with a
// growing back-off. A socket the
// server closes with 1008 shows the server's reason; a refused token (revoked, its scope gone,
// or one now required; or a handshake refused while the tab has a token) is forgotten and asked
// for again (auth.js), and the socket waits for the dialog rather than retrying.

import { $, clock } from "./util.js";
import { ask, onDismissed, protocols, tokenDialogOpen } from "./auth.js";

const MISSED_HEARTBEATS = 3;
const CHECK_MS = 1000; // how often the page checks its socket's silence
const LATE_CHECK_MS = 1000; // a check this much later than due: the page itself was held up
// The server's ws_message_rate / ws_message_burst (docs/websocket.md): its defaults until the
// pong says the configured ones. The page keeps under them by a margin, as the server counts
// arrivals, which the network or a busy server may bunch: a socket past them is closed with 1008.
// With 5 of 50 kept back, a loaded CI machine bunched a 24-panel dashboard's rounds past it; a
// fifth (10) still sends one such round (25 messages) at once.
const DEFAULT_LIMITS = { rate: 20, burst: 50 };
const RATE_MARGIN = 0.9;
const BURST_MARGIN = 0.2; // of the server's burst, at least 5 messages
const TOKEN_REFUSAL = /token/i; // the server's 1008 reasons about tokens (api/security/middleware.py)

export class Connection {
  // onMessage(msg): every message that is not a subscription's (pipeline, lag, correction, alert, ...).
  // Subscriptions made before connect() are sent once the socket opens.
  constructor(onMessage) {
    this.onMessage = onMessage;
    this.subs = new Map(); // id -> {query, handler}
    this.backoff = 500;
    this.ws = null;
    this.lastMessage = 0;
    this.heartbeatMs = null; // unknown until the pong says
    this.waiting = false; // for the token dialog: reopened once it is dismissed
    this.pacer = new Pacer((msg) => { // a socket gone meanwhile: its successor re-sends every subscription
      if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(msg));
    });
    onDismissed(() => { if (this.waiting) { this.waiting = false; this.retry(""); } });
    this.lastCheck = Date.now();
    setInterval(() => {
      const now = Date.now();
      // A check this late means the page (or the whole machine: a laptop's sleep, a busy VM) was
      // held up: the server may have had no chance to send meanwhile, or what it sent is still
      // unread. The silence it sees is then not the socket's: the next check, on time, judges.
      const late = now - this.lastCheck > CHECK_MS + LATE_CHECK_MS;
      this.lastCheck = now;
      const silentFor = now - this.lastMessage;
      if (!late && this.heartbeatMs && this.ws && this.ws.readyState === WebSocket.OPEN &&
          silentFor > MISSED_HEARTBEATS * this.heartbeatMs + 2000) this.dead(this.ws);
    }, CHECK_MS);
  }

  // A silent socket is dead: not "live" while the browser's closing handshake with a server
  // that answers nothing times out (about a minute). Its handlers go, it is closed without
  // waiting for its onclose, and a new one opens at once.
  dead(ws) {
    ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    try { ws.close(); } catch (e) { /* closing already */ }
    this.ws = null;
    setConnState("closed", "no heartbeat · reconnecting");
    this.connect();
  }

  connect() {
    setConnState("connecting", "connecting…");
    // The token, if any, as a websocket subprotocol (auth.js).
    const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/api/v1/ws`, protocols());
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.backoff = 500;
      this.lastMessage = Date.now();
      setConnState("open", "live");
      this.pacer.reset(); // a new socket: the server's bucket is full, the old queue is re-sent below
      this.send({ type: "ping" });
      for (const [id, s] of this.subs) this.send({ type: "subscribe", id, query: s.query });
    };
    ws.onmessage = (ev) => {
      this.lastMessage = Date.now();
      let msg;
      try { msg = JSON.parse(ev.data); } catch (e) { return; }
      this.dispatch(msg);
    };
    ws.onclose = (ev) => { if (this.ws === ws) this.closed(ev, opened); };
    ws.onerror = () => {}; // onclose follows and reconnects
  }

  async closed(ev, opened) {
    const reason = ev.code === 1008 && ev.reason ? ev.reason : "";
    const hadToken = protocols().length > 0;
    if (reason && TOKEN_REFUSAL.test(reason)) ask(hadToken, reason);
    else if (!opened && hadToken) {
      // A refused handshake says no reason (the browser shows 1006): ask the API, whose 401
      // (auth.js) forgets the token and asks for another; a server that is down answers nothing.
      try { await fetch("/api/v1/streams", { cache: "no-store" }); } catch (e) { /* down: retry */ }
    }
    if (tokenDialogOpen()) {
      this.waiting = true;
      setConnState("closed", `${reason ? "closed: " + reason + " · " : "disconnected · "}waiting for a token`, reason);
      return;
    }
    this.retry(reason);
  }

  retry(reason) {
    const wait = this.backoff;
    this.backoff = Math.min(this.backoff * 2, 10000);
    setConnState("closed", `${reason ? "closed: " + reason : "disconnected"} · retrying in ${Math.round(wait / 1000)} s`, reason);
    setTimeout(() => this.connect(), wait);
  }

  dispatch(msg) {
    if (msg.type === "snapshot" || msg.type === "points" || msg.type === "error") {
      const sub = msg.id !== null && msg.id !== undefined ? this.subs.get(msg.id) : null;
      if (sub) { sub.handler(msg); return; }
      if (msg.type === "error") { console.warn("sketchboard:", msg.reason); return; }
    }
    if (msg.type === "heartbeat" || msg.type === "pong") clock.skewMs = msg.at_ms - Date.now();
    if (msg.type === "pong" && msg.heartbeat_interval_ms > 0) this.heartbeatMs = msg.heartbeat_interval_ms;
    if (msg.type === "pong" && msg.message_rate > 0 && msg.message_burst > 0) {
      this.pacer.limit(msg.message_rate, msg.message_burst);
    }
    this.onMessage(msg);
  }

  // Paced (Pacer): one range change on the biggest dashboard goes at once, quick changes in a row
  // wait their turn rather than get the socket closed.
  send(msg) { if (this.ws && this.ws.readyState === WebSocket.OPEN) this.pacer.send(msg); }

  subscribe(id, query, handler) {
    this.subs.set(id, { query, handler });
    this.send({ type: "subscribe", id, query });
  }

  unsubscribe(id) {
    if (!this.subs.has(id)) return;
    this.subs.delete(id);
    this.send({ type: "unsubscribe", id });
  }
}

// A token bucket like the server's, a little smaller: messages go at once while it has tokens,
// then wait in a queue drained at the allowed rate. A queued subscribe or unsubscribe of an id is
// replaced in its place by a newer one of that id (only the newest query of a chart matters), so
// a user flicking through ranges faster than a round drains never grows the queue.
class Pacer {
  constructor(sendNow) {
    this.sendNow = sendNow;
    this.limit(DEFAULT_LIMITS.rate, DEFAULT_LIMITS.burst);
    this.reset();
  }

  limit(rate, burst) {
    this.rate = rate * RATE_MARGIN / 1000; // per ms
    this.burst = Math.max(1, burst - Math.max(5, Math.ceil(burst * BURST_MARGIN)));
    this.tokens = Math.min(this.tokens ?? this.burst, this.burst);
  }

  reset() {
    this.queue = [];
    this.tokens = this.burst;
    this.at = performance.now();
    clearTimeout(this.timer);
    this.timer = null;
  }

  send(msg) {
    const same = msg.id !== undefined && msg.id !== null && (msg.type === "subscribe" || msg.type === "unsubscribe")
      ? this.queue.findIndex((m) => m.id === msg.id && (m.type === "subscribe" || m.type === "unsubscribe")) : -1;
    if (same >= 0) this.queue[same] = msg;
    else this.queue.push(msg);
    this.drain();
  }

  drain() {
    const now = performance.now();
    this.tokens = Math.min(this.burst, this.tokens + (now - this.at) * this.rate);
    this.at = now;
    while (this.queue.length && this.tokens >= 1) {
      this.tokens -= 1;
      this.sendNow(this.queue.shift());
    }
    if (this.queue.length && !this.timer) {
      this.timer = setTimeout(() => { this.timer = null; this.drain(); }, Math.ceil((1 - this.tokens) / this.rate));
    }
  }
}

export function chartHandler(chart) {
  return (msg) => {
    if (msg.type === "snapshot") chart.snapshot(msg.result);
    else if (msg.type === "points") chart.points(msg);
    else if (msg.type === "error") chart.fail(msg.reason);
  };
}

function setConnState(stateName, text, reason) {
  const elem = $("status-connection");
  elem.dataset.state = stateName;
  elem.textContent = text;
  elem.dataset.reason = reason || "";
}
