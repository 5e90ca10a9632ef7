"""What a stream's records feed under another name (catalog/dependents.py): the joins, patterns,
views and enrichments a switch of the stream would leave built the old way, so it is refused."""

from __future__ import annotations

from catalog import parse_catalog
from catalog.dependents import stream_dependents
from tests.support.patterns import EXAMPLES_YAML
from tests.unit.test_enrichment import CONFIG as ENRICHED
from tests.unit.test_views import catalog_with


def test_joins_name_both_of_their_streams(demo_catalog):
    assert stream_dependents(demo_catalog, "searches") == ["join 'search_clicks'"]
    assert stream_dependents(demo_catalog, "clicks") == ["join 'search_clicks'"]
    assert stream_dependents(demo_catalog, "http_requests") == []


def test_patterns_name_their_step_and_absence_streams():
    catalog = parse_catalog(EXAMPLES_YAML)
    assert stream_dependents(catalog, "logins") == ["pattern 'credential_stuffing'"]
    assert stream_dependents(catalog, "checkouts") == ["pattern 'abandoned_checkout'"]


def test_views_and_enrichments_name_the_tables_they_read():
    views = catalog_with("  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}\n")
    assert stream_dependents(views, "users") == ["view 'user_plans'"]
    assert stream_dependents(views, "plans") == ["view 'user_plans'"]
    assert stream_dependents(views, "clicks") == []
    enriched = parse_catalog(ENRICHED)
    assert stream_dependents(enriched, "users") == ["enrichment of 'http_requests'"]
    assert stream_dependents(enriched, "http_requests") == []  # its own misses move with it (store/switch.py)
