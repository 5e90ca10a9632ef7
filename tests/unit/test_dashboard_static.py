"""The dashboard's static files name no metric, stream, dimension or field of the demo's
configuration, nor its placeholder values: everything the page shows of a configuration comes
from GET /api/v1/metrics and /api/v1/streams, so it works on any (issue 18). And the page is
native ES modules, loaded by one entry module."""

from __future__ import annotations

import re
from pathlib import Path

from catalog import load_catalog

REPO_ROOT = Path(__file__).resolve().parents[2]
STATIC = REPO_ROOT / "dashboard" / "static"
# Demo names that are also ordinary words of the page's code and text (an HTTP request's method
# and status, a list's items, the time axis, the events per session of the generated session
# streams, a button's two clicks, CSS's position, an alert rule's comparison op, the `late` dimension
# every pattern's matches have, whatever the configuration): a match on these says nothing.
ORDINARY_WORDS = {"method", "status", "items", "time", "events", "clicks", "position", "op", "late"}
# The demo's values and the placeholders built from them that the page used to carry.
DEMO_VALUES = ["eu-west", "=GET", "/api/cart", "/api/search", "/api/checkout", "search_p99", "$labels.endpoint"]


def demo_names() -> set[str]:
    catalog = load_catalog(REPO_ROOT / "config" / "streams.yaml")
    names = set(catalog.streams) | set(catalog.metrics)
    for stream in catalog.streams.values():
        names |= {*stream.dimensions, *stream.values, *stream.distinct_fields, stream.key_field, stream.time_field}
    return {n for n in names if n} - ORDINARY_WORDS


def test_no_static_file_names_the_demos_configuration():
    names = demo_names()
    assert {"requests", "latency", "endpoint", "region", "http_requests"} <= names
    found = []
    for path in sorted(STATIC.iterdir()):
        text = path.read_text()
        for name in sorted(names):
            for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                found.append(f"{path.name}:{text.count(chr(10), 0, match.start()) + 1}: {name}")
        found += [f"{path.name}: {value}" for value in DEMO_VALUES if value in text]
    assert found == [], found


def test_the_page_is_es_modules_loaded_by_one_entry():
    html = (STATIC / "index.html").read_text()
    assert '<script type="module" src="/static/main.js"></script>' in html
    assert html.count("<script") == 3  # theme.js (before the first paint), Plotly, main.js
    # theme.js runs before the first paint; docs.js starts Swagger UI on /docs, a page of its own.
    modules = {p.name for p in STATIC.glob("*.js")} - {"theme.js", "docs.js"}
    imported = set()
    for name in modules:
        text = (STATIC / name).read_text()
        assert '"use strict"' not in text and "(function" not in text and "var " not in text, name  # one dialect
        imported |= set(re.findall(r'(?:from|import) "\./([\w.]+\.js)"', text))
    assert imported | {"main.js"} == modules  # every module is reached from main.js, none is left over
