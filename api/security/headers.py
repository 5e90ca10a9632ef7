"""Response headers for the dashboard's page and assets.

The CSP allows only the service's own scripts: no inline script (the page has none: the theme
bootstrap is /static/theme.js), no eval, nothing from another host. Styles allow 'unsafe-inline'
because Plotly injects <style> elements and sets style attributes as it draws; styles cannot
run code. frame-ancestors 'none' (and X-Frame-Options for older browsers): no other page may
frame the dashboard to trick clicks on it."""

from __future__ import annotations

CSP = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data: blob:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

DASHBOARD_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}
