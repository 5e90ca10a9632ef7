"""Switching a stream's served output to a reprocessing run's, switching back, ?version= lookups
and dropping an output, without Spark, on both store backends (store/switch.py,
aggregates/reprocess.py; the Spark side is tests/spark/test_reprocess.py)."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from aggregates.checkpoint_moves import move_offsets
from aggregates.reprocess import ALIGN_ATTEMPTS, NeedsAlignment, SwitchRefused, run_id
from catalog import Catalog
from catalog.dependents import moved_with
from catalog.versions import catalog_versions, definition_version
from sketchboard.definitions import pin_definitions
from sketchboard.reprocess import auto_switch, build_reprocess_service
from sketchboard.settings import Settings
from sketchboard.wiring import open_log, open_store
from store import dims_key
from store.base import BatchCommit, PanePartial
from store.definitions import DefinitionStore
from store.namespace import ROOT
from store.panes import PaneData
from store import session_layout
from store import sessions as session_store
from store.sessions import Session, SessionCommit
from store.table_versions import EnrichmentCommit
from store.joins import JoinCommit
from store.switch import SWITCHED_REVISION, DefinitionSwitched, Side, SwitchConflict, SwitchHeld, switch_stream

NOW = 1_800_000_000_000
PANE = 10_000
OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"]},
                   "orders": {"key_field": "customer"}},
       "metrics": {"requests": {"stream": "http"}}}
NEW = {**OLD, "streams": {**OLD["streams"], "http": {**OLD["streams"]["http"], "dimensions": ["endpoint", "region"]}}}


def batch(pipeline: str, batch_id: int, counts: dict[tuple, int], offsets: dict[int, int], catalog: Catalog,
          stream: str = "http") -> BatchCommit:
    dims = catalog.streams[stream].dimensions
    partials = [PanePartial(stream, NOW, NOW + PANE, dict(zip(dims, key)), PaneData(count=n))
                for key, n in counts.items()]
    return BatchCommit(pipeline=pipeline, batch_id=batch_id, partials=partials, events_read=sum(counts.values()),
                       max_event_ms={stream: NOW}, end_offsets={stream: offsets},
                       definition_versions=catalog_versions(catalog))


def counts(store, stream: str = "http") -> dict[str, int]:
    return {p.key.dims: p.data.count for p in store.read_panes(stream, 0, 2**62)}


@pytest.fixture
def settings(tmp_path, store_backend):
    extra = {}
    if store_backend.kind == "postgres":
        extra = {"store_backend": "postgres", "postgres_dsn": store_backend.create().dsn, "postgres_pool_size": 2}
    return Settings(data_dir=tmp_path / "data", streams_config=tmp_path / "streams.yaml", alerts_config=None, **extra)


def test_switch_swaps_the_served_output_keeps_the_old_one_and_switches_back(settings):
    old, new = Catalog(**OLD), Catalog(**NEW)
    commit = dict(lateness_ms={"http": 0, "orders": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    root.commit_batch(batch("main", 0, {("/a",): 5, ("/b",): 2}, {0: 7}, old), **commit)
    root.commit_batch(batch("main", 1, {(): 4}, {0: 4}, old, stream="orders"), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")  # launch: none here; its pipeline's output is written below
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)
    output.commit_batch(batch(run.id, 0, {("/a", "eu"): 3, ("/a", "us"): 2, ("/b", "eu"): 2}, {0: 7}, new), **commit)
    output.close()
    old_version, new_version = (definition_version(c.streams["http"]) for c in (old, new))
    try:
        # Not before it has caught up, and it says why.
        with pytest.raises(SwitchRefused, match="is starting .*0/0 offsets read.*caught up"):
            service.switch(run.id)
        service.definitions.set_state(run.id, "caught_up", NOW)
        seq = max((c.seq for c in root.changes_since(0)), default=0)

        switched = service.switch(run.id)
        previous = run_id("http", old_version, "previous-")
        assert switched["previous"] == previous and switched["offsets"] == {"0": 7}
        assert counts(root) == {dims_key({"endpoint": "/a", "region": "eu"}): 3,
                                dims_key({"endpoint": "/a", "region": "us"}): 2,
                                dims_key({"endpoint": "/b", "region": "eu"}): 2}
        assert counts(root, "orders") == {dims_key({}): 4}  # other streams untouched
        assert service.serving_version("http") == new_version
        assert root.progress("main").end_offsets["http"] == {0: 7}  # the run's offsets are the root's
        assert root.progress("main").streams["http"].events_aggregated == 7
        (change,) = [c for c in root.changes_since(seq)]
        assert change.stream == "http" and change.revision == SWITCHED_REVISION  # websocket hubs reload
        # The serving pipeline is told where to read the stream from (its checkpoint is moved at start).
        assert service.definitions.offset_moves("main") == {"http": {0: 7}}
        # A live pipeline still computing the old way is fenced: its next commit is refused whole.
        with pytest.raises(DefinitionSwitched, match="'http' was switched"):
            root.commit_batch(batch("main", 2, {("/a",): 1}, {0: 8}, old), **commit)
        assert counts(root)[dims_key({"endpoint": "/a", "region": "eu"})] == 3

        # A switch decided on a served version that is no longer served (another came first) changes nothing.
        with pytest.raises(SwitchConflict), service.outputs.storage.transaction([run.id, previous]) as (db, names):
            switch_stream(db, "http", root=Side("", "main"), source=Side(names[run.id], run.id),
                          previous=Side(names[previous], previous), serving_version=old_version, now_ms=NOW)
        assert service.serving_version("http") == new_version and len(counts(root)) == 3

        # ?version=: the old output is kept in its own namespace, found by its version.
        namespace, definition = service.output("http", old_version[:8])
        assert namespace == previous and definition["dimensions"] == ["endpoint"]
        assert service.output("http", new_version) == (ROOT, service.definitions.definitions()["http"].definition)
        with pytest.raises(KeyError, match="no output of version 'deadbeef'"):
            service.output("http", "deadbeef")
        kept = open_store(settings, previous)
        assert counts(kept) == {dims_key({"endpoint": "/a"}): 5, dims_key({"endpoint": "/b"}): 2}
        assert DefinitionStore(kept.side_db()).definitions()["http"].version == old_version
        kept.close()
        assert service.versions("http") == [{"version": new_version, "namespace": ROOT, "serving": True},
                                            {"version": old_version, "namespace": previous, "serving": False}]

        # Dropping the served version is refused; switching back is a second switch.
        with pytest.raises(SwitchRefused, match="is the served one"):
            service.drop(run.id)
        back = service.switch(previous)
        assert back["previous"] == run_id("http", new_version, "previous-")
        assert counts(root) == {dims_key({"endpoint": "/a"}): 5, dims_key({"endpoint": "/b"}): 2}
        assert service.serving_version("http") == old_version
        root.commit_batch(batch("main", 3, {("/a",): 1}, {0: 8}, old), **commit)  # the old way is accepted again
        assert counts(root)[dims_key({"endpoint": "/a"})] == 6

        # Drop: the output, its run, its registry entry go; its version is no longer queryable.
        service.drop(run.id)
        assert service.run(run.id) is None and not service.outputs.storage.exists(run.id)
        assert run.id not in [c.pipeline for c in service.registry.consumers()]
        with pytest.raises(KeyError):
            service.drop(run.id)
        with pytest.raises(SwitchRefused, match="is the served one"):
            service.drop(previous)
        # reprocess_drop_after: outputs neither served nor going, past the age, go by themselves.
        assert service.drop_unused(3_600_000) == []  # the previous output of the new version is too young
        assert service.drop_unused(0) == [run_id("http", new_version, "previous-")]
        assert [r.id for r in service.runs()] == [previous]
    finally:
        for r in service.runs():
            service.outputs.storage.drop(r.id)
        log.close()
        root.close()


def _run_with_an_output(settings):
    """The served output of OLD with one batch, a run of http under NEW and its output's first
    batch: (old, new, the commits' arguments, the root, the log, the service, the run, its output)."""
    old, new = Catalog(**OLD), Catalog(**NEW)
    commit = dict(lateness_ms={"http": 0, "orders": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    root.commit_batch(batch("main", 0, {("/a",): 5}, {0: 5}, old), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)
    output.commit_batch(batch(run.id, 0, {("/a", "eu"): 5}, {0: 5}, new), **commit)
    return old, new, commit, root, log, service, run, output


def test_a_switch_reads_on_to_the_logs_end_first_when_the_serving_pipeline_has_read_further(settings):
    """The run caught up with the log's end as of its start; the serving pipeline went on. A switch
    without a process that can run the run's pipeline is refused as needing one (the API starts a
    child: NeedsAlignment); with one, the run reads on (`align` with no stream to stop) until it
    is as far as the serving pipeline, then switches: the serving pipeline goes on from there,
    and readers never see the new output behind the served one. A replaced output, which cannot
    read on, is switched back to as it is."""
    old, new, commit, root, log, service, run, output = _run_with_an_output(settings)
    service.definitions.set_state(run.id, "caught_up", NOW)
    root.commit_batch(batch("main", 1, {("/a",): 2}, {0: 7}, old), **commit)  # the live pipeline went on
    calls = []

    def align(r, offsets):  # the run's pipeline reading on: one batch to the log's end (7, then 8)
        calls.append(offsets)
        output.commit_batch(batch(r.id, len(calls), {("/a", "eu"): 2 if len(calls) == 1 else 1},
                                  {0: 7 if len(calls) == 1 else 8}, new), **commit)
        if len(calls) == 1:  # meanwhile the serving pipeline committed one more
            root.commit_batch(batch("main", 2, {("/a",): 1}, {0: 8}, old), **commit)

    try:
        with pytest.raises(NeedsAlignment, match="has read less of 'http' than the serving pipeline"):
            service.switch(run.id)
        switched = service.switch(run.id, align=align)
        assert calls == [{}, {}] and switched["offsets"] == {"0": 8}
        assert counts(root) == {dims_key({"endpoint": "/a", "region": "eu"}): 8}
        assert service.definitions.offset_moves("main") == {"http": {0: 8}}
        # Back to the replaced output, as far as it went (8): no read-on, none needed.
        back = service.switch(switched["previous"])
        assert counts(root) == {dims_key({"endpoint": "/a"}): 8} and back["offsets"] == {"0": 8}
    finally:
        output.close()
        close_fixture(root, log, service)


def switch_fixture(settings, old: Catalog, new: Catalog, root_misses: int, run_misses: int):
    """The root serving `old`'s http (with that many enrichment misses), a caught-up run of `new`'s."""
    commit = dict(lateness_ms={"http": 0, "orders": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    root.commit_batch(replace(batch("main", 0, {("/a",): 5}, {0: 5}, old),
                              enrichment=EnrichmentCommit({}, {}, {("http", "users"): root_misses})), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)
    output.commit_batch(replace(batch(run.id, 0, {("/a", "eu"): 5}, {0: 5}, new),
                                enrichment=EnrichmentCommit({}, {}, {("http", "users"): run_misses})), **commit)
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    return root, log, service, run


def close_fixture(root, log, service) -> None:
    for r in service.runs():
        service.outputs.storage.drop(r.id)
    log.close()
    root.close()


def test_a_switch_moves_the_streams_enrichment_misses_with_its_panes(settings):
    """The misses count the stream's events enriched with "": a counter of its output like the
    dead letters, so the served one must be the run's, and the replaced one kept with its output."""
    old, new = Catalog(**OLD), Catalog(**NEW)
    root, log, service, run = switch_fixture(settings, old, new, root_misses=4, run_misses=1)
    try:
        switched = service.switch(run.id)
        assert root.progress("main").streams["http"].enrich_misses == {"users": 1}
        kept = open_store(settings, switched["previous"])
        assert kept.progress("main").streams["http"].enrich_misses == {"users": 4}
        kept.close()
        service.switch(switched["previous"])  # and back
        assert root.progress("main").streams["http"].enrich_misses == {"users": 4}
    finally:
        close_fixture(root, log, service)


DERIVING = {"key_field": "user", "sessions": {"key": "user"}, "sent_time_field": "sent_at"}
OLD_DERIVING = {**OLD, "streams": {**OLD["streams"], "http": {**OLD["streams"]["http"], **DERIVING}}}
NEW_DERIVING = {**NEW, "streams": {**NEW["streams"], "http": {**NEW["streams"]["http"], **DERIVING}}}


def with_derived(commit: BatchCommit, catalog: Catalog, n: int) -> BatchCommit:
    """The batch plus what `http` derives in it: n closed sessions, n device clock rows, one open session of n events."""
    partials = [PanePartial(name, NOW, NOW + PANE, dict.fromkeys(catalog.streams[name].dimensions, "x"),
                            PaneData(count=n)) for name in ("http_sessions", "http_clocks")]
    return replace(commit, partials=[*commit.partials, *partials],
                   sessions=[SessionCommit("http", kept=[Session("u1", NOW, NOW + n, n)])])


@pytest.mark.parametrize("layout", ["rows", "buckets"])
def test_a_switch_moves_the_streams_sessions_and_device_clocks_with_it(settings, monkeypatch, layout):
    """`<stream>_sessions` (closed sessions) and its open sessions, and `<stream>_clocks`, are built
    by a run in its own batches from the stream's records: they are the stream's output too, so
    they are switched with it, in the same transaction, and kept with the replaced output; the open
    sessions as rows or in buckets (store/sessions.py), and back to a kept output written before
    the buckets' tables existed."""
    if layout == "buckets":  # rows dear, moves free: every batch puts the sessions in buckets
        monkeypatch.setattr(session_store, "DENSE_FLOOR", 1)
        dear_rows = session_layout.LayoutCosts(row_us=1e6, bucket_session_us=0.35, bucket_key_us=3.0,
                                               move_session_us=0.0)
        monkeypatch.setattr(session_layout, "SQLITE", dear_rows)
        monkeypatch.setattr(session_layout, "POSTGRES", dear_rows)
    old, new = Catalog(**OLD_DERIVING), Catalog(**NEW_DERIVING)
    commit = dict(lateness_ms={"http": 0, "orders": 0, "http_sessions": 0, "http_clocks": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    root.commit_batch(with_derived(batch("main", 0, {("/a",): 5}, {0: 5}, old), old, 4), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)
    output.commit_batch(with_derived(batch(run.id, 0, {("/a", "eu"): 5}, {0: 5}, new), new, 2), **commit)
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    try:
        seq = max((c.seq for c in root.changes_since(0)), default=0)
        switched = service.switch(run.id)
        for name in ("http_sessions", "http_clocks"):
            assert sum(counts(root, name).values()) == 2, name
        assert [s.events for s in root.session_state("http", ["u1"], None)] == [2]
        reloaded = {c.stream for c in root.changes_since(seq) if c.revision == SWITCHED_REVISION}
        assert reloaded == {"http", "http_sessions", "http_clocks"}  # their subscribers get new snapshots
        kept = open_store(settings, switched["previous"])
        assert [sum(counts(kept, name).values()) for name in ("http_sessions", "http_clocks")] == [4, 4]
        assert [s.events for s in kept.session_state("http", ["u1"], None)] == [4]
        if layout == "rows":  # its sessions as rows: as a Sketchboard from before the buckets left it
            db = kept.side_db()
            with db.transaction():
                for table in ("session_buckets", "session_streams"):
                    db.execute(f"DROP TABLE {table}")
        kept.close()
        service.switch(switched["previous"])  # and back
        assert sum(counts(root, "http_sessions").values()) == 4
        assert [s.events for s in root.session_state("http", ["u1"], None)] == [4]
    finally:
        close_fixture(root, log, service)


def test_derived_streams_moved_with_a_stream_are_those_either_declaration_generates():
    old, new = Catalog(**OLD_DERIVING), Catalog(**NEW)
    assert moved_with("http", old.streams["http"], new.streams["http"]) == ["http_clocks", "http_sessions"]
    assert moved_with("http", new.streams["http"]) == []


PATTERNED = {**NEW, "patterns": [{"name": "burst", "key": "user", "within": "5m", "steps": [
    {"name": "hits", "stream": "http", "where": {"endpoint": "/a"}, "times": 2}]}]}


def with_matches(commit: BatchCommit, catalog: Catalog, keys: list[str], retract: str | None = None) -> BatchCommit:
    """The batch plus the pattern's work in it: a match per key (and a retraction of one), its state's definition."""
    from catalog.defined_patterns import pattern_definition_id
    from store.patterns import NewMatch, PatternCommit

    def match(key, retraction=False):
        return NewMatch(key, NOW, [{"step": "hits", "partition": 0, "offset": 1}], {}, retraction=retraction)

    found = [match(k) for k in keys] + ([match(retract, True)] if retract else [])
    pattern = catalog.patterns[0]
    return replace(commit, patterns=[PatternCommit("burst", NOW, matches=found,
                                                   definition_id=pattern_definition_id(catalog, pattern))])


def standing(store) -> list[str]:
    rows = store.pattern_matches("burst", limit=1000)
    gone = {m.retracts for m in rows if m.retracts is not None}
    return sorted(m.key for m in rows if m.retracts is None and m.id not in gone)


def test_a_switch_moves_a_pattern_that_reads_the_stream_alone_with_it(settings):
    """The run rebuilt the pattern (it reads nothing else): its matches and state are switched
    with the stream, a retraction still naming the match it withdraws, ids past the root's."""
    old, new = Catalog(**{**OLD, "patterns": PATTERNED["patterns"]}), Catalog(**PATTERNED)
    commit = dict(lateness_ms={"http": 0, "orders": 0, "burst_matches": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    root.commit_batch(with_matches(batch("main", 0, {("/a",): 5}, {0: 5}, old), old, ["u1", "u2", "u3"]), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)
    output.commit_batch(with_matches(batch(run.id, 0, {("/a", "eu"): 5}, {0: 5}, new), new, ["u7", "u8"], "u7"),
                        **commit)
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    try:
        top = max(m.id for m in root.pattern_matches("burst", limit=1000))
        switched = service.switch(run.id)
        assert standing(root) == ["u8"]  # the run's u7 was retracted there
        assert min(m.id for m in root.pattern_matches("burst", limit=1000)) > top
        assert root.pattern_sizes()["burst"].definition_id is not None
        kept = open_store(settings, switched["previous"])
        assert standing(kept) == ["u1", "u2", "u3"]
        kept.close()
        # New matches get ids past the copied ones (PostgreSQL's identity sequence follows them).
        root.commit_batch(with_matches(batch("main", 5, {("/a", "us"): 1}, {0: 6}, new), new, ["u9"]), **commit)
        assert standing(root) == ["u8", "u9"]
        service.switch(switched["previous"])  # and back
        assert standing(root) == ["u1", "u2", "u3"]
    finally:
        close_fixture(root, log, service)


def test_runs_follow_the_patterns_defined_through_the_api_and_a_switch_needs_them_built(settings):
    """A run's catalog is the configuration's with the store's pattern definitions, as the serving
    pipeline runs them (with their stored versions: the state's definition id); a pattern the run
    did not build (defined after it started) refuses the switch, which changes nothing."""
    from sketchboard.reprocess import stream_catalog
    from store.pattern_definitions import PatternDefinitionStore

    old, new = Catalog(**OLD), Catalog(**NEW)
    root, log, service, run = switch_fixture(settings, old, new, root_misses=0, run_misses=0)
    try:
        declared = {"name": "api_burst", "key": "user", "within": "5m",
                    "steps": [{"name": "hits", "stream": "http", "where": {"endpoint": "/a"}, "times": 2}]}
        stored = PatternDefinitionStore(root.side_db()).create("api_burst", declared, now_ms=NOW)
        full = service.full_catalog()
        assert [p.name for p in full.patterns] == ["api_burst"] and service.catalog.patterns == ()
        mine = stream_catalog(full, "http")
        assert [p.name for p in mine.patterns] == ["api_burst"]
        assert mine.defined_patterns == {"api_burst": stored.version}
        with pytest.raises(SwitchRefused, match="did not build pattern 'api_burst'"):
            service.switch(run.id)
        assert counts(root) == {dims_key({"endpoint": "/a"}): 5}
        assert service.serving_version("http") == definition_version(old.streams["http"])
    finally:
        close_fixture(root, log, service)


JOINED = {"streams": {**NEW["streams"], "clicks": {"key_field": "user", "dimensions": ["button"]}},
          "joins": [{"name": "http_clicks", "left": {"stream": "http", "key": "user"},
                     "right": {"stream": "clicks", "key": "user"}, "within": "5m"}],
          "metrics": NEW["metrics"]}


OLD_JOINED = {**JOINED, "streams": {**JOINED["streams"], "http": OLD["streams"]["http"]}}


def joined_fixture(settings):
    """The root serving `http` the old way and the join `http_clicks` (clicks read to offset 3, the
    join's state: 1 pair); a caught-up run of the new `http` that read clicks to offset 2 (2 pairs)."""
    old, new = Catalog(**OLD_JOINED), Catalog(**JOINED)
    commit = dict(lateness_ms={"http": 0, "clicks": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    root.commit_batch(replace(batch("main", 0, {("/a",): 5}, {0: 5}, old), end_offsets={"http": {0: 5}, "clicks": {0: 3}},
                              joins=[JoinCommit("http_clicks", NOW, None, pairs=1)]), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)  # the run reads clicks too (sketchboard/reprocess.py stream_catalog)
    output.commit_batch(replace(batch(run.id, 0, {("/a", "eu"): 5}, {0: 5}, new),
                                end_offsets={"http": {0: 5}, "clicks": {0: 2}},
                                joins=[JoinCommit("http_clicks", NOW, None, pairs=2)]), **commit)
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    return old, new, root, log, service, run


def test_a_stream_feeding_a_join_is_switched_in_step_with_the_serving_pipeline(settings):
    """A synchronized switch: the serving pipeline's commits are held (SwitchHeld, retried by its
    committer) while the run's final batch reads the join's other stream to exactly the serving
    pipeline's offsets; the switch checks that under the commit lock and moves the join's state
    with the stream. Without the final batch (the API's plain switch) it is refused, saying how."""
    old, new, root, log, service, run = joined_fixture(settings)
    commit = dict(lateness_ms={"http": 0, "clicks": 0}, now_ms=NOW)
    try:
        with pytest.raises(NeedsAlignment, match="feeds join 'http_clicks'.*sketchboard reprocess http --switch"):
            service.switch(run.id)
        service.joins_rebuilt = False  # a log whose runs could not stop the other stream (none now)
        with pytest.raises(SwitchRefused, match="'http' also feeds join 'http_clicks'"):
            service.switch(run.id)
        service.joins_rebuilt = True
        calls = []

        def align(run_, offsets):  # the run's final batch, as sketchboard/reprocess.py runs it
            calls.append(offsets)
            with pytest.raises(SwitchHeld, match="'main' is held"):
                root.commit_batch(batch("main", 1, {("/a",): 1}, {0: 6}, old), **commit)
            output = open_store(settings, run.id)
            output.commit_batch(replace(batch(run.id, len(calls), {}, {0: 5}, new),
                                        end_offsets={"http": {0: 5}, "clicks": offsets["clicks"]},
                                        joins=[JoinCommit("http_clicks", NOW, None, pairs=1)]), **commit)
            output.close()

        switched = service.switch(run.id, align=align)
        assert calls == [{"clicks": {0: 3}}] and switched["offsets"] == {"0": 5}
        assert service.definitions.holds() == {}
        assert root.join_sizes()["http_clicks"].pairs == 3  # the run's state, read to the serving pipeline's offset
        assert counts(root) == {dims_key({"endpoint": "/a", "region": "eu"}): 5}
        assert root.progress("main").end_offsets["clicks"] == {0: 3}  # the other stream's offsets stay
        kept = open_store(settings, switched["previous"])
        assert kept.join_sizes()["http_clicks"].pairs == 1  # the replaced state, kept with the old output
        kept.close()
        with pytest.raises(DefinitionSwitched):  # the held batch, computed the old way, is refused
            root.commit_batch(batch("main", 1, {("/a",): 1}, {0: 6}, old), **commit)
        with pytest.raises(SwitchRefused, match="is a replaced output"):  # its join state stopped there
            service.switch(switched["previous"], align=align)
    finally:
        close_fixture(root, log, service)


def test_both_streams_of_a_join_changed_are_refused_before_the_run_saying_to_switch_one_at_a_time(settings):
    """Both streams of a join changed: each one's switch waits for the other's (the serving pipeline
    computes the other as stored), so neither could ever be switched. The refusal comes before any
    run (`sketchboard reprocess --switch` asks refuse_unswitchable before Spark) and says the way
    out: one change at a time. A run that read the other stream with another definition than the
    one served now (switched since the run started) is refused too, before its final batch."""
    from catalog.versions import short_version, stream_document

    old, new, root, log, service, run = joined_fixture(settings)
    both = Catalog(**{**JOINED, "streams": {**JOINED["streams"], "clicks": {"key_field": "user",
                                                                             "dimensions": ["button", "page"]}}})
    served_clicks = short_version(definition_version(old.streams["clicks"], old))
    never = lambda run_, offsets: pytest.fail("no final batch for a refused switch")  # noqa: E731
    try:
        service.catalog = both
        for stream, other in [("http", "clicks"), ("clicks", "http")]:
            with pytest.raises(SwitchRefused, match=f"the definition of '{other}' .read by join 'http_clicks' with"
                                                    f" '{stream}'. changed too.*switch one at a time: configure"
                                                    f" '{other}' as served"):
                service.refuse_unswitchable(stream)
        with pytest.raises(SwitchRefused, match=f"configure 'clicks' as served .version {served_clicks}. again,"
                                                " reprocess 'http' and switch it"):
            service.switch(run.id, align=never)
        service.catalog = new  # clicks configured as served again: http's run can be switched
        service.refuse_unswitchable("http")
        # clicks switched to its new definition after http's run read it the old way: the run's join
        # state holds clicks' records as the old definition read them.
        service.catalog = both
        clicks = both.streams["clicks"]
        service.definitions.replace("clicks", definition_version(clicks, both), stream_document(clicks, both), NOW)
        with pytest.raises(SwitchRefused, match=f"read 'clicks' .built with {served_clicks}, served with"
                                                f" {short_version(definition_version(clicks, both))}. with another"
                                                " definition.*start a new run"):
            service.switch(run.id, align=never)
        assert service.serving_version("http") == definition_version(old.streams["http"], old)
    finally:
        close_fixture(root, log, service)


def test_a_synchronized_switch_that_cannot_align_changes_nothing_and_releases_the_hold(settings):
    old, new, root, log, service, run = joined_fixture(settings)
    calls = []
    try:
        with pytest.raises(SwitchRefused, match="could not be aligned.*'clicks' to .0: 2., the serving pipeline to .0: 3."):
            service.switch(run.id, align=lambda run_, offsets: calls.append(offsets))  # reads nothing more
        assert len(calls) == ALIGN_ATTEMPTS and service.definitions.holds() == {}
        assert service.serving_version("http") == definition_version(old.streams["http"], old)
        assert root.join_sizes()["http_clicks"].pairs == 1 and counts(root) == {dims_key({"endpoint": "/a"}): 5}
        assert service.definitions.offset_moves("main") == {}
        root.commit_batch(batch("main", 1, {("/a",): 1}, {0: 6}, old), lateness_ms={"http": 0}, now_ms=NOW)
    finally:
        close_fixture(root, log, service)


def test_a_held_commit_goes_on_once_the_hold_is_released_not_after_its_backoff(settings):
    """The serving pipeline's committer (aggregates/store_commit.py) waits out a synchronized
    switch's hold by polling it: its commit is tried again at the first poll that finds the hold
    gone, not after the back-off (30 s here), which is never slept whole."""
    import logging

    from aggregates.batch_gate import BatchGate
    from aggregates.commit_retry import Backoff
    from aggregates.store_commit import HOLD_POLL_S, StoreCommitter

    old, new, root, log, service, run = joined_fixture(settings)
    tries = []

    def hold(sql: str, *args) -> None:  # as the switch sets and releases it, under the commit lock
        with service.outputs.storage.transaction([]) as (db, _):
            db.execute(sql, args)

    class Gate(BatchGate):  # the pipeline's sleeps, counted; the switch releases the hold during the third
        def sleep(self, seconds: float) -> bool:
            tries.append(("sleep", seconds))
            if len(tries) == 4:
                hold("DELETE FROM switch_holds WHERE pipeline = ?", "main")
            return False

    try:
        hold("INSERT INTO switch_holds (pipeline, run_id, at_ms) VALUES (?, ?, ?)", "main", run.id, NOW)
        committer = StoreCommitter(root, "main", Gate(), log=logging.getLogger("test"),
                                   backoff=Backoff(initial_s=30.0, max_s=30.0))
        commit = committer.store.commit_batch

        def counted(*args, **kwargs):
            tries.append("commit")
            return commit(*args, **kwargs)

        committer.store.commit_batch = counted
        result = committer.commit(batch("main", 1, {("/a",): 1}, {0: 6}, old), lateness_ms={"http": 0},
                                  retention_ms={"http": 86_400_000})
        assert result.committed
        assert tries == ["commit", *[("sleep", HOLD_POLL_S)] * 3, "commit"]
    finally:
        close_fixture(root, log, service)


@pytest.mark.parametrize("joined", [False, True])
def test_reprocess_auto_switch_serves_a_caught_up_run_unless_refused(settings, joined):
    """`reprocess_auto_switch` (what `sketchboard reprocess` and the API's runs do once caught up):
    off, the run waits for a switch by hand; on, it is served at once; refused, it says why."""
    old, new = Catalog(**OLD), Catalog(**(JOINED if joined else NEW))
    root, log, service, run = switch_fixture(settings, old, new, root_misses=0, run_misses=0)
    try:
        out = io.StringIO()
        assert auto_switch(settings, service, run, out) is None and out.getvalue() == ""
        assert service.serving_version("http") == definition_version(old.streams["http"])
        switched = auto_switch(settings.model_copy(update={"reprocess_auto_switch": True}), service, run, out)
        if joined:
            assert switched is None and "not switched: " in out.getvalue() and "http_clicks" in out.getvalue()
            assert counts(root) == {dims_key({"endpoint": "/a"}): 5}
        else:
            assert switched["previous"] == run_id("http", definition_version(old.streams["http"]), "previous-")
            assert service.serving_version("http") == definition_version(new.streams["http"])
            assert counts(root) == {dims_key({"endpoint": "/a", "region": "eu"}): 5}
            assert "is now served from version" in out.getvalue()
    finally:
        close_fixture(root, log, service)


def test_a_checkpoint_move_settles_the_last_batch_then_logs_the_moved_offsets(tmp_path):
    folder = tmp_path / "cp"
    (folder / "offsets").mkdir(parents=True)
    (folder / "commits").mkdir()
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1}'
    for n, (a, b) in enumerate([(10, 5), (20, 9)]):
        (folder / "offsets" / str(n)).write_text(f'v1\n{meta}\n{{"http":{{"0":{a}}},"orders":{{"0":{b}}}}}')
    (folder / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}')
    # Batch 1 planned, not in the store: its plan goes, the move is made from batch 0.
    assert move_offsets(folder, {"http": {0: 3}}, store_last_batch=0) == 1
    assert (folder / "offsets" / "1").read_text().splitlines()[2] == '{"http":{"0":3},"orders":{"0":5}}'
    assert (folder / "commits" / "1").exists()
    # Planned and stored but not committed by Spark: it gets its commit, the move comes after it.
    (folder / "offsets" / "2").write_text(f'v1\n{meta}\n{{"http":{{"0":8}},"orders":{{"0":9}}}}')
    assert move_offsets(folder, {"http": {0: 6}}, store_last_batch=2) == 3
    assert (folder / "commits" / "2").exists()
    assert (folder / "offsets" / "3").read_text().splitlines()[2] == '{"http":{"0":6},"orders":{"0":9}}'
    assert move_offsets(tmp_path / "none", {"http": {0: 1}}, None) is None


VIEWED_OLD = {"streams": {"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan_id"]},
                          "plans": {"kind": "table", "key_field": "id", "dimensions": ["tier"]}},
              "views": {"user_plans": {"left": "users", "right": "plans", "foreign_key": "plan_id", "kind": "left"}}}
VIEWED_NEW = {**VIEWED_OLD, "streams": {**VIEWED_OLD["streams"], "users": {
    **VIEWED_OLD["streams"]["users"], "dimensions": ["plan_id", "country"]}}}


def table_batch(store, catalog: Catalog, pipeline: str, batch_id: int, changes: dict, offsets: dict) -> None:
    """A batch of table changes ({table: {key: row or None}}, at their offsets) with the views it makes."""
    from aggregates.views import Views, with_views
    from store.table_state import TableChange

    changes = {t: {k: TableChange(row, NOW, 0, offsets[t][0] - 1, NOW) for k, row in rows.items()}
               for t, rows in changes.items()}
    views = Views(catalog, store)
    commit = BatchCommit(pipeline=pipeline, batch_id=batch_id, partials=[], events_read=0,
                         end_offsets={t: o for t, o in offsets.items()}, table_changes=changes,
                         definition_versions=catalog_versions(catalog))
    result = store.commit_batch(with_views(commit, views.process(changes, batch_now_ms=NOW), views.names),
                                lateness_ms={n: 0 for n in catalog.streams}, now_ms=NOW)
    assert result.committed


def test_a_table_a_view_reads_is_switched_in_step_and_the_views_changelog_gets_the_difference(settings):
    """The view's rows move with the table by a synchronized switch (the run read the view's other
    table to exactly the serving pipeline's offsets), and the difference between the served rows
    and the rebuilt ones is appended to the root's changelog: a reader going on from its cursor
    (of either form) ends with the rebuilt rows."""
    old, new = Catalog(**VIEWED_OLD), Catalog(**VIEWED_NEW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    gold, free = {"tier": "gold"}, {"tier": "free"}
    served = {"users": {"u1": {"plan_id": "p1"}, "u2": {"plan_id": "p2"}, "u3": {"plan_id": "p1"}},
              "plans": {"p1": gold, "p2": free}}
    table_batch(root, old, "main", 0, served, {"users": {0: 3}, "plans": {0: 3}})
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("users")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)  # the run reads plans too (sketchboard/reprocess.py stream_catalog)
    rebuilt = {"users": {"u1": {"plan_id": "p1", "country": "nl"}, "u2": {"plan_id": "p2", "country": "de"},
                         "u4": {"plan_id": "p9", "country": "fr"}},  # u3 deleted, u4 new (in the log since)
               "plans": {"p1": gold}}  # plans read to offset 2: p2 not yet
    table_batch(output, new, run.id, 0, rebuilt, {"users": {0: 5}, "plans": {0: 2}})
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    before = root.view_changes("user_plans", limit=100)
    assert len(before) == 6  # the users joined without a plan, then with theirs (left before right)
    try:
        with pytest.raises(NeedsAlignment, match="feeds view 'user_plans'.*sketchboard reprocess users --switch"):
            service.switch(run.id)
        service.joins_rebuilt = False  # a log whose runs could not stop the other table (none now)
        with pytest.raises(SwitchRefused, match="'users' also feeds view 'user_plans'.*cannot stop the other"
                                                " stream of view 'user_plans'.*switching in step needs"):
            service.switch(run.id)
        service.joins_rebuilt = True
        calls = []

        def align(run_, offsets):  # the run's final batch: plans read on to the serving pipeline's offset
            calls.append(offsets)
            output = open_store(settings, run.id)
            table_batch(output, new, run.id, 1, {"plans": {"p2": free}}, {"users": {0: 5}, "plans": offsets["plans"]})
            output.close()

        switched = service.switch(run.id, align=align)
        assert calls == [{"plans": {0: 3}}] and switched["offsets"] == {"0": 5}
        want = {"u1": {"plan_id": "p1", "country": "nl", "tier": "gold"},
                "u2": {"plan_id": "p2", "country": "de", "tier": "free"},
                "u4": {"plan_id": "p9", "country": "fr", "tier": None}}
        assert {r.key: dict(r.row) for r in root.view_rows("user_plans")} == want
        appended = root.view_changes("user_plans", after=before[-1].cursor)
        assert [(c.key, c.old, c.new) for c in appended] == [
            ("u1", {"plan_id": "p1", "tier": "gold"}, want["u1"]), ("u2", {"plan_id": "p2", "tier": "free"}, want["u2"]),
            ("u3", {"plan_id": "p1", "tier": "gold"}, None), ("u4", None, want["u4"])]
        assert root.view_changes("user_plans", after="0.5") == appended  # a cursor of the old form
        rows: dict = {}
        for c in root.view_changes("user_plans", limit=100):  # replayed from empty: the rebuilt view
            assert rows.get(c.key) == (None if c.old is None else dict(c.old))
            rows = {k: v for k, v in rows.items() if k != c.key} | ({} if c.new is None else {c.key: dict(c.new)})
        assert rows == want
        assert root.progress("main").end_offsets["plans"] == {0: 3}  # the other table's offsets stay
        kept = open_store(settings, switched["previous"])
        assert {r.key for r in kept.view_rows("user_plans")} == {"u1", "u2", "u3"}  # the replaced rows
        kept.close()
        # The serving pipeline, restarted with the new definition, maintains the view from there.
        table_batch(root, new, "main", 1, {"plans": {"p9": {"tier": "pro"}}}, {"users": {0: 5}, "plans": {0: 4}})
        assert [(c.key, c.new) for c in root.view_changes("user_plans", after=appended[-1].cursor)] == \
            [("u4", {**want["u4"], "tier": "pro"})]
    finally:
        close_fixture(root, log, service)


ENRICHING_OLD = {"streams": {"users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"]},
                             "http": {"key_field": "user_id", "dimensions": ["method"], "sessions": {"key": "user_id"},
                                      "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}}}
# A column more on the table: the versions the enrichment looks up are built with it from now on.
ENRICHING_NEW = {"streams": {**ENRICHING_OLD["streams"], "users": {**ENRICHING_OLD["streams"]["users"],
                                                                    "dimensions": ["plan", "country"]}}}


def enriching_batch(store, catalog: Catalog, pipeline: str, batch_id: int, plan: str, misses: int,
                    offsets: dict[str, dict[int, int]], versions: list, joins: tuple = ()) -> None:
    """A batch of `http` (one pane, enriched with `plan`) and of `users` (the table's versions)."""
    partials = [PanePartial("http", NOW, NOW + PANE, {"method": "GET", "plan": plan}, PaneData(count=3)),
                PanePartial("users", NOW, NOW + PANE, {"plan": plan}, PaneData(count=len(versions)))]
    commit = BatchCommit(pipeline=pipeline, batch_id=batch_id, partials=partials, events_read=3 + len(versions),
                         max_event_ms={"http": NOW, "users": NOW}, end_offsets=offsets,
                         definition_versions=catalog_versions(catalog),
                         enrichment=EnrichmentCommit({"users": versions}, {}, {("http", "users"): misses}),
                         joins=list(joins))
    assert store.commit_batch(commit, lateness_ms={n: 0 for n in catalog.streams}, now_ms=NOW).committed


def test_a_table_that_enriches_a_stream_is_switched_with_the_stream_and_its_row_versions(settings):
    """The run of the table rebuilt the enriched stream (its panes, misses, sessions) and the table's
    row versions with the new definition: the switch moves them all with the table, the stream's
    offsets too (an offset move each), keeps the replaced ones in the previous namespace, and can
    be switched back. A run that did not build the stream is refused, saying why."""
    from store.table_versions import TableVersion

    old, new = Catalog(**ENRICHING_OLD), Catalog(**ENRICHING_NEW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    enriching_batch(root, old, "main", 0, "free", 2, {"users": {0: 2}, "http": {0: 9}},
                    [("u1", TableVersion(NOW, 0, 0, {"plan": "free"}))])
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("users")
    output = open_store(settings, run.id)
    try:
        # A run that did not build http (started before runs rebuilt enriched streams): refused.
        pin_definitions(output, Catalog(streams={"users": ENRICHING_NEW["streams"]["users"]}), run.id)
        service.definitions.set_state(run.id, "caught_up", NOW)
        with pytest.raises(SwitchRefused, match="did not build stream 'http', enriched from 'users'.*new run"):
            service.switch(run.id)
        pin_definitions(output, new, run.id)
        new_version = {"plan": "pro", "country": "nl"}
        enriching_batch(output, new, run.id, 0, "pro", 1, {"users": {0: 2}, "http": {0: 11}},
                        [("u1", TableVersion(NOW, 0, 0, new_version))])
        output.close()
        switched = service.switch(run.id)  # no hold: both streams' offsets move to the run's
        assert switched["enriched"] == ["http"] and switched["offsets"] == {"0": 2}
        assert counts(root) == {dims_key({"method": "GET", "plan": "pro"}): 3}
        assert root.table_versions("users") == [("u1", TableVersion(NOW, 0, 0, new_version))]
        assert root.progress("main").streams["http"].enrich_misses == {"users": 1}
        assert service.definitions.offset_moves("main") == {"users": {0: 2}, "http": {0: 11}}
        assert root.progress("main").end_offsets["http"] == {0: 11}
        switched_streams = {c.stream for c in root.changes_since(0) if c.revision == SWITCHED_REVISION}
        assert switched_streams == {"users", "http", "http_sessions"}  # websocket hubs reload all three
        kept = open_store(settings, switched["previous"])
        assert counts(kept) == {dims_key({"method": "GET", "plan": "free"}): 3}
        assert kept.table_versions("users") == [("u1", TableVersion(NOW, 0, 0, {"plan": "free"}))]
        assert kept.progress("main").streams["http"].enrich_misses == {"users": 2}
        kept.close()
        # ?version=: http's own version did not change (only the table's): its replaced output is
        # found by the table's old version.
        old_users = definition_version(old.streams["users"], old)
        namespace, declaration = service.output("http", old_users[:8])
        assert namespace == switched["previous"] and declaration["enrich"][0]["columns"] == ["plan"]
        assert "http" in service.definitions.run_reads(run.id)  # the run's progress covers it
        # The serving pipeline still computing the old way is fenced, an http-only batch too.
        with pytest.raises(DefinitionSwitched, match="'users' was switched"):
            root.commit_batch(batch("main", 1, {("GET",): 1}, {0: 10}, old), lateness_ms={"http": 0}, now_ms=NOW)
        back = service.switch(switched["previous"])  # switching back moves them back together
        assert back["enriched"] == ["http"]
        assert counts(root) == {dims_key({"method": "GET", "plan": "free"}): 3}
        assert root.table_versions("users") == [("u1", TableVersion(NOW, 0, 0, {"plan": "free"}))]
        assert service.definitions.offset_moves("main") == {"users": {0: 2}, "http": {0: 9}}
    finally:
        close_fixture(root, log, service)


def test_a_table_whose_enriched_stream_feeds_a_join_is_switched_in_step_with_the_stream_and_the_join(settings):
    """The enriched stream `http` feeds the join `http_clicks`: the table's run rebuilt both, reading
    `http` and `clicks` only as far as the serving pipeline had; the switch is a synchronized one
    (the run's final batch reads both to exactly the serving pipeline's offsets), moves the join's
    state with the stream and the table's versions, and leaves both streams' offsets where the
    serving pipeline has them (only the table's move). A run not aligned on `http` is refused."""
    from store.table_versions import TableVersion

    join = {"clicks": {"key_field": "user_id", "dimensions": ["button"]}}
    joins = [{"name": "http_clicks", "left": {"stream": "http", "key": "user_id"},
              "right": {"stream": "clicks", "key": "user_id"}, "within": "5m"}]
    old = Catalog(streams={**ENRICHING_OLD["streams"], **join}, joins=joins)
    new = Catalog(streams={**ENRICHING_NEW["streams"], **join}, joins=joins)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    enriching_batch(root, old, "main", 0, "free", 2, {"users": {0: 2}, "http": {0: 9}, "clicks": {0: 3}},
                    [("u1", TableVersion(NOW, 0, 0, {"plan": "free"}))], joins=[JoinCommit("http_clicks", NOW, None, pairs=1)])
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("users")
    assert service.definitions.run_reads(run.id)["http"][1][0] == 9  # its progress ends at the serving pipeline's
    output = open_store(settings, run.id)
    try:
        pin_definitions(output, new, run.id)
        new_version = ("u1", TableVersion(NOW, 0, 0, {"plan": "pro", "country": "nl"}))
        enriching_batch(output, new, run.id, 0, "pro", 1, {"users": {0: 4}, "http": {0: 8}, "clicks": {0: 3}},
                        [new_version], joins=[JoinCommit("http_clicks", NOW, None, pairs=2)])
        output.close()
        service.definitions.set_state(run.id, "caught_up", NOW)
        with pytest.raises(NeedsAlignment, match="feeds join 'http_clicks', enrichment of 'http'.*--switch"):
            service.switch(run.id)
        with pytest.raises(SwitchRefused, match="could not be aligned.*'http' to .0: 8., the serving pipeline to .0: 9."):
            service.switch(run.id, align=lambda run_, offsets: None)  # a final batch that read nothing
        calls = []

        def align(run_, offsets):  # the run's final batch: both read to exactly the serving pipeline's offsets
            calls.append(offsets)
            out = open_store(settings, run.id)
            enriching_batch(out, new, run.id, len(calls), "pro", 0, {"users": {0: 4}, **offsets}, [],
                            joins=[JoinCommit("http_clicks", NOW, None, pairs=1)])
            out.close()

        switched = service.switch(run.id, align=align)
        assert calls == [{"clicks": {0: 3}, "http": {0: 9}}] and switched["enriched"] == ["http"]
        assert service.definitions.holds() == {}
        assert root.join_sizes()["http_clicks"].pairs == 3  # the run's join state
        assert counts(root) == {dims_key({"method": "GET", "plan": "pro"}): 6}  # the run's: 3 + 3
        assert root.table_versions("users") == [new_version]
        assert service.definitions.offset_moves("main") == {"users": {0: 4}, "http": {0: 9}}  # http: where it was
        assert root.progress("main").end_offsets["clicks"] == {0: 3}
        kept = open_store(settings, switched["previous"])
        assert kept.join_sizes()["http_clicks"].pairs == 1  # the replaced state, kept with the old output
        kept.close()
        with pytest.raises(SwitchRefused, match="is a replaced output"):  # its join state stopped there
            service.switch(switched["previous"], align=align)
    finally:
        close_fixture(root, log, service)


def test_a_tables_run_carries_the_versions_compaction_removed_from_its_log_as_its_new_definition_reads_them(settings):
    """A run of a table rebuilds its row versions from its log with the new definition; the versions
    the serving store kept of changes compacted away are carried in, converted (the new column "",
    the key the same), and those still in the log are left to the run. Another key carries none."""
    from aggregates.reprocess import carried_versions
    from ingest.tables import TableRowValidator
    from sketchboard.reprocess import carried_table_versions, seed_table_versions
    from store.table_versions import TableVersion

    old, new = Catalog(**ENRICHING_OLD), Catalog(**ENRICHING_NEW)
    log = open_log(settings, new)
    users = new.streams["users"]
    validator = TableRowValidator(users)
    changes = [{"user_id": "u1", "plan": "free", "country": "nl"}, {"user_id": "u1", "plan": "pro", "country": "de"},
               {"user_id": "u2", "plan": "team", "country": "fr"}, {"user_id": "u1", "plan": "team", "country": "de"}]
    positions = []
    for i, change in enumerate(changes):  # one append each: its own append time
        result = log.append(users, [validator.validate(change, NOW + i)], NOW + i)
        (partition, (first, _)), = result.ranges.items()
        positions.append((change["user_id"], TableVersion(NOW + i, int(partition), first,
                                                          {"plan": change["plan"]})))  # as the old definition kept it
    root = open_store(settings)
    pin_definitions(root, old, "main")
    enriching_batch(root, old, "main", 0, "free", 0, {"users": {0: 4}, "http": {0: 0}}, positions)
    run_out = None
    try:
        assert log.compact(NOW + 10) == 2  # u1's first two changes go
        carried = carried_table_versions(new, "users", root, log)
        assert carried == [(k, TableVersion(v.valid_from_ms, v.partition, v.offset, {"plan": v.row["plan"], "country": ""}))
                           for k, v in positions[:2]]
        run_out = open_store(settings, "reprocess-users-test")
        assert seed_table_versions(new, "users", root, run_out, log) == 2
        assert run_out.table_versions("users") == carried
        rekeyed = users.model_copy(update={"key_field": "email"})
        assert carried_versions(positions, set(), old.streams["users"], rekeyed) == []
    finally:
        if run_out is not None:
            run_out.close()
            open_store(settings).close()
        log.close()
        root.close()


# The tables with a `stream` column that a switch does not copy with STREAM_TABLES, and why.
MOVED_OTHERWISE = {
    "changes": "the change feed: readers page by the root's positions; a switch appends one `switched` record",
    "pipeline_offsets": "the run's end offsets become the serving pipeline's (renamed, with an offset move)",
    "table_versions": "a table's row versions: moved with the table and the streams enriched from it",
    "stream_definitions": "the version and declaration an output was built with: the run's replace the root's",
    "offset_moves": "what a switch tells the serving pipeline: where to read the stream from",
    "consumer_offsets": "each pipeline's committed offsets as the lag and a run's progress read them",
    "consumer_starts": "where each pipeline's first run started, its position for lag until it commits: its own",
    "reprocess_runs": "the runs and the outputs kept by switches, by id: not an output's rows",
    "reprocess_run_reads": "the streams a run read and how far: its record, not an output's rows",
    "lag_samples": "each pipeline's lag over time (GET /api/v1/lag): the serving pipeline's stays its own",
}


def test_every_table_holding_a_streams_rows_is_moved_by_a_switch_or_named_with_its_reason(settings):
    """A table added to the store with rows per stream must be added to STREAM_TABLES (a switch
    then moves it with the stream's panes and keeps the old rows with the previous output) or to
    MOVED_OTHERWISE here, with its reason: else a switch would leave the old definition's rows
    of it under the new output, silently. Both store backends."""
    from store.connection import SqliteDb
    from store.switch import PATTERN_TABLES, STREAM_TABLES

    from store.alerts import AlertStore
    from store.audit import AuditStore
    from store.consumers import ConsumerRegistry
    from store.dashboards import DashboardStore
    from store.final_points import FinalPoints
    from store.health import HealthStore
    from store.idempotency import IdempotencyStore
    from store.lag import LagStore
    from store.lease import LeaseStore
    from store.pattern_definitions import PatternDefinitionStore

    root = open_store(settings)
    try:
        # The side stores make their tables when first opened: every one, so that none is missed.
        for side in (DefinitionStore, ConsumerRegistry, LagStore, HealthStore, FinalPoints, AlertStore,
                     IdempotencyStore, LeaseStore, AuditStore, DashboardStore, PatternDefinitionStore):
            side(root.side_db()).close()
        db = root.side_db()
        if isinstance(db, SqliteDb):
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()]
            per_stream = {t for t in tables
                          if "stream" in [r[1] for r in db.execute(f"PRAGMA main.table_info({t})").fetchall()]}
        else:
            per_stream = {r[0] for r in db.execute(
                "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema()"
                " AND column_name = 'stream'").fetchall()}
        db.close()
    finally:
        root.close()
    assert set(STREAM_TABLES) <= per_stream
    assert per_stream - set(STREAM_TABLES) - set(PATTERN_TABLES) == set(MOVED_OTHERWISE)


def late(pipeline: str, batch_id: int, dims: dict, offsets: dict[int, int], catalog: Catalog) -> BatchCommit:
    """One event in the pane NOW, which the watermark (NOW + 2 panes) has passed: a correction after the first."""
    return BatchCommit(pipeline=pipeline, batch_id=batch_id, events_read=1, max_event_ms={"http": NOW + 2 * PANE},
                       partials=[PanePartial("http", NOW, NOW + PANE, dims, PaneData(count=1))],
                       end_offsets={"http": offsets}, definition_versions=catalog_versions(catalog))


def test_the_corrections_feed_does_not_push_the_copies_a_switch_makes_of_a_runs_corrections(settings):
    """A switch copies the run's corrections into the root under new, higher ids: the websocket's
    corrections feed pushed each as news, for panes no client ever saw. The switch records the
    copies' ids in its transaction, so every process's feed skips them, not live corrections."""
    from api.corrections_routes import CorrectionsFeed

    old, new = Catalog(**OLD), Catalog(**NEW)
    commit = dict(lateness_ms={"http": 0}, now_ms=NOW)
    root = open_store(settings)
    pin_definitions(root, old, "main")
    for b in range(3):
        root.commit_batch(late("main", b, {"endpoint": "/a"}, {0: b + 1}, old), **commit)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    run = service.start("http")
    output = open_store(settings, run.id)
    pin_definitions(output, new, run.id)
    for b in range(6):
        output.commit_batch(late(run.id, b, {"endpoint": "/a", "region": "eu"}, {0: b + 1}, new), **commit)
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    feed = CorrectionsFeed(root)  # started before the switch, as an API process's is (no listener: any process)
    try:
        assert feed.poll() == [] and feed.cursor == 2  # the root's own two corrections: history too
        service.switch(run.id)
        copies = [c.id for c in root.corrections(after_id=2)]
        assert len(copies) == 5
        assert feed.poll() == []
        assert service.definitions.switched_corrections(0) == [(3, max(copies))]
        # A correction after the switch is news: pushed.
        root.commit_batch(late("main", 3, {"endpoint": "/a", "region": "eu"}, {0: 7}, new), **commit)
        (pushed,) = feed.poll()
        assert pushed["id"] > max(copies) and pushed["dims"] == {"endpoint": "/a", "region": "eu"}
        # A REST tailer by after_id still reads the copies (they are the root's corrections now).
        assert [c.id for c in root.corrections(after_id=2)] == [*copies, pushed["id"]]
    finally:
        for r in service.runs():
            service.outputs.storage.drop(r.id)
        log.close()
        root.close()


def test_an_output_that_cannot_be_dropped_does_not_keep_the_others(settings, monkeypatch, caplog):
    """reprocess_drop_after's sweep stopped at the first output whose drop raised (a run id whose
    schema PostgreSQL refused): every other unused output stayed, round after round. It is logged
    and left for the next round; the others go."""
    both = {"http": {"key_field": "user", "dimensions": ["endpoint"]}, "orders": {"key_field": "user"}}
    old = Catalog(streams=both)
    new = Catalog(streams={s: {**d, "dimensions": ["region"]} for s, d in both.items()})
    root = open_store(settings)
    pin_definitions(root, old, "main")
    for i, stream in enumerate(both):
        root.commit_batch(batch("main", i, {(): 5}, {0: 5}, old, stream=stream),
                          lateness_ms={"http": 0, "orders": 0}, now_ms=NOW)
    log = open_log(settings, new)
    service = build_reprocess_service(settings, new, root, log)
    runs = [service.start(stream) for stream in both]
    for run in runs:
        open_store(settings, run.id).close()
        service.definitions.set_state(run.id, "failed", 1, error="x")  # long ago
    storage, drop = service.outputs.storage, service.outputs.storage.drop
    stuck = runs[0].id

    def failing_drop(namespace):
        if namespace == stuck:
            raise RuntimeError("cannot drop it")
        drop(namespace)
    monkeypatch.setattr(storage, "drop", failing_drop)
    try:
        with caplog.at_level("ERROR", logger="sketchboard.reprocess"):
            assert service.drop_unused(0) == [runs[1].id]
        assert f"the output {stuck!r} could not be dropped" in caplog.text
        assert [r.id for r in service.runs()] == [stuck] and not storage.exists(runs[1].id)
        monkeypatch.setattr(storage, "drop", drop)
        assert service.drop_unused(0) == [stuck]  # the next round
    finally:
        for r in service.runs():
            drop(r.id)
        log.close()
        root.close()


def test_switching_to_a_run_again_leaves_a_copy_of_the_served_version_that_can_be_dropped(settings):
    """Switch to a run, back to the previous output, to the run again: two outputs of the served
    version are kept (previous-http-<new> and the run's), and both drops were refused as "the
    served one", by hand and by reprocess_drop_after alike, so a whole stale copy stayed forever.
    Either may go now, not both."""
    old, new, commit, root, log, service, run, output = _run_with_an_output(settings)
    output.close()
    service.definitions.set_state(run.id, "caught_up", NOW)
    old_version, new_version = (definition_version(c.streams["http"]) for c in (old, new))
    try:
        previous = service.switch(run.id)["previous"]
        copy = service.switch(previous)["previous"]  # back: the new version's output kept as a copy
        assert service.switch(run.id)["previous"] == previous  # and to the run again
        assert copy == run_id("http", new_version, "previous-") and service.serving_version("http") == new_version
        assert sorted(r.id for r in service.runs() if r.version == new_version) == sorted([run.id, copy])

        # One of the two copies goes (with the old version's output: unused), the other stays.
        dropped = service.drop_unused(0)
        copies_kept = {run.id, copy} - set(dropped)
        assert len(copies_kept) == 1 and len(dropped) == 2 and previous in dropped
        (kept,) = copies_kept
        with pytest.raises(SwitchRefused, match="is the served one"):
            service.drop(kept)
        assert [r.id for r in service.runs()] == [kept]
        assert counts(root) == {dims_key({"endpoint": "/a", "region": "eu"}): 5}  # the served output is the root's
    finally:
        for r in service.runs():
            service.outputs.storage.drop(r.id)
        log.close()
        root.close()
