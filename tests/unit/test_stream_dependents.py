"""What a stream's records feed under another name (catalog/dependents.py): the joins, patterns,
views and enrichments a switch of the stream would leave built the old way, so it is refused."""

from __future__ import annotations

from catalog import parse_catalog
from catalog.dependents import aligned_joins, aligned_patterns, other_streams, rebuilt_patterns, refused_dependents, stream_dependents
from tests.support.patterns import EXAMPLES_YAML
from tests.unit.test_enrichment import CONFIG as ENRICHED
from sketchboard.reprocess import run_end_offsets, stream_catalog
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


def test_a_run_rebuilds_what_reads_its_stream_alone_and_the_rest_is_refused(demo_catalog):
    """A pattern over the stream alone: built by the run and switched with the stream. A join or a
    pattern over two streams: rebuilt reading the other stream too, on the embedded log (refused on
    Kafka). A view (two tables), an enrichment: still refused."""
    catalog = parse_catalog(EXAMPLES_YAML)
    assert [p.name for p in rebuilt_patterns(catalog, "logins")] == ["credential_stuffing"]
    assert refused_dependents(catalog, "logins") == []
    run = stream_catalog(catalog, "logins")
    assert [p.name for p in run.patterns] == ["credential_stuffing"] and "credential_stuffing_matches" in run.streams
    assert run.patterns[0] == catalog.patterns[0]
    assert refused_dependents(demo_catalog, "searches") == ["join 'search_clicks'"]  # on Kafka
    # On the embedded log the run rebuilds the join, reading its other stream too (a synchronized switch).
    assert refused_dependents(demo_catalog, "searches", joins_rebuilt=True) == []
    assert aligned_joins(demo_catalog, "searches") == list(demo_catalog.joins)
    assert other_streams(demo_catalog, "clicks") == ["searches"]
    run = stream_catalog(demo_catalog, "searches")
    assert run.joins == demo_catalog.joins and {"searches", "clicks", "search_clicks"} <= set(run.streams)
    assert stream_catalog(demo_catalog, "searches", with_joins=False).joins == ()
    views = catalog_with("  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}\n")
    assert refused_dependents(views, "users") == ["view 'user_plans'"]
    assert refused_dependents(parse_catalog(ENRICHED), "users") == ["enrichment of 'http_requests'"]
    two = parse_catalog("""
streams:
  views_: {key_field: user, dimensions: [page]}
  buys: {key_field: user, dimensions: [item]}
patterns:
  - name: view_then_buy
    key: user
    within: 5m
    steps:
      - {name: seen, stream: views_}
      - {name: bought, stream: buys}
""")
    # On Kafka a pattern over two streams is refused; on the embedded log the run rebuilds it,
    # reading the other stream as far as the serving pipeline has (a synchronized switch, as a join).
    assert refused_dependents(two, "buys") == ["pattern 'view_then_buy'"]
    assert stream_catalog(two, "buys", with_joins=False).patterns == ()
    assert refused_dependents(two, "buys", joins_rebuilt=True) == []
    assert [p.name for p in aligned_patterns(two, "buys")] == ["view_then_buy"] and rebuilt_patterns(two, "buys") == []
    assert other_streams(two, "buys") == ["views_"] and other_streams(two, "views_") == ["buys"]
    run = stream_catalog(two, "buys")
    assert run.patterns == two.patterns and {"views_", "buys", "view_then_buy_matches"} <= set(run.streams)


def test_a_view_is_rebuilt_by_a_run_of_either_table_reading_the_other_and_enrichments_stay_refused():
    """On the embedded log a run of a table rebuilds the views over it, reading the view's other
    table as far as the serving pipeline has (a synchronized switch moves the view's rows). On
    Kafka, and for a stream enriched through the view, the switch stays refused."""
    from catalog.dependents import aligned_views

    views = catalog_with("  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}\n")
    assert refused_dependents(views, "users", joins_rebuilt=True) == []
    assert refused_dependents(views, "plans", joins_rebuilt=True) == []
    assert [v.name for v in aligned_views(views, "plans")] == ["user_plans"] and aligned_views(views, "clicks") == []
    assert other_streams(views, "users") == ["plans"] and other_streams(views, "plans") == ["users"]
    run = stream_catalog(views, "users")
    assert run.views == views.views and {"users", "plans", "user_plans"} <= set(run.streams)
    assert stream_catalog(views, "users", with_joins=False).views == {}
    enriched = parse_catalog(ENRICHED)
    assert refused_dependents(enriched, "users") == ["enrichment of 'http_requests'"]  # runs rebuilding neither (no log now)


