// API tokens for the dashboard. When the API answers 401, ask for a token and keep it in
// sessionStorage: this tab only, gone when it closes (a token that outlives the session is one
// more to leak; localStorage would keep it forever). It goes with every same-origin fetch as
// `Authorization: Bearer`, and with the websocket as the subprotocol `sketchboard.token.<token>`
// (browsers cannot set headers on a websocket; the server answers with `sketchboard` only).
// Loaded before the other scripts so that their fetch() calls go through this one.
(function () {
  "use strict";
  var KEY = "sketchboard.token";

  function get() { try { return sessionStorage.getItem(KEY); } catch (e) { return null; } }
  function set(token) {
    try { if (token) sessionStorage.setItem(KEY, token); else sessionStorage.removeItem(KEY); } catch (e) {}
  }

  function sameOrigin(input) {
    var href = typeof input === "string" || input instanceof URL ? String(input) : input.url;
    return new URL(href, location.href).origin === location.origin;
  }

  var asking = false;
  function ask(refused) {
    if (asking) return;
    asking = true;
    var dialog = document.getElementById("token-dialog");
    if (refused) {
      set(null); // unknown or revoked: do not send it again
      document.getElementById("token-reason").textContent =
        "The token was refused (unknown or revoked). Enter another one.";
    }
    if (dialog && !dialog.open) dialog.showModal();
  }

  var nativeFetch = window.fetch.bind(window);
  window.fetch = function (input, init) {
    var own = sameOrigin(input); // never send the token to another origin
    var token = get();
    if (own && token) {
      init = Object.assign({}, init || {});
      var headers = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
      if (!headers.has("Authorization")) headers.set("Authorization", "Bearer " + token);
      init.headers = headers;
    }
    return nativeFetch(input, init).then(function (response) {
      if (own && response.status === 401) ask(Boolean(token));
      return response;
    });
  };

  var form = document.getElementById("token-form");
  form.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var value = document.getElementById("token-input").value.trim();
    if (!value) return;
    set(value);
    location.reload(); // every panel starts again, now with the token
  });
  var forget = document.getElementById("token-forget");
  forget.hidden = !get();
  forget.addEventListener("click", function () { set(null); location.reload(); });

  window.SketchboardAuth = {
    // The subprotocols to offer on the websocket: none without a token (an open service).
    protocols: function () {
      var token = get();
      return token ? ["sketchboard", "sketchboard.token." + token] : [];
    },
  };
})();
