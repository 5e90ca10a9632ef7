// Apply the theme before first paint: URL ?theme=, then the saved choice, then the system's.
// A file, not an inline <script>: the dashboard's Content-Security-Policy allows only the
// service's own script files (api/security/headers.py). The one classic script: a module is
// deferred until the page is parsed, which would paint it once in the wrong theme.
(function () {
  var q = new URLSearchParams(location.search).get("theme");
  var saved = null;
  try { saved = localStorage.getItem("sketchboard.theme"); } catch (e) {}
  var sys = window.matchMedia && window.matchMedia("(prefers-color-scheme: light)").matches ? "light" : "dark";
  document.documentElement.dataset.theme = (q === "light" || q === "dark") ? q : (saved || sys);
})();
