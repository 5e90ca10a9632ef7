// Membership lookup box: "was this key seen on this stream in this range?" via GET /api/v1/membership.
// Self-contained: mount(element), or put <div data-sketchboard-membership></div> in a page that
// loads this module (it mounts every such element); the box lists the streams that declare
// membership (from /api/v1/streams).

import { el } from "./util.js";

export function mount(root, base = "") {
  const stream = el("select", { "aria-label": "stream" });
  const key = el("input", { type: "text", placeholder: "a key", "aria-label": "key", required: "" });
  const from = el("input", { type: "text", value: "now-24h", size: "10", "aria-label": "from" });
  const to = el("input", { type: "text", value: "now", size: "10", "aria-label": "to" });
  const button = el("button", { type: "submit" }, ["Look up"]);
  const out = el("output", { "aria-live": "polite", class: "sb-membership-answer" });
  const form = el("form", { class: "sb-membership" },
    [el("strong", {}, ["Seen? "]), stream, " ", key, " from ", from, " to ", to, " ", button, " ", out]);
  root.append(form);

  fetch(base + "/api/v1/streams").then((r) => r.json()).then((body) => {
    for (const s of body.streams.filter((s) => s.membership)) {
      stream.append(el("option", { value: s.name }, [`${s.name} (${s.membership.field})`]));
    }
    if (!stream.options.length) { out.textContent = "no stream declares membership"; button.disabled = true; }
  }).catch((e) => { out.textContent = "cannot list streams: " + e; });

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams({ stream: stream.value, key: key.value, from: from.value, to: to.value });
    out.textContent = "…";
    try {
      const r = await fetch(base + "/api/v1/membership?" + q);
      const b = await r.json();
      if (!r.ok) {
        out.textContent = "error: " + (typeof b.detail === "string" ? b.detail : JSON.stringify(b.detail));
        out.style.color = "#b00";
        return;
      }
      out.style.color = "";
      out.textContent = b.answer === "no"
        ? `No — certainly not seen (${b.buckets} bucket${b.buckets === 1 ? "" : "s"} of ${b.bucket})`
        : `Probably yes — false-positive probability ${b.false_positive_probability.toExponential(2)} (${b.buckets} buckets of ${b.bucket})`;
    } catch (e) { out.textContent = "request failed: " + e; out.style.color = "#b00"; }
  });
  return form;
}

for (const node of document.querySelectorAll("[data-sketchboard-membership]")) mount(node);
