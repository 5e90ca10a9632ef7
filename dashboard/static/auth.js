// API tokens for the dashboard. When the API answers 401 (or 403 for a token without the
// `read` scope), ask for a token and keep it in
// sessionStorage: this tab only, gone when it closes (a token that outlives the session is one
// more to leak; localStorage would keep it forever). It goes with every same-origin fetch as
// `Authorization: Bearer`, and with the websocket as the subprotocol `sketchboard.token.<token>`
// (browsers cannot set headers on a websocket; the server answers with `sketchboard` only).
// main.js imports this module first, so that every other module's fetch() goes through it.

import { $ } from "./util.js";

const KEY = "sketchboard.token";

function get() { try { return sessionStorage.getItem(KEY); } catch (e) { return null; } }
function set(token) {
  try { if (token) sessionStorage.setItem(KEY, token); else sessionStorage.removeItem(KEY); } catch (e) { /* private mode */ }
}

function sameOrigin(input) {
  const href = typeof input === "string" || input instanceof URL ? String(input) : input.url;
  return new URL(href, location.href).origin === location.origin;
}

let asking = false;
// Dismissed with Escape: "not now". A later 401 (the alerts panel polls every 15 s) shows the
// header's "enter token" button instead of opening the dialog over the page again.
let dismissed = false;
const whenDismissed = [];
// Open the token dialog; refused: the tab's token was refused (reason: the server's, if it said
// one, e.g. a websocket closed with "token 'ci' was revoked"): it is forgotten, not sent again.
export function ask(refused, reason) {
  if (refused) {
    set(null);
    $("token-forget").hidden = true;
    $("token-reason").textContent = `The token was refused (${reason || "unknown or revoked"}). Enter another one.`;
  }
  if (asking) return;
  if (dismissed && !refused) {
    $("token-enter").hidden = false;
    return;
  }
  openDialog();
}
function openDialog() {
  asking = true;
  const dialog = $("token-dialog");
  if (dialog && !dialog.open) dialog.showModal();
}
// Whether the dialog is up (the websocket waits for it rather than retrying).
export function tokenDialogOpen() { return asking; }
// f() once the dialog is dismissed without a token (Escape).
export function onDismissed(f) { whenDismissed.push(f); }

const nativeFetch = window.fetch.bind(window);
window.fetch = async (input, init) => {
  const own = sameOrigin(input); // never send the token to another origin
  const token = get();
  if (own && token) {
    init = { ...(init || {}) };
    const headers = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
    if (!headers.has("Authorization")) headers.set("Authorization", "Bearer " + token);
    init.headers = headers;
  }
  const response = await nativeFetch(input, init);
  // An answer to a token the tab no longer holds (another was typed in while it was on its way)
  // says nothing about the new one: it must not forget it.
  if (own && token !== get()) return response;
  if (own && response.status === 401) ask(Boolean(token));
  else if (own && token && response.status === 403) await lacksRead(response, token);
  return response;
};

// A token without the `read` scope (an ingest-only one) can show nothing on this page: it is
// refused like a revoked one, with the server's reason. A 403 for another scope (a read token
// saving an alert rule, which needs `admin`) is the place's own error: the page works on.
async function lacksRead(response, token) {
  const challenge = response.headers.get("WWW-Authenticate") || "";
  if (!/error="insufficient_scope"/.test(challenge) || !/scope="read"/.test(challenge)) return;
  let detail = "";
  try { detail = (await response.clone().json()).detail || ""; } catch (e) { /* no JSON body */ }
  if (get() !== token) return; // forgotten or replaced while the body was read: not this token's answer now
  ask(true, `this token lacks the read scope${detail ? ": " + detail : ""}`);
}

// Dismissed (Escape): asked again only from the header's button (or for a refused token).
$("token-dialog").addEventListener("close", () => {
  asking = false;
  dismissed = true;
  $("token-enter").hidden = false;
  for (const f of whenDismissed) f();
});
$("token-enter").addEventListener("click", () => { if (!asking) openDialog(); });

$("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const value = $("token-input").value.trim();
  if (!value) return;
  set(value);
  location.reload(); // every panel starts again, now with the token
});
const forget = $("token-forget");
forget.hidden = !get();
forget.addEventListener("click", () => { set(null); location.reload(); });

// The subprotocols to offer on the websocket: none without a token (an open service).
export function protocols() {
  const token = get();
  return token ? ["sketchboard", "sketchboard.token." + token] : [];
}
