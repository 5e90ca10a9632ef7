"""Late events for patterns, through the pipeline's driver side (aggregates/patterns.py) and the
real stores (SQLite and PostgreSQL), no Spark: logins and checkouts of several keys arrive out of
order, batch by batch, with the streams' watermarks the store keeps, and some arrive so late
that the pattern's watermark has passed them. Each late event after its key's first is replayed
with the key's kept history: the stored matches, less those retracted, plus those added, are
the brute-force definition's over every event; the `<pattern>_matches` panes count the same
(corrections +1 and -1); GET /api/v1/patterns/{name}/matches shows the late matches and the
retractions; a batch that crashed before its commit, or is replayed after it, changes nothing."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pyarrow as pa
from fastapi.testclient import TestClient

from aggregates.patterns import PatternRunner, with_patterns
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from catalog.patterns import matches_stream_name
from ingest.log import SqliteEventLog
from patterns.events import PatternEvent
from patterns.plan import compile_pattern
from store import BatchCommit
from tests.support.patterns import EXAMPLES_YAML, brute_force

T0 = 1_794_999_600_000
SEC, MIN = 1_000, 60_000
CATALOG = parse_catalog(EXAMPLES_YAML)
PATTERNS = ("credential_stuffing", "abandoned_checkout")


def traffic(seed: int) -> list[tuple[int, tuple]]:
    """(arrival time, record) for logins of ten users (two bursts of failures then a success,
    often from the address of the failures) and checkouts of twenty sessions (completed within 30
    minutes, later, or never), over about 45 minutes. One record in six arrives 3 to 25 minutes late,
    and one completion in time in two after its checkout's 30 minutes have passed;
    a key's first record never does (a late event before anything of its key was fed has no
    history to replay: only recorded, docs/patterns.md)."""
    rng = random.Random(seed)
    records: list[tuple[int, tuple]] = []
    offset = 0

    def add(t: int, record_of, first: bool, arrival: int | None = None):
        nonlocal offset
        delay = rng.randint(3 * MIN, 25 * MIN) if not first and rng.random() < 1 / 6 else rng.randint(0, 20 * SEC)
        records.append((t + delay if arrival is None else arrival, record_of(offset)))
        offset += 1

    for user in [f"u{n}" for n in range(10)]:  # two bursts each: few events per key (the definition is brute force)
        t, first = T0 + rng.randint(0, 20 * MIN), True
        for _ in range(2):
            ip = rng.choice(["10.0.0.1", "10.0.0.2"])
            for _ in range(rng.randint(3, 5)):
                add(t, lambda o, t=t, ip=ip: ("logins", o % 2, o, t, ["failure", ip], [], [user]), first)
                first, t = False, t + rng.randint(10 * SEC, 60 * SEC)
            success_ip = ip if rng.random() < 0.7 else "10.0.0.3"
            add(t, lambda o, t=t, ip=success_ip: ("logins", o % 2, o, t, ["success", ip], [], [user]), first)
            t += rng.randint(1 * MIN, 8 * MIN)
    for n in range(20):
        session, t = f"s{n}", T0 + rng.randint(0, 20 * MIN)
        add(t, lambda o, t=t: ("checkouts", o % 2, o, t, ["started"], [float(rng.randint(1, 900))], [session]), True)
        fate = rng.random()
        if fate < 0.7:
            done = t + (rng.randint(1 * MIN, 29 * MIN) if fate < 0.5 else rng.randint(31 * MIN, 40 * MIN))
            # A completion in time arrives after its checkout was declared abandoned one time in two.
            after = t + rng.randint(40 * MIN, 55 * MIN) if fate < 0.5 and rng.random() < 0.7 else None
            add(done, lambda o, t=done: ("checkouts", o % 2, o, t, ["completed"], [None], [session]), False, after)
    # Past everything: the watermarks pass every event above (these keys match nothing).
    add(T0 + 4 * 60 * MIN, lambda o: ("logins", 0, o, T0 + 4 * 60 * MIN, ["success", "x"], [], ["zz"]), True)
    add(T0 + 4 * 60 * MIN, lambda o: ("checkouts", 0, o, T0 + 4 * 60 * MIN, ["x"], [None], ["zz"]), True)
    return sorted(records)


def table(rows) -> pa.Table:
    names = ["stream", "partition", "offset", "event_time", "dims", "vals", "ids"]
    return pa.table({n: pa.array([r[i] for r in rows], type=pa.list_(pa.float64()) if n == "vals" else None)
                     for i, n in enumerate(names)})


def batch(store, runner: PatternRunner, batch_id: int, rows) -> BatchCommit:
    """The batch's commit as the pipeline makes it: the patterns over its records with the streams'
    watermarks stored before it; the streams' newest events move their watermarks."""
    newest: dict[str, int] = {}
    for r in rows:
        newest[r[0]] = max(newest.get(r[0], r[3]), r[3])
    done = runner.run(table(rows), store.watermarks())
    return with_patterns(BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0,
                                     max_event_ms=newest), done, runner.names)


