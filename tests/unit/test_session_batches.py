"""Sessions in the pane batch, the driver's part (aggregates/session_batch.py) with a real store on
both backends: runs in, closed sessions as partials of `<stream>_sessions` and open sessions in
the batch's transaction; a late event behind a closed session becomes a session of its own whose
pane is corrected (not dropped), and a replayed batch adds nothing."""

from __future__ import annotations

import pyarrow as pa
from fastapi.testclient import TestClient

from aggregates.session_batch import SessionWindows, with_sessions
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from ingest.log import SqliteEventLog
from sketches import HllSketch, KllSketch
from store import BatchCommit
from store.sessions import Session

T0 = 1_700_000_040_000 - 1_700_000_040_000 % 60_000
MIN = 60_000
CATALOG = parse_catalog("""
streams:
  web:
    key_field: user
    distinct: [user]
    pane: 1m
    allowed_lateness: 30s
    sessions: {key: user, gap: 1m}
""")


def runs(*sessions: Session) -> pa.Table:
    return pa.table({"stream": ["web"] * len(sessions), "key": [s.key for s in sessions],
                     "first_ms": [s.first_ms for s in sessions], "last_ms": [s.last_ms for s in sessions],
                     "events": [s.events for s in sessions]}, schema=pa.schema([
                         ("stream", pa.string()), ("key", pa.string()), ("first_ms", pa.int64()),
                         ("last_ms", pa.int64()), ("events", pa.int64())]))


def batch(store, batch_id: int, newest_ms: int, *sessions: Session):
    windows = SessionWindows(CATALOG, store)
    commit = BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0,
                         max_event_ms={"web": newest_ms})
    done = windows.sessionize(runs(*sessions), commit, now_ms=T0 + 60 * MIN)
    commit = with_sessions(commit, done, windows.names)
    lateness = {name: s.allowed_lateness for name, s in CATALOG.streams.items()}
    return done, store.commit_batch(commit, lateness_ms=lateness, now_ms=T0 + 60 * MIN)


def test_closed_sessions_become_panes_open_ones_stay_in_the_store_and_a_late_event_corrects_a_final_pane(
        store_backend, tmp_path):
    store = store_backend.create()
    # Watermark after the batch: T0 + 40m - 30s. u1 and u2 close; u3 (last T0 + 40m) stays open.
    done, result = batch(store, 0, T0 + 40 * MIN, Session("u1", T0, T0 + 10_000, 3), Session("u2", T0 + 5_000, T0 + 5_000, 1),
                         Session("u3", T0 + 30 * MIN, T0 + 30 * MIN, 1), Session("u3", T0 + 40 * MIN, T0 + 40 * MIN, 2))
    assert result.committed and (done.runs, done.closed) == (4, 3)
    assert store.session_state("web", ["u3"], None) == [Session("u3", T0 + 40 * MIN, T0 + 40 * MIN, 2)]
    (first,) = store.read_panes("web_sessions", T0, T0 + MIN, value_field="events", distinct_field="user", with_sketches=True)
    assert first.data.count == 2
    duration, events = first.data.values["duration_ms"], first.data.values["events"]
    assert (duration.n, duration.sum, duration.min, duration.max) == (2, 10_000.0, 0.0, 10_000.0)
    assert (events.sum, KllSketch.from_bytes(events.kll).n) == (4.0, 2)
    assert round(HllSketch.from_bytes(first.data.distincts["user"]).estimate().estimate) == 2
    # The derived stream's watermark (newest session start T0 + 30m - 30s - gap) made T0's pane final.
    assert store.progress("main").streams["web_sessions"].watermark_ms == T0 + 30 * MIN - 30_000 - MIN

    # A late event of u1 (20 s after its closed session's last): a session of its own, into the
    # final pane as a correction; u3's open session grows.
    done, result = batch(store, 1, T0 + 40 * MIN + 5_000, Session("u1", T0 + 30_000, T0 + 30_000, 1),
                         Session("u3", T0 + 40 * MIN + 5_000, T0 + 40 * MIN + 5_000, 1))
    assert result.committed and result.corrections == 1 and done.closed == 1
    (first,) = store.read_panes("web_sessions", T0, T0 + MIN)
    assert (first.data.count, first.revision) == (3, 2)
    assert store.session_state("web", ["u3"], None) == [Session("u3", T0 + 40 * MIN, T0 + 40 * MIN + 5_000, 3)]
    # The same batch id again: skipped by the store, nothing twice.
    assert not batch(store, 1, T0 + 40 * MIN + 5_000, Session("u1", T0 + 30_000, T0 + 30_000, 1))[1].committed
    assert store.read_panes("web_sessions", T0, T0 + MIN)[0].data.count == 3
    assert store.session_sizes() == {"web": 1}

    # The open sessions in GET /api/v1/pipeline (null for a stream without sessions) and /metrics.
    ctx = ApiContext(catalog=CATALOG, log=SqliteEventLog(tmp_path / "log.db"), store=store,
                     clock=lambda: (T0 + 60 * MIN) / 1000)
    with TestClient(create_app(ctx)) as client:
        streams = client.get("/api/v1/pipeline").json()["streams"]
        assert (streams["web"]["open_sessions"], streams["web_sessions"]["open_sessions"]) == (1, None)
        assert 'sketchboard_open_sessions{stream="web"} 1.0' in client.get("/metrics").text
