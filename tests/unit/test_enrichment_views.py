"""Enrichment through a view without Spark (docs/tables.md, "Enrichment through a view"): the
catalog (a view as `enrich`'s table, its columns, load errors naming the line, what a reprocess
reads, what a switch of its tables is refused for) and the pure lookup (`joined_as_of`: the join
of both tables' rows as of a time, checked with Hypothesis against the view's own rule applied to
the tables as of that time)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.view_join import ViewShape, from_scratch, joined_as_of
from catalog import Catalog, ConfigError, parse_catalog
from catalog.dependents import stream_dependents
from catalog.enrichment import enrichment_tables, enrichment_view
from aggregates.reprocess import ReprocessService
from catalog.versions import catalog_versions, definition_version, shaping_definition
from ingest.log import SqliteEventLog
from sketchboard.definitions import pin_definitions
from sketchboard.reprocess import stream_catalog
from store.consumers import ConsumerRegistry
from store.definitions import DefinitionStore
from store.table_versions import TableVersion, as_of, by_key

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan_id, country]
  plans:
    kind: table
    key_field: id
    dimensions: [tier]
    values: [price]
  http_requests:
    key_field: user_id
    dimensions: [method]
    enrich:
      - {table: user_plans, by: user_id, columns: [country, tier]}
views:
  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}
"""


def test_a_view_is_a_table_to_enrich_from_two_joins_away():
    catalog = parse_catalog(CONFIG)
    requests = catalog.streams["http_requests"]
    assert requests.dimensions == ("method", "country", "tier")
    assert enrichment_tables(catalog, requests.enrich[0]) == ("users", "plans")
    assert Catalog.model_validate_json(catalog.model_dump_json()).streams["http_requests"] == requests
    # A reprocessing run reads both tables and maintains the view it looks up through.
    run = stream_catalog(catalog, "http_requests")
    assert set(run.streams) == {"http_requests", "users", "plans", "user_plans"} and set(run.views) == {"user_plans"}
    assert run.streams["http_requests"] == requests
    # A switch of either table is refused while the enrichment reads it (catalog/dependents.py).
    assert "enrichment of 'http_requests'" in stream_dependents(catalog, "plans")
    assert "enrichment of 'http_requests'" in stream_dependents(catalog, "users")


@pytest.mark.parametrize(("old", "new", "message"), [
    ("columns: [country, tier]", "columns: [country, price]",
     "line 16: streams.http_requests.enrich.0.columns.1: 'price' is not a dimension of view 'user_plans'"
     " (dimensions: plan_id, country, tier)"),
    ("columns: [country, tier]", "columns: [op]", "'op' is not a dimension of view 'user_plans'"),
    ("table: user_plans,", "table: user_plan,", "unknown table 'user_plan' (tables and views: plans, user_plans, users)"),
    ("columns: [country, tier]", "columns: [method, tier]", "column 'method' clashes with a declared field"),
])
def test_bad_enrichments_through_a_view_are_refused_naming_the_line(old, new, message):
    with pytest.raises(ConfigError) as err:
        parse_catalog(CONFIG.replace(old, new))
    assert message in str(err.value)


def test_a_changed_view_changes_the_version_of_the_streams_enriched_through_it():
    """The view's declaration (its foreign key, its kind, its tables) decides which rows an event
    is enriched with: a change of it is a changed definition of the enriched stream, which the
    service reports and offers a reprocess for; the tables' own versions stay."""
    catalog = parse_catalog(CONFIG)
    base = catalog_versions(catalog)
    for old, new in (("kind: left", "kind: inner"), ("foreign_key: plan_id, ", "")):
        versions = catalog_versions(parse_catalog(CONFIG.replace(old, new)))
        assert versions["http_requests"] != base["http_requests"], (old, new)
        assert {versions["users"], versions["plans"]} == {base["users"], base["plans"]}
    entry = shaping_definition(catalog.streams["http_requests"], catalog)["enrich"][0]
    assert entry["view"] == {"left": "users", "right": "plans", "foreign_key": "plan_id", "kind": "left"}
    # A run's catalog (the stream, its tables and the view) gives the run the configured version.
    assert catalog_versions(stream_catalog(catalog, "http_requests"))["http_requests"] == base["http_requests"]


def test_a_changed_view_is_offered_a_reprocess_and_pinned_with_its_stored_version(tmp_path, store_backend):
    store = store_backend.create()
    old, new = parse_catalog(CONFIG), parse_catalog(CONFIG.replace("kind: left", "kind: inner"))
    assert pin_definitions(store, old, "main", clock=lambda: 1_800_000_000) == old
    pinned = pin_definitions(store, new, "main", clock=lambda: 1_800_000_060)
    # The live pipeline fences its commits with the stored version (not a switch: no restart loop).
    assert catalog_versions(pinned)["http_requests"] == catalog_versions(old)["http_requests"]
    log = SqliteEventLog(tmp_path / "log.db", synchronous="OFF")
    try:
        for stream in new.streams.values():
            log.ensure_topic(stream)
        service = ReprocessService(new, DefinitionStore(store.side_db()), ConsumerRegistry(store.side_db()), log,
                                   clock=lambda: 1_800_000_060)
        assert service.changes() == {"http_requests": (catalog_versions(old)["http_requests"],
                                                       catalog_versions(new)["http_requests"])}
        assert service.plan("http_requests").version == catalog_versions(new)["http_requests"]
    finally:
        log.close()