def test_a_run_of_a_table_rebuilds_the_streams_enriched_from_it_directly_or_through_a_view(demo_catalog):
    """On both logs a run of a table rebuilds each stream enriched from it with that stream's
    tables: read whole, to the log's end (the switch moves its offsets too), unless it needs a
    table the run reads only as far as the serving pipeline has (a view's other table) or feeds a
    join or a pattern: then it is read as far as the serving pipeline has too, and those are rebuilt
    with it (their other streams capped), all aligned by a synchronized switch. On Kafka in batches
    of the run's own, cut at one append time (end offsets given, even where none is capped)."""
    from catalog.dependents import aligned_enrichments, capped_streams, enriched_streams, enrichment_feeds

    enriched = parse_catalog(ENRICHED)
    assert enriched_streams(enriched, "users") == ["http_requests"] and enriched_streams(enriched, "http_requests") == []
    assert aligned_enrichments(enriched, "users") == [] and capped_streams(enriched, "users") == []  # no hold
    assert refused_dependents(enriched, "users", joins_rebuilt=True) == []
    run = stream_catalog(enriched, "users")
    assert set(run.streams) >= {"users", "http_requests"} and run.streams["http_requests"] == enriched.streams["http_requests"]
    assert "requests" in run.metrics  # its metrics with it
    assert "http_requests" not in stream_catalog(enriched, "users", with_joins=False).streams
    # No caps (nothing capped is read: no settings, registry or log needed), but end offsets given,
    # so that on Kafka the run plans its batches itself, cut at one append time (ingest/append_cut.py):
    # the table's run and the enriched stream's; a run that enriches nothing leaves them to the source.
    assert run_end_offsets(None, enriched, "users", None, None) == {}
    assert run_end_offsets(None, enriched, "http_requests", None, None) == {}
    plain = parse_catalog("streams:\n  users: {kind: table, key_field: user_id, dimensions: [plan]}\n")
    assert run_end_offsets(None, plain, "users", None, None) is None
    # Through a view (the demo: http_requests enriched through user_plans = users x plans): a run
    # of either table rebuilds the view (the other table capped) and the enriched stream, capped
    # too: its events are looked up in the other table, which the run reads no further.
    for table, other in (("users", "plans"), ("plans", "users")):
        assert enriched_streams(demo_catalog, table) == ["http_requests"]
        assert refused_dependents(demo_catalog, table, joins_rebuilt=True) == []
        assert other_streams(demo_catalog, table) == [other]
        assert aligned_enrichments(demo_catalog, table) == ["http_requests"]
        assert capped_streams(demo_catalog, table) == sorted([other, "http_requests"])
        run = stream_catalog(demo_catalog, table)
        assert {"users", "plans", "http_requests"} <= set(run.streams) and "user_plans" in run.views
    # A stream enriched from the table that also feeds a join: rebuilt with the join (the join's
    # other stream and the enriched stream capped), so nothing is refused.
    joined = parse_catalog(ENRICHED.replace("metrics:\n", """  clicks: {key_field: user_id, dimensions: [button]}
joins:
  - name: request_clicks
    left: {stream: http_requests, key: user_id}
    right: {stream: clicks, key: user_id}
    within: 1m
metrics:
"""))
    assert enriched_streams(joined, "users") == ["http_requests"]
    assert enrichment_feeds(joined, "users") == (list(joined.joins), [])
    assert aligned_enrichments(joined, "users") == ["http_requests"]
    assert capped_streams(joined, "users") == ["clicks", "http_requests"]
    assert refused_dependents(joined, "users", joins_rebuilt=True) == []
    run = stream_catalog(joined, "users")
    assert {"users", "http_requests", "clicks", "request_clicks"} <= set(run.streams) and run.joins == joined.joins
    assert "clicks" not in stream_catalog(joined, "users", with_joins=False).streams
    # ... and one that feeds a pattern (over itself alone, or with another stream) likewise.
    patterned = parse_catalog(ENRICHED.replace("metrics:\n", """  clicks: {key_field: user_id, dimensions: [button]}
patterns:
  - name: busy
    key: user_id
    within: 1m
    steps: [{stream: http_requests, name: a}, {stream: http_requests, name: b}]
  - name: clicked
    key: user_id
    within: 1m
    steps: [{stream: http_requests, name: req}, {stream: clicks, name: click}]
metrics:
"""))
    assert [p.name for p in enrichment_feeds(patterned, "users")[1]] == ["busy", "clicked"]
    assert capped_streams(patterned, "users") == ["clicks", "http_requests"]
    assert [p.name for p in stream_catalog(patterned, "users").patterns] == ["busy", "clicked"]
    # ... and one that the table's own pattern reads beside the table: rebuilt and capped alike.
    own = parse_catalog(ENRICHED.replace("metrics:\n", """patterns:
  - name: signed_up_then_requested
    key: user_id
    within: 1m
    steps: [{stream: users, name: signup}, {stream: http_requests, name: request}]
metrics:
"""))
    assert other_streams(own, "users") == ["http_requests"] == enriched_streams(own, "users")
    assert aligned_enrichments(own, "users") == ["http_requests"] == capped_streams(own, "users")
    assert refused_dependents(own, "users", joins_rebuilt=True) == []
