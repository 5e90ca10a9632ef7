"""Patterns through the API (no Spark: the patterns' batches are committed by their driver side,
aggregates/patterns.py, over Arrow records as the pipeline collects them): the declared
patterns, the matches paged and filtered, bad parameters refused with the error body, the
patterns' state in /api/v1/pipeline and /metrics, the match count as a metric."""

from __future__ import annotations

import pyarrow as pa
from fastapi.testclient import TestClient

from aggregates.patterns import PatternRunner, with_patterns
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from ingest.log import SqliteEventLog
from store import BatchCommit, SqlitePaneStore
from tests.support.patterns import EXAMPLES_YAML

T0 = 1_794_999_600_000
MIN = 60_000


def records(rows) -> pa.Table:
    """(stream, partition, offset, time, dims, vals, ids) rows as the pipeline's records."""
    names = ["stream", "partition", "offset", "event_time", "dims", "vals", "ids"]
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


def login(offset: int, t: int, user: str, outcome: str, ip: str = "10.0.0.9"):
    return ("logins", 0, offset, t, [outcome, ip], [], [user])


def commit(store, runner: PatternRunner, batch_id: int, rows, watermarks: dict) -> None:
    done = runner.run(records(rows), watermarks)
    c = with_patterns(BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0), done, runner.names)
    lateness = {n: s.allowed_lateness for n, s in runner.catalog.streams.items()}
    assert store.commit_batch(c, lateness_ms=lateness, now_ms=T0).committed