def as_events(rows) -> dict[str, list[PatternEvent]]:
    """Every record as the matcher reads it, per pattern's stream."""
    out: dict[str, list[PatternEvent]] = defaultdict(list)
    for stream, partition, offset, t, dims, vals, ids in rows:
        if stream == "logins":
            fields = {"user_id": ids[0], "outcome": dims[0], "ip": dims[1]}
        else:
            fields = {"session_id": ids[0], "stage": dims[0], **({"amount": vals[0]} if vals[0] is not None else {})}
        out[stream].append(PatternEvent(stream, partition, offset, t, ids[0], fields))
    return out


def identity(m) -> tuple:
    return m["key"], m["decided_at_ms"], tuple(tuple(e[f] for f in ("step", "stream", "partition", "offset", "time"))
                                               for e in m["events"])


def test_late_events_are_corrected_to_the_definition_exactly_once_in_matches_panes_and_api(store_backend, tmp_path):
    store = store_backend.create()
    runner = PatternRunner(CATALOG, store)
    lateness = {n: s.allowed_lateness for n, s in CATALOG.streams.items()}
    arrivals = traffic(seed=7)
    batches: list[list[tuple]] = []
    batch_start = arrivals[0][0]
    for arrival, record in arrivals:  # a batch per 30 s of arrival, as the pipeline's trigger
        if not batches or arrival >= batch_start + 30 * SEC:
            batches.append([])
            batch_start = arrival
        batches[-1].append(record)
    batches += [[], []]  # the patterns' watermarks are a batch behind the streams'
    for batch_id, rows in enumerate(batches):
        batch(store, runner, batch_id, rows)  # computed, then a crash before its commit: nothing written
        assert store.commit_batch(batch(store, runner, batch_id, rows), lateness_ms=lateness, now_ms=T0).committed
        replayed = batch(store, runner, batch_id, rows)  # replayed after its commit: skipped by its id
        assert not store.commit_batch(replayed, lateness_ms=lateness, now_ms=T0).committed

    records = [r for _, r in arrivals]
    events = as_events(records)
    sizes = store.pattern_sizes()
    log = SqliteEventLog(tmp_path / "log.db")
    app = create_app(ApiContext(catalog=CATALOG, log=log, store=store, clock=lambda: (T0 + 300 * MIN) / 1000))
    with TestClient(app) as client:
        for name in PATTERNS:
            pattern = next(p for p in CATALOG.patterns if p.name == name)
            plan = compile_pattern(pattern, CATALOG)
            watermark = sizes[name].watermark_ms
            assert watermark >= T0 + 60 * MIN
            by_key: dict[str, list[PatternEvent]] = defaultdict(list)
            for e in sorted(events[pattern.streams[0]], key=lambda e: e.order):
                if e.time <= watermark:
                    by_key[e.key].append(e)
            want = Counter((key, decided, tuple(tuple(x) for x in matched))
                           for key, evs in by_key.items() for decided, matched in brute_force(plan, evs, watermark))
            page = client.get(f"/api/v1/patterns/{name}/matches", params={"limit": 1000}).json()["matches"]
            by_id = {m["id"]: m for m in page}
            net = Counter(identity(m) for m in page if m["retracts"] is None)
            net.subtract(identity(by_id[m["retracts"]]) for m in page if m["retracts"] is not None)
            assert +net == want and all(v >= 0 for v in net.values())  # every retraction withdraws a stored match
            late = [m for m in page if m["late"]]
            added = [m for m in late if m["retracts"] is None]
            retracted = [m for m in late if m["retracts"] is not None]
            # The seed's late records complete stuffing matches and break others (and abandoned checkouts).
            assert retracted and (added or name == "abandoned_checkout"), name
            assert all(m["late"] for m in page if m["retracts"] is not None)
            assert sizes[name].matches == sum(want.values()) and sizes[name].late_events > 0
            # The match count's panes: +1 per match (a late one a correction of a final pane), -1 per retraction.
            stream = matches_stream_name(name)
            panes = store.read_panes(stream, T0 - 60 * MIN, T0 + 300 * MIN)
            assert sum(p.data.count for p in panes) == sum(want.values())
            assert store.corrections(stream=stream, limit=1000)  # the late ones corrected final panes
            # Grouped by the match's dimensions (its first event's) and `late`: each retraction is taken
            # from its match's own pane, so no group goes below zero and each holds the net of its matches.
            dims_of = dict(zip(CATALOG.streams[stream].dimensions[:-1], ("outcome", "ip")))
            if name == "abandoned_checkout":
                dims_of = {"stage": "stage"}
            fields = {(e.stream, e.partition, e.offset): e.fields for evs in events.values() for e in evs}
            first_dims = Counter(tuple(sorted({d: fields[m[0][1:4]][f] for d, f in dims_of.items()}.items()))
                                 for (key, decided, m), n in want.items() for _ in range(n))
            groups: Counter = Counter()
            for m in page:
                target = m if m["retracts"] is None else by_id[m["retracts"]]
                assert m["dims"] == target["dims"] and set(m["dims"]) == set(dims_of)
                groups[tuple(sorted(target["dims"].items())), target["late"]] += -1 if m["retracts"] else 1
            in_panes: Counter = Counter()
            for p in panes:
                dims = p.key.dims_dict()
                own = tuple(sorted((d, v) for d, v in dims.items() if d != "late"))
                in_panes[own, dims["late"] == "true"] += p.data.count
            assert +in_panes == +groups and min(in_panes.values()) >= 0 and min(groups.values()) >= 0
            assert (any(late for _, late in +groups) or name == "abandoned_checkout") and any(
                not late for _, late in +groups)  # (no late event adds an abandoned checkout: it retracts)
            by_dims: Counter = Counter()
            for (own, _), n in groups.items():
                by_dims[own] += n
            assert +by_dims == first_dims  # the definition's matches by their first event's dimensions
            # The query path groups and filters by them.
            answer = client.get("/api/v1/query", params={"metric": stream, "stat": "count", "from": str(T0 - 60 * MIN),
                                                         "to": str(T0 + 300 * MIN), "step": "1h",
                                                         "group_by": "late"}).json()
            counted = {s["group"]["late"]: sum(p["value"] or 0 for p in s["points"]) for s in answer["series"]}
            assert counted == {str(late).lower(): sum(n for (_, l), n in groups.items() if l == late)
                               for late in (False, True) if any(l == late for _, l in +groups)}


