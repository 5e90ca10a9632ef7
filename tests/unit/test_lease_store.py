"""The leader lease in the store (store/lease.py) and the commit signal API replicas wake on,
on every backend (the store_backend fixture: a real SQLite file, a real PostgreSQL server).
Several "replicas" here are several LeaseStores over the same storage, as several API
processes would open it; time is injected."""

from __future__ import annotations

import threading
import time

import pytest

from store.lease import Leadership, LeaseStore
from store.lease_rules import LeaseRecord, replica_of
from tests.unit.test_store import LATENESS, T0, commit, make_data, partial
from tests.support.clock import FakeClock

NAME = "api-leader"


@pytest.fixture
def pane_store(store_backend):
    return store_backend.create()


def replica(store_backend, pane_store, me: str, clock: FakeClock, ttl_s: float = 10.0, **kw) -> Leadership:
    """A replica's lease over its own connection(s) to the same storage."""
    other = store_backend.reopen(pane_store)
    return Leadership(LeaseStore(other.side_db()), NAME, me, ttl_s=ttl_s, monotonic=clock,
                      clock=lambda: 1_700_000_000.0, **kw)


def test_a_lease_never_taken_reads_free(pane_store):
    row = LeaseStore(pane_store.side_db()).read(NAME)
    assert row.record == LeaseRecord(None, 0, 0) and row.renewed_at_ms is None


def test_compare_and_set_writes_only_over_the_version_read(store_backend, pane_store):
    a, b = LeaseStore(pane_store.side_db()), LeaseStore(store_backend.reopen(pane_store).side_db())
    free = a.read(NAME).record
    assert a.swap(NAME, free, LeaseRecord("a", 1, 1), ttl_ms=5000, now_ms=10)
    assert not b.swap(NAME, free, LeaseRecord("b", 1, 1), ttl_ms=5000, now_ms=11)  # read before a wrote
    row = b.read(NAME)
    assert row.record == LeaseRecord("a", 1, 1)
    assert (row.ttl_ms, row.renewed_at_ms, row.acquired_at_ms) == (5000, 10, 10)
    assert a.swap(NAME, row.record, LeaseRecord("a", 2, 1), ttl_ms=5000, now_ms=20)
    assert b.read(NAME).acquired_at_ms == 10 and b.read(NAME).renewed_at_ms == 20  # renewed, not re-acquired


def test_one_replica_leads_and_another_takes_over_after_the_ttl(store_backend, pane_store):
    clock = FakeClock(1000.0)
    gained, lost = [], []
    a = replica(store_backend, pane_store, "a", clock, on_gain=lambda: gained.append("a"),
                on_lose=lambda: lost.append("a"))
    b = replica(store_backend, pane_store, "b", clock, on_gain=lambda: gained.append("b"),
                on_lose=lambda: lost.append("b"))
    a.tick()
    b.tick()
    assert gained == ["a"] and a.leading() and not b.leading()
    assert b.holder().record.holder == a.holder_id and replica_of(a.holder_id) == "a"
    for _ in range(5):  # a renews every 2 s: b keeps following
        clock.now += 2
        a.tick()
        b.tick()
    assert gained == ["a"] and not lost
    # a dies (no more ticks): b takes over once it saw the row unchanged for a whole ttl.
    clock.now += 9.9
    b.tick()
    assert not b.leading()
    clock.now += 0.1
    b.tick()
    assert b.leading() and gained == ["a", "b"]
    row = b.holder()
    assert row.record.holder == b.holder_id and row.record.epoch == 2
    # a comes back (a stalled process): its lease lapsed, its next round finds b's row and stops its work.
    a.tick()
    assert not a.leading() and lost == ["a"]


def test_stopping_hands_the_lease_over_at_once(store_backend, pane_store):
    clock = FakeClock(1000.0)
    a, b = replica(store_backend, pane_store, "a", clock), replica(store_backend, pane_store, "b", clock)
    a.tick()
    b.tick()
    a.stop()
    assert a.holder().record.holder is None
    b.tick()
    assert b.leading()


def test_two_processes_with_one_replica_id_never_both_lead(store_backend, pane_store, caplog):
    """A copied SKETCHBOARD_REPLICA_ID: each took the other's row for its own renewal, and both led."""
    clock = FakeClock(1000.0)
    a, b = replica(store_backend, pane_store, "api-1", clock), replica(store_backend, pane_store, "api-1", clock)
    assert a.holder_id != b.holder_id and a.me == b.me == "api-1"
    with caplog.at_level("WARNING", logger="sketchboard.lease"):
        for _ in range(10):
            a.tick()
            b.tick()
            clock.now += 0.8
            assert not (a.leading() and b.leading())
    assert a.leading() and not b.leading()
    assert any("another process with this replica_id 'api-1'" in r.getMessage() for r in caplog.records)
    from types import SimpleNamespace

    from api.status_routes import leader_status

    shown = leader_status(SimpleNamespace(leadership=b))  # GET /api/v1/pipeline's `leader`
    assert (shown["holder"], shown["holder_process"], shown["this_replica"]) == ("api-1", a.holder_id, "api-1")
    # a dies: b, the other process, takes over after the ttl as from any other holder.
    clock.now += 10
    b.tick()
    assert b.leading() and b.holder().record.holder == b.holder_id