def test_a_stream_pinned_as_stored_keeps_looking_up_through_the_view_as_it_was_declared(store_backend):
    """Until its switch, the live pipeline enriches a stream through the view declaration its stored
    definition was computed with (it is in the stored declaration), while the view's own rows and
    the run follow the configured one."""
    store = store_backend.create()
    old, new = parse_catalog(CONFIG), parse_catalog(CONFIG.replace("kind: left", "kind: inner"))
    pin_definitions(store, old, "main", clock=lambda: 1_800_000_000)
    stored = DefinitionStore(store.side_db()).definitions()["http_requests"].definition
    assert stored["enrich_views"] == {"user_plans": {"left": "users", "right": "plans", "foreign_key": "plan_id",
                                                     "kind": "left"}}
    pinned = pin_definitions(store, new, "main", clock=lambda: 1_800_000_060)
    decl = pinned.streams["http_requests"].enrich[0]
    assert enrichment_view(pinned, decl, "http_requests").kind == "left"  # the stored declaration's
    assert pinned.views["user_plans"].kind == "inner" and enrichment_view(pinned, decl).kind == "inner"
    # The pinned stream's version, computed from what it runs with, is its stored one.
    assert definition_version(pinned.streams["http_requests"], pinned) == catalog_versions(old)["http_requests"]
    # A view moved to other tables: the pinned stream still reads the tables it was computed from.
    moved = CONFIG.replace("  http_requests:", "  plans2: {kind: table, key_field: id, dimensions: [tier]}\n"
                           "  http_requests:").replace("right: plans,", "right: plans2,")
    pinned = pin_definitions(store, parse_catalog(moved), "main", clock=lambda: 1_800_000_120)
    assert enrichment_tables(pinned, pinned.streams["http_requests"].enrich[0], "http_requests") == ("users", "plans")
    assert "enrichment of 'http_requests'" in stream_dependents(pinned, "plans")


# -- the lookup ----------------------------------------------------------------------------------

KEYS = ("u1", "u2")
PLANS = ("p1", "p2", "p3")
left_changes = st.lists(st.tuples(st.integers(0, 40), st.sampled_from(KEYS),
                                  st.one_of(st.none(), st.sampled_from(("p1", "p2", "p3", ""))),
                                  st.sampled_from(("de", "fr"))), max_size=12)
right_changes = st.lists(st.tuples(st.integers(0, 40), st.sampled_from(PLANS),
                                   st.one_of(st.none(), st.sampled_from(("basic", "gold")))), max_size=12)


def versions(changes, row) -> dict[str, list[TableVersion]]:
    """Changes in log order (offsets), append times sorted (they never go back)."""
    times = sorted(c[0] for c in changes)
    return by_key((c[1], TableVersion(t, 0, i, row(c))) for i, (t, c) in enumerate(zip(times, changes, strict=True)))


@settings(max_examples=300, deadline=None)
@given(left_changes, right_changes, st.booleans(), st.integers(-1, 45))
def test_the_lookup_is_the_views_row_of_both_tables_as_of_the_time(lefts, rights, inner, at):
    shape = ViewShape(foreign_key="plan_id", inner=inner, right_columns=("tier",))
    left = versions(lefts, lambda c: None if c[2] is None else {"plan_id": c[2], "country": c[3]})
    right = versions(rights, lambda c: None if c[2] is None else {"tier": c[2]})
    tables = [{k: r for k, vs in side.items() if (r := as_of(vs, at)) is not None} for side in (left, right)]
    view = from_scratch(shape, *tables)
    for key in KEYS:
        row, complete = joined_as_of(shape, key, left.get(key, []), right, at)
        assert row == view.rows.get(key)
        plan = tables[0].get(key, {}).get("plan_id")
        assert complete == (key in tables[0] and plan in tables[1])


def test_keys_missing_on_either_side():
    shape = ViewShape(foreign_key="plan_id", inner=False, right_columns=("tier",))
    left = {"u1": [TableVersion(10, 0, 0, {"plan_id": "p9"})]}
    right = {"p1": [TableVersion(10, 0, 1, {"tier": "gold"})]}
    assert joined_as_of(shape, "u1", left["u1"], right, 20) == ({"plan_id": "p9", "tier": None}, False)  # no plan p9
    assert joined_as_of(shape, "u2", [], right, 20) == (None, False)  # no user u2
    inner = ViewShape(foreign_key="plan_id", inner=True, right_columns=("tier",))
    assert joined_as_of(inner, "u1", left["u1"], right, 20) == (None, False)
