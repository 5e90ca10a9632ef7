"""The open sessions in the store (store/sessions.py), the same contract on SQLite and PostgreSQL:
saved with the batch's transaction once, read back by key and by due time, counted per stream;
held as rows or in buckets by the density of the batches, the buckets' count following the sessions."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import BatchCommit
from store import session_layout
from store import sessions as session_store
from store.sessions import Session, SessionColumns, SessionCommit

T0 = 1_700_000_000_000


def commit(batch_id: int, *sessions: SessionCommit) -> BatchCommit:
    return BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0, sessions=list(sessions))


def test_open_sessions_are_saved_with_the_batch_once_and_read_by_key_and_due_time(store_backend):
    store = store_backend.create()
    assert store.session_state("web", ["u1"], None) == [] and store.session_sizes() == {}
    first = SessionCommit("web", kept=[Session("u1", T0, T0 + 10, 2), Session("u2", T0 + 5, T0 + 5, 1),
                                       Session("u1", T0 + 900, T0 + 950, 3)])
    assert store.commit_batch(commit(0, first, SessionCommit("app", kept=[Session("u1", T0, T0, 1)])),
                              lateness_ms={}, now_ms=T0).committed
    assert not store.commit_batch(commit(0, first), lateness_ms={}, now_ms=T0).committed  # a replay: nothing twice
    store = store_backend.reopen(store)  # a restart reads the same state
    assert store.session_state("web", ["u1"], None) == [Session("u1", T0, T0 + 10, 2), Session("u1", T0 + 900, T0 + 950, 3)]
    # Sessions due to close are read whatever their key: the batch closes them.
    assert store.session_state("web", [], T0 + 5) == [Session("u2", T0 + 5, T0 + 5, 1)]
    assert store.session_state("web", ["u9"], T0 + 10) == [Session("u1", T0, T0 + 10, 2), Session("u2", T0 + 5, T0 + 5, 1)]
    assert store.session_state("app", ["u1"], None) == [Session("u1", T0, T0, 1)]  # streams apart
    assert store.session_sizes() == {"web": 3, "app": 1}
    # A later batch: u1's first session grows (same first event), u2's closes, a new one opens.
    second = SessionCommit("web", removed=[Session("u1", T0, T0 + 10, 2), Session("u2", T0 + 5, T0 + 5, 1)],
                           kept=[Session("u1", T0, T0 + 20, 3), Session("u3", T0 + 30, T0 + 30, 1)])
    assert store.commit_batch(commit(1, second), lateness_ms={}, now_ms=T0).committed
    assert store.session_state("web", ["u1", "u2", "u3"], None) == [
        Session("u1", T0, T0 + 20, 3), Session("u1", T0 + 900, T0 + 950, 3), Session("u3", T0 + 30, T0 + 30, 1)]
    assert store.session_sizes() == {"web": 3, "app": 1}


def test_a_failed_commit_saves_no_session(store_backend):
    store = store_backend.create()
    bad = BatchCommit(pipeline="main", batch_id=0, partials=[], events_read=0, read_by_stream={"x": 3},
                      sessions=[SessionCommit("web", kept=[Session("u1", T0, T0, 1)])])
    with pytest.raises(ValueError):
        store.commit_batch(bad, lateness_ms={}, now_ms=T0)
    assert store.session_sizes() == {} and store.session_state("web", ["u1"], None) == []


def test_open_sessions_are_read_in_code_point_order_of_their_keys_and_written_in_bulk(store_backend):
    """Whatever the database's collation, the lookup's order is Python's (the rule relies on no
    order, the contract does); a batch of many sessions is written and grown in one commit."""
    store = store_backend.create()
    keys = ["b", "B", "é", "z", "😀", "a b", "ab"]
    many = [Session(f"k{i}", T0 + i, T0 + i + 5, 1) for i in range(3000)]
    kept = [Session(k, T0, T0 + 1, 1) for k in keys] + many
    assert store.commit_batch(commit(0, SessionCommit("web", kept=kept)), lateness_ms={}, now_ms=T0).committed
    assert list(store.session_state("web", keys, None)) == sorted(Session(k, T0, T0 + 1, 1) for k in keys)
    grown = [Session(s.key, s.first_ms, s.last_ms + 10, 2) for s in many]
    assert store.commit_batch(commit(1, SessionCommit("web", removed=many, kept=grown)), lateness_ms={}, now_ms=T0).committed
    assert list(store.session_state("web", [s.key for s in many], None)) == sorted(grown)
    assert store.session_sizes() == {"web": len(keys) + len(many)}
    closed = SessionCommit("web", removed=sorted(grown)[:1000])
    assert store.commit_batch(commit(2, closed), lateness_ms={}, now_ms=T0).committed
    assert store.session_sizes() == {"web": len(keys) + len(many) - 1000}


def small_buckets(monkeypatch, *, dense_floor: int = 1, row_us: float = 1e6, move_us: float = 0.0,
                  bucket_session_us: float = 0.35, bucket_key_us: float = 3.0) -> None:
    """Buckets of a few sessions, so that a test's few sessions grow and shrink their count, and
    the layout's costs (store/session_layout.py) as given: by default a row costs so much and a
    move so little that every batch puts a stream in buckets and none takes it back to rows."""
    monkeypatch.setattr(session_store, "BUCKET_SESSIONS", 2)
    monkeypatch.setattr(session_store, "MIN_BUCKETS", 2)
    monkeypatch.setattr(session_store, "DENSE_FLOOR", dense_floor)
    costs = session_layout.LayoutCosts(row_us=row_us, bucket_session_us=bucket_session_us,
                                       bucket_key_us=bucket_key_us, move_session_us=move_us)
    monkeypatch.setattr(session_layout, "SQLITE", costs)  # what the stores made after this take
    monkeypatch.setattr(session_layout, "POSTGRES", costs)


def bucket_rows(store_backend, store) -> list[tuple]:
    """(stream, bucket, buckets, sessions) of every bucket row, and the per-stream rows."""
    found = store_backend.tables(store, ["session_buckets", "session_streams"])
    return [r[:4] for r in found["session_buckets"]], found["session_streams"]


def test_a_streams_buckets_grow_and_shrink_with_its_open_sessions(store_backend, monkeypatch):
    """The sessions are spread over more buckets as they grow past twice the buckets' size and
    over fewer once below an eighth of it, every bucket rewritten; each row says its count."""
    small_buckets(monkeypatch)
    store = store_backend.create()
    few = [Session(f"k{i}", T0 + i, T0 + i, 1) for i in range(3)]
    assert store.commit_batch(commit(0, SessionCommit("web", kept=few)), lateness_ms={}, now_ms=T0).committed
    rows, streams = bucket_rows(store_backend, store)
    assert streams == [("web", 2, 3)] and {r[2] for r in rows} == {2} and sum(r[3] for r in rows) == 3
    many = [Session(f"m{i}", T0 + i, T0 + i, 1) for i in range(40)]
    assert store.commit_batch(commit(1, SessionCommit("web", kept=many)), lateness_ms={}, now_ms=T0).committed
    rows, streams = bucket_rows(store_backend, store)
    assert streams == [("web", 32, 43)] and {r[2] for r in rows} == {32} and sum(r[3] for r in rows) == 43
    assert store.session_state("web", [s.key for s in few + many], None) == sorted(few + many)
    assert store.commit_batch(commit(2, SessionCommit("web", removed=many)), lateness_ms={}, now_ms=T0).committed
    rows, streams = bucket_rows(store_backend, store)
    assert streams == [("web", 2, 3)] and {r[2] for r in rows} == {2}
    assert store.session_state("web", [s.key for s in few + many], T0 - 1) == few
    assert store.commit_batch(commit(3, SessionCommit("web", removed=few)), lateness_ms={}, now_ms=T0).committed
    assert bucket_rows(store_backend, store) == ([], []) and store.session_sizes() == {}


def test_a_streams_sessions_move_to_buckets_on_a_dense_batch_and_back_to_rows_on_a_sparse_one(store_backend,
                                                                                              monkeypatch):
    """A batch touching a large share of a stream's sessions (and enough keys) moves them into
    buckets, one touching a small share moves them back to rows (each move free here, so one
    batch's savings pay for it); the answers are the same either way, and another stream's
    sessions stay where they are. (A row costs 1, a session of a touched bucket 1.)"""
    small_buckets(monkeypatch, dense_floor=4, row_us=1.0, bucket_session_us=1.0, bucket_key_us=0.0)
    store = store_backend.create()
    ten = [Session(f"k{i}", T0 + i, T0 + i, 1) for i in range(10)]
    other = [Session("u1", T0, T0, 1)]  # a stream with one key a batch: rows, always
    assert store.commit_batch(commit(0, SessionCommit("web", kept=ten), SessionCommit("app", kept=other)),
                              lateness_ms={}, now_ms=T0).committed

    def layout() -> tuple[list, list, list]:
        found = store_backend.tables(store, ["session_open", "session_buckets", "session_streams"])
        return ([r[0] for r in found["session_open"]], sorted({r[0] for r in found["session_buckets"]}),
                [r[0] for r in found["session_streams"]])

    assert layout() == (["app"], ["web"], ["web"])  # 10 keys of none held: dense
    grown = Session("k3", T0 + 3, T0 + 50, 2)
    assert store.commit_batch(commit(1, SessionCommit("web", removed=[ten[3]], kept=[grown])),
                              lateness_ms={}, now_ms=T0).committed
    assert layout() == (["app", *["web"] * 10], [], [])  # 1 key of 10: sparse, rows again
    state = sorted([*ten[:3], grown, *ten[4:]])
    assert store.session_state("web", [s.key for s in ten], None) == state
    assert store.session_state("web", [], T0 + 4) == [s for s in state if s.last_ms <= T0 + 4]
    assert store.session_sizes() == {"web": 10, "app": 1}
    closed = SessionCommit("web", removed=state[:6])
    assert store.commit_batch(commit(2, closed), lateness_ms={}, now_ms=T0).committed
    assert layout() == (["app"], ["web"], ["web"])  # 6 keys of 10: dense, buckets again
    assert store.session_state("web", [s.key for s in ten], T0 + 100) == state[6:]
    assert store.session_sizes() == {"web": 4, "app": 1}


def test_batches_alternating_in_size_do_not_move_a_streams_sessions_back_and_forth(store_backend, monkeypatch):
    """Micro-batches of a steady rate vary several-fold in size. A rule on each batch's share of
    keys alone (before session 90) moved the sessions to buckets on each large batch and back to
    rows on each small one, every move a rewrite of them all. Now (store/session_layout.py, with
    its measured costs) they move once what the other layout would have saved pays for a move:
    here into buckets with the first batch (a backfill's, 2 000 new sessions) and never back, since
    the small batches' savings in rows are eaten by each large batch's in buckets."""
    monkeypatch.setattr(session_store, "DENSE_FLOOR", 1)
    store = store_backend.create()
    held = {f"u{i:04d}": Session(f"u{i:04d}", T0, T0, 1) for i in range(2_000)}
    assert store.commit_batch(commit(0, SessionCommit("web", kept=list(held.values()))), lateness_ms={},
                              now_ms=T0).committed
    layouts = []
    for batch_id in range(1, 13):
        keys = sorted(held)[(batch_id * 97) % 1_500:][:400 if batch_id % 2 else 30]
        grown = [Session(k, T0, T0 + batch_id, held[k].events + 1) for k in keys]
        assert store.commit_batch(commit(batch_id, SessionCommit("web", removed=[held[k] for k in keys], kept=grown)),
                                  lateness_ms={}, now_ms=T0).committed
        held.update((s.key, s) for s in grown)
        layouts.append("buckets" if store_backend.tables(store, ["session_streams"])["session_streams"] else "rows")
    assert layouts == ["buckets"] * 12
    assert store.session_state("web", sorted(held), None) == sorted(held.values())


def test_a_store_reckons_a_streams_layout_over_its_batches_not_each_batch_alone(store_backend, monkeypatch):
    """The store keeps its chooser from commit to commit: a stream held in buckets whose batches
    each touch one key (where rows cost less, but by less than a move) goes back to rows after the
    batch whose savings, summed, pass the move's cost; not never, as one batch's would decide."""
    small_buckets(monkeypatch, row_us=1.0, bucket_session_us=1.0, bucket_key_us=0.0, move_us=0.025)
    store = store_backend.create()
    held = [Session(f"k{i:02d}", T0, T0, 1) for i in range(20)]
    assert store.commit_batch(commit(0, SessionCommit("web", kept=held)), lateness_ms={}, now_ms=T0).committed
    assert store_backend.tables(store, ["session_streams"])["session_streams"]  # buckets, with the first batch
    costs = session_layout.SQLITE  # the test's, on either backend
    saving = costs.buckets(1, 20, session_store.bucket_count(20)) - costs.rows(1)
    due = next(n for n in range(1, 100) if n * saving > costs.move(20))
    assert due > 1
    for batch_id in range(1, due + 1):
        assert store_backend.tables(store, ["session_streams"])["session_streams"], batch_id  # still buckets
        grown = Session(held[batch_id].key, T0, T0 + batch_id, 2)
        assert store.commit_batch(commit(batch_id, SessionCommit("web", removed=[held[batch_id]], kept=[grown])),
                                  lateness_ms={}, now_ms=T0).committed
        held[batch_id] = grown
    assert not store_backend.tables(store, ["session_streams"])["session_streams"]  # rows
    assert store.session_state("web", [s.key for s in held], None) == sorted(held)


keys = st.sampled_from(["a", "b", "é", "😀", "a b", "", "k1", "k2", "k3", "k4", "k5", "k" * 80])
sessions = st.builds(Session, keys, st.integers(0, 5), st.integers(0, 9), st.integers(1, 3))
changes = st.tuples(st.sampled_from(["web", "app"]), st.lists(sessions, max_size=12),
                    st.lists(st.tuples(keys, st.integers(0, 5)), max_size=6))
steps = st.lists(st.tuples(st.lists(changes, min_size=1, max_size=3), st.lists(keys, max_size=4),
                           st.none() | st.integers(-1, 9), st.sampled_from(["list", "arrow", "chunks"])),
                 min_size=1, max_size=6)


def as_given(sessions: list[Session], form: str):
    """Sessions as a batch may hand them over: a list, or columns of an Arrow table (the pipeline's)."""
    if form == "list":
        return sessions
    table = session_store.as_table(sessions)
    return SessionColumns.of_table(table if form == "arrow" else pa.concat_tables([table.slice(0, 1), table.slice(1)]))


def keys_given(asked: list[str], form: str):
    """A lookup's keys as a batch may hand them over: a list, an Arrow array, or one in chunks."""
    if form == "list":
        return asked
    if form == "arrow":
        return pa.array(asked, pa.string())
    return pa.chunked_array([asked[:1], asked[1:]], pa.string())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_the_state_holds_what_each_batch_leaves_as_a_session_per_key_and_first_would(store_backend, monkeypatch,
                                                                                     steps):
    """Against a plain map from (stream, key, first) to the session: whatever batches keep and
    remove (sessions not stored among them, a grown one removed and kept, two changes of one
    stream in a batch, applied in order), each lookup by key and due time answers its sessions in
    (key, first) order and the counts agree, through moves between rows and buckets and bucket
    counts grown and shrunk (a session kept twice: the last one); a stream's sessions are in one
    layout at a time, and its bucket rows add up to its count. Sessions and keys handed over as lists
    or as Arrow columns (in one chunk or more), as the pipeline's batches hand them."""
    # Moves free, rows and bucketed sessions alike: each batch moves a stream to the layout it costs less in.
    small_buckets(monkeypatch, dense_floor=2, row_us=1.0, bucket_session_us=1.0, bucket_key_us=0.0)
    store = store_backend.create()
    model: dict[str, dict[tuple[str, int], Session]] = {"web": {}, "app": {}}
    for batch_id, (changed, asked, due, form) in enumerate(steps):
        commits = []
        for stream, kept, removed in changed:
            held = model[stream]
            gone = [held.get((k, f), Session(k, f, f, 1)) for k, f in removed]
            commits.append(SessionCommit(stream, removed=as_given(gone, form), kept=as_given(kept, form)))
            for s in gone:
                held.pop((s.key, s.first_ms), None)
            held.update({(s.key, s.first_ms): s for s in kept})
        assert store.commit_batch(commit(batch_id, *commits), lateness_ms={}, now_ms=T0).committed
        for stream, held in model.items():
            expected = sorted(s for s in held.values() if s.key in asked or (due is not None and s.last_ms <= due))
            assert list(store.session_state(stream, keys_given(asked, form), due)) == expected
        assert store.session_sizes() == {stream: len(held) for stream, held in model.items() if held}
        found = store_backend.tables(store, ["session_open", "session_buckets", "session_streams"])
        as_rows = {r[0] for r in found["session_open"]}
        counted = {stream: n for stream, _, n in found["session_streams"]}
        assert not as_rows & set(counted)  # one layout at a time
        for stream, n in counted.items():
            assert sum(r[3] for r in found["session_buckets"] if r[0] == stream) == n