def test_patterns_and_their_matches_paged_and_filtered_and_the_state_in_the_pipeline_status(tmp_path):
    catalog = parse_catalog(EXAMPLES_YAML)
    log = SqliteEventLog(tmp_path / "log.db")
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    store = SqlitePaneStore(tmp_path / "store.db")
    runner = PatternRunner(catalog, store)
    rows = []
    for n, user in enumerate(["alice", "bob", "carol"]):  # five failures then a success each, a minute apart
        base = T0 + n * 10 * MIN
        rows += [login(n * 10 + i, base + i * MIN, user, "failure") for i in range(5)]
        rows.append(login(n * 10 + 5, base + 5 * MIN, user, "success"))
    rows.reverse()  # in any order of arrival
    commit(store, runner, 0, rows, {})  # no watermark yet: all buffered
    commit(store, runner, 1, [login(99, T0 + 40 * MIN, "dave", "failure")], {"logins": T0 + 30 * MIN})
    commit(store, runner, 2, [login(100, T0 + MIN, "erin", "failure")], {"logins": T0 + 30 * MIN})  # late
    app = create_app(ApiContext(catalog=catalog, log=log, store=store, clock=lambda: (T0 + 60 * MIN) / 1000))
    with TestClient(app) as client:
        declared = client.get("/api/v1/patterns").json()["patterns"]
        assert [p["name"] for p in declared] == [p.name for p in catalog.patterns]
        assert declared[0]["matches_stream"] == "credential_stuffing_matches"
        assert declared[0]["metrics"] == ["credential_stuffing_matches", "credential_stuffing_matches_first_failure",
                                          "credential_stuffing_matches_attempts"]
        assert declared[0]["definition"]["within"] == "10m" and declared[0]["streams"] == ["logins"]
        assert declared[0]["dimensions"] == ["outcome", "ip", "late"]

        url = "/api/v1/patterns/credential_stuffing/matches"
        page = client.get(url, params={"limit": 2}).json()
        assert [(m["key"], m["decided_at_ms"]) for m in page["matches"]] == [("alice", T0 + 5 * MIN),
                                                                             ("bob", T0 + 15 * MIN)]
        assert page["matches"][0]["measures"] == {"first_failure": T0, "attempts": 5}
        assert [e["offset"] for e in page["matches"][0]["events"]] == [0, 1, 2, 3, 4, 5]
        # Its dimensions, as in its panes: those of logins (the first step's stream) but the key, from its first event.
        assert page["matches"][0]["dims"] == {"outcome": "failure", "ip": "10.0.0.9"}
        rest = client.get(url, params={"limit": 2, "cursor": page["next_cursor"]}).json()
        assert [m["key"] for m in rest["matches"]] == ["carol"] and rest["next_cursor"] is None
        # A last page that is full says so too: no cursor to an empty page.
        whole = client.get(url, params={"limit": 3}).json()
        assert [m["key"] for m in whole["matches"]] == ["alice", "bob", "carol"] and whole["next_cursor"] is None
        full = client.get(url, params={"limit": 1, "cursor": page["next_cursor"]}).json()
        assert [m["key"] for m in full["matches"]] == ["carol"] and full["next_cursor"] is None
        assert [m["key"] for m in client.get(url, params={"key": "bob"}).json()["matches"]] == ["bob"]
        window = {"from": T0 + 10 * MIN, "to": T0 + 25 * MIN + 1}
        assert [m["key"] for m in client.get(url, params=window).json()["matches"]] == ["bob", "carol"]
        assert client.get(url, params={"to": T0 + 25 * MIN - 1}).json()["matches"][-1]["key"] == "bob"

        unknown = client.get("/api/v1/patterns/nope/matches")
        assert unknown.status_code == 404 and "credential_stuffing" in unknown.json()["detail"]
        for params, param in (({"cursor": "x1"}, "cursor"), ({"from": "yesterday"}, "from"),
                              ({"from": T0 + MIN, "to": T0}, "to")):
            bad = client.get(url, params=params)
            assert bad.status_code == 400 and bad.json()["param"] == param, bad.text

        status = client.get("/api/v1/pipeline").json()["patterns"]["credential_stuffing"]
        assert status == {"streams": ["logins"], "key": "user_id", "watermark_ms": T0 + 30 * MIN, "keys_held": 1,
                          "partial_matches": 0, "buffered_events": 1, "matches": 3, "late_events": 1,
                          "history_rows": 18,  # the 18 events fed, kept for replays of late events
                          "dropped_partial_matches": 0}
        metrics = client.get("/metrics").text
        assert 'sketchboard_pattern_matches_total{pattern="credential_stuffing"} 3.0' in metrics
        assert 'sketchboard_pattern_late_events_total{pattern="credential_stuffing"} 1.0' in metrics
        assert 'sketchboard_pattern_dropped_partial_matches_total{pattern="credential_stuffing"} 0.0' in metrics
        assert 'sketchboard_pattern_state{kind="buffered_events",pattern="credential_stuffing"} 1.0' in metrics
        assert 'sketchboard_pattern_state{kind="history_rows",pattern="credential_stuffing"} 18.0' in metrics

        # The matches as a metric, through the one query path: one per match at its decided time.
        answer = client.get("/api/v1/query", params={"metric": "credential_stuffing_matches", "stat": "count",
                                                     "from": T0, "to": T0 + 30 * MIN, "step": "10m"})
        assert answer.status_code == 200, answer.text
        assert [p["value"] for p in answer.json()["series"][0]["points"]] == [1, 1, 1]
        attempts = client.get("/api/v1/query", params={"metric": "credential_stuffing_matches_attempts",
                                                       "stat": "sum", "from": T0, "to": T0 + 30 * MIN, "step": "30m"})
        assert attempts.json()["series"][0]["points"][0]["value"] == 15
        # Grouped and filtered by the matches' dimensions, `late` included.
        grouped = client.get("/api/v1/query", params={"metric": "credential_stuffing_matches", "stat": "count",
                                                      "from": T0, "to": T0 + 30 * MIN, "step": "30m",
                                                      "group_by": "ip,late", "filter": "outcome=failure"})
        assert [(s["group"], s["points"][0]["value"]) for s in grouped.json()["series"]] == [
            ({"ip": "10.0.0.9", "late": "false"}, 3)]
    store.close()