def test_a_replaced_pattern_starts_no_lower_than_its_matches_streams_watermark(store_backend):
    """docs/patterns.md, "Matches as metrics": a `<pattern>_matches` stream's watermark is its
    pattern's, and a match decided in order is never behind it. A definition that starts from
    nothing (replaced, or deleted and created again) starts no lower than the watermark the
    earlier one moved its derived stream to, even when it reads a stream that lags: the events
    at or behind it are late for it (recorded), and its in-order matches correct no final pane."""
    from catalog.model import Catalog
    from tests.unit.test_pattern_matcher import STREAMS

    def catalog(stream: str) -> Catalog:
        return Catalog.model_validate({"streams": STREAMS, "patterns": [
            {"name": "p", "key": "k", "steps": [{"name": "a", "stream": stream, "where": {"kind": "a"}}]}]})

    def row(stream: str, offset: int, seconds: int) -> tuple:
        return (stream, 0, offset, T0 + seconds * SEC, ["a", "1.1.1.1"] if stream == "s" else ["a"],
                [None] if stream == "s" else [], ["x"])

    store = store_backend.create()
    batch_id = 0

    def run(cat: Catalog, rows, marks: dict) -> None:
        nonlocal batch_id
        runner = PatternRunner(cat, store)
        done = runner.run(table(rows), {s: T0 + m * SEC for s, m in marks.items()})
        commit = with_patterns(BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0),
                               done, runner.names)
        lateness = {n: s.allowed_lateness for n, s in cat.streams.items()}
        assert store.commit_batch(commit, lateness_ms=lateness, now_ms=T0).committed
        batch_id += 1

    run(catalog("s"), [row("s", 0, 90)], {"s": 100, "t": 50})  # on s: a match at 90 s, p_matches final to 100 s
    assert store.watermarks()["p_matches"] == T0 + 100 * SEC
    on_t = catalog("t")  # replaced: now on t, whose watermark is at 50 s
    run(on_t, [row("t", 1, 60)], {"s": 100, "t": 50})  # at 60 s: behind p_matches' 100 s, late for it
    run(on_t, [row("t", 2, 120)], {"s": 100, "t": 70})
    run(on_t, [], {"s": 100, "t": 130})  # t passes 120 s: decided in order there
    stored = store.pattern_matches("p", limit=10)
    assert [((m.decided_at_ms - T0) // SEC, m.late) for m in stored] == [(90, False), (120, False)]
    assert store.pattern_sizes()["p"].late_events == 1
    assert store.corrections(stream="p_matches") == []  # no final pane changed
    assert store.watermarks()["p_matches"] == T0 + 130 * SEC