def test_a_row_of_the_old_format_is_read_as_its_replica_and_waited_out(store_backend, pane_store):
    """A rolling upgrade: a process without nonces holds the row as its bare replica id."""
    clock = FakeClock(1000.0)
    old = LeaseStore(store_backend.reopen(pane_store).side_db())
    assert old.swap(NAME, old.read(NAME).record, LeaseRecord("api-1", 1, 1), ttl_ms=10_000, now_ms=1)
    new = replica(store_backend, pane_store, "api-1", clock)
    assert replica_of(new.holder().record.holder) == "api-1"
    new.tick()
    assert not new.leading()  # not taken for its own: the old process may still be leading
    clock.now += 10
    new.tick()
    assert new.leading() and new.holder().record.epoch == 2


def test_a_leader_whose_renewal_blocks_stops_its_work_when_its_lease_lapses(store_backend, pane_store):
    """A renewal blocked in the store (SQLite's write lock held by a long commit) kept the leader's
    jobs running past its lease, and the next leader's on_gain could run before its on_lose."""
    events, lock, unblock = [], threading.Lock(), threading.Event()

    def record(what):
        def act():
            with lock:
                events.append((what, time.monotonic()))
        return act

    class Blocking(LeaseStore):
        blocked = False

        def swap(self, *args, **kw):
            if self.blocked:
                unblock.wait(10)  # the write waits on the lock
            return super().swap(*args, **kw)

    a_store = Blocking(store_backend.reopen(pane_store).side_db())
    a = Leadership(a_store, NAME, "a", ttl_s=0.5, on_gain=record("a gains"), on_lose=record("a loses"))
    b = Leadership(LeaseStore(store_backend.reopen(pane_store).side_db()), NAME, "b", ttl_s=0.5,
                   on_gain=record("b gains"), on_lose=record("b loses"))
    a.start()
    deadline = time.monotonic() + 10
    while not a.leading() and time.monotonic() < deadline:
        time.sleep(0.01)
    b.start()
    time.sleep(0.3)
    a_store.blocked = True
    blocked_at = time.monotonic()
    while not any(what == "b gains" for what, _ in events) and time.monotonic() < blocked_at + 10:
        time.sleep(0.01)
    unblock.set()
    a.stop()
    b.stop()
    order = [what for what, _ in events]
    assert order[:3] == ["a gains", "a loses", "b gains"], order
    lost_at = dict((what, at) for what, at in events)["a loses"]
    assert lost_at - blocked_at < 0.5 + 0.3  # at its lease's lapse (a ttl at most), not when the write returned


def test_the_threads_keep_exactly_one_leader_and_fail_over(store_backend, pane_store):
    """Real threads and time.monotonic: a short ttl, three replicas; the leader stops without
    releasing (as a killed process would), another leads within ~1.4 ttl."""
    leaders: list[str] = []
    lock = threading.Lock()
    overlap = []

    def track(name):
        def gain():
            with lock:
                if leaders:
                    overlap.append((name, list(leaders)))
                leaders.append(name)

        def lose():
            with lock:
                leaders.remove(name)
        return gain, lose

    replicas = []
    for name in "abc":
        gain, lose = track(name)
        replicas.append(Leadership(LeaseStore(store_backend.reopen(pane_store).side_db()), NAME, name, ttl_s=1.0,
                                   on_gain=gain, on_lose=lose))
    for r in replicas:
        r.start()
    deadline = time.monotonic() + 10
    while not leaders and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(leaders) == 1
    first = next(r for r in replicas if r.me == leaders[0])
    first.stop(release=False)  # as a killed process: the row stays held by a replica that is gone
    died = time.monotonic()
    while time.monotonic() < died + 10:
        with lock:
            if leaders:
                break
        time.sleep(0.02)
    took = time.monotonic() - died
    assert len(leaders) == 1 and leaders[0] != first.me
    assert took < 1.4 + 3.0, f"takeover took {took:.2f} s"  # 1.4 ttl, plus slack for a loaded machine
    for r in replicas:
        r.stop()
    assert not overlap


def test_commits_signal_listeners_on_postgres_and_sqlite_polls(store_backend, pane_store):
    signal = pane_store.change_signal()
    if store_backend.kind == "sqlite":
        assert signal is None  # the websocket hub polls the change feed on its interval
        return
    try:
        deadline = time.monotonic() + 10
        while not signal.listening and time.monotonic() < deadline:
            time.sleep(0.02)
        assert signal.listening
        signal.wait(0)  # the wake-up given when it started listening
        assert not signal.wait(0.2)
        writer = store_backend.reopen(pane_store)  # another process's store: the pipeline's
        writer.commit_batch(commit(1, [partial(T0, {"route": "/a"}, make_data([1.0]))]), lateness_ms=LATENESS,
                            now_ms=T0)
        assert signal.wait(5)
        assert signal.notifications == 1
        # A replayed batch id commits nothing, and notifies nothing.
        writer.commit_batch(commit(1, [partial(T0, {"route": "/a"}, make_data([1.0]))]), lateness_ms=LATENESS,
                            now_ms=T0)
        assert not signal.wait(0.5)
    finally:
        signal.close()
