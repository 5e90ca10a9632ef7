// Membership lookup box: "was this key seen on this stream in this range?" via GET /api/v1/membership.
// Self-contained: call SketchboardMembership.mount(element) or put
//   <div data-sketchboard-membership></div><script src="/static/membership.js"></script>
// in the page; the box lists the streams that declare membership (from /api/v1/streams).
(function () {
  "use strict";

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    (children || []).forEach(function (c) { node.append(c); });
    return node;
  }

  function mount(root, base) {
    base = base || "";
    var stream = el("select", { "aria-label": "stream" });
    var key = el("input", { type: "text", placeholder: "key, e.g. u123", "aria-label": "key", required: "" });
    var from = el("input", { type: "text", value: "now-24h", size: "10", "aria-label": "from" });
    var to = el("input", { type: "text", value: "now", size: "10", "aria-label": "to" });
    var button = el("button", { type: "submit" }, ["Look up"]);
    var out = el("output", { "aria-live": "polite", class: "sb-membership-answer" });
    var form = el("form", { class: "sb-membership" },
      [el("strong", {}, ["Seen? "]), stream, " ", key, " from ", from, " to ", to, " ", button, " ", out]);
    root.append(form);

    fetch(base + "/api/v1/streams").then(function (r) { return r.json(); }).then(function (body) {
      body.streams.filter(function (s) { return s.membership; }).forEach(function (s) {
        stream.append(el("option", { value: s.name }, [s.name + " (" + s.membership.field + ")"]));
      });
      if (!stream.options.length) { out.textContent = "no stream declares membership"; button.disabled = true; }
    }).catch(function (e) { out.textContent = "cannot list streams: " + e; });

    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var q = new URLSearchParams({ stream: stream.value, key: key.value, from: from.value, to: to.value });
      out.textContent = "…";
      fetch(base + "/api/v1/membership?" + q).then(function (r) {
        return r.json().then(function (body) { return { ok: r.ok, body: body }; });
      }).then(function (res) {
        var b = res.body;
        if (!res.ok) {
          out.textContent = "error: " + (typeof b.detail === "string" ? b.detail : JSON.stringify(b.detail));
          out.style.color = "#b00";
          return;
        }
        out.style.color = "";
        if (b.answer === "no") {
          out.textContent = "No — certainly not seen (" + b.buckets + " bucket" + (b.buckets === 1 ? "" : "s") + " of " + b.bucket + ")";
        } else {
          out.textContent = "Probably yes — false-positive probability " +
            b.false_positive_probability.toExponential(2) + " (" + b.buckets + " buckets of " + b.bucket + ")";
        }
      }).catch(function (e) { out.textContent = "request failed: " + e; out.style.color = "#b00"; });
    });
    return form;
  }

  window.SketchboardMembership = { mount: mount };
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-sketchboard-membership]").forEach(function (n) { mount(n); });
  });
})();
