"""The dashboard's assets are served by the API itself (no CDN): the page, its modules and
style, and Plotly's JavaScript from the installed plotly package."""

from __future__ import annotations

from pathlib import Path

import plotly


def test_page_and_assets_are_served_locally(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for ref in ("/static/plotly.min.js", "/static/main.js", "/static/app.css"):
        assert ref in page.text
    assert "http://" not in page.text.replace("http://127.0.0.1", "") and "https://" not in page.text

    js = client.get("/static/plotly.min.js")
    assert js.status_code == 200 and js.headers["content-type"].startswith("text/javascript")
    assert js.content == (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()
    connection_js = client.get("/static/connection.js")  # imported by main.js
    assert connection_js.status_code == 200 and "/api/v1/ws" in connection_js.text
    assert client.get("/static/app.css").headers["content-type"].startswith("text/css")


def test_assets_outside_the_dashboard_are_not_served(client):
    for path in ("/static/..%2Fapi%2Fapp.py", "/static/.hidden.js", "/static/nothing.js", "/static/index.py"):
        assert client.get(path).status_code == 404, path
