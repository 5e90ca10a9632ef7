"""First-seen keys and membership filters with real Spark: positions agree with Python, counts
match an exact computation within the reported bound, a replayed batch adds nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fastapi.testclient import TestClient
from pyspark.sql import functions as F

from aggregates.firstseen import BloomFeatures, hash_columns
from aggregates.pipeline import Pipeline, PipelineConfig
from api.app import create_app
from api.context import ApiContext
from catalog import parse_catalog
from ingest.log import SqliteEventLog
from sketches.bloom import CHUNK_BITS, BloomFilter, positions, undercount_bound
from store import SqlitePaneStore
from store.bloom import FIRST_SEEN, MEMBERSHIP, BloomCommit, BloomStore, FilterUpdate, FirstSeenPartial
from tests.spark.events import T0

pytestmark = pytest.mark.spark

CONFIG = """
streams:
  visits:
    key_field: user_id
    dimensions: [page]
    values: [ms]
    distinct: [user_id]
    pane: 10s
    allowed_lateness: 1m
    partitions: 2
    # Deliberately small: the filter overfills, so false positives happen and the bound matters.
    first_seen: {field: user_id, capacity: 3000, fpp: 0.05, seed: 11}
    membership: {field: user_id, bucket: 1m, capacity: 5000, fpp: 0.01, seed: 5}
metrics:
  new_visitors: {stream: visits, first_seen: true}
"""


class Service:
    def __init__(self, root: Path, spark):
        self.root, self.spark = root, spark
        self.catalog = parse_catalog(CONFIG)
        self.log = SqliteEventLog(root / "log.db")
        for stream in self.catalog.streams.values():
            self.log.ensure_topic(stream)
        self.store = SqlitePaneStore(root / "store.db")
        self.ctx = ApiContext(catalog=self.catalog, log=self.log, store=self.store,
                              clock=lambda: (T0 + 3_600_000) / 1000)
        self.client = TestClient(create_app(self.ctx))

    def post(self, events: list[dict]) -> None:
        for i in range(0, len(events), 5000):
            answer = self.client.post("/api/v1/events?stream=visits", content=json.dumps(events[i:i + 5000]),
                                          headers={"content-type": "application/json"})
            assert answer.status_code == 200 and answer.json()["rejected"] == [], answer.text

    def pipeline(self) -> Pipeline:
        config = PipelineConfig(name="main", log_path=self.root / "log.db",
                                checkpoint_dir=self.root / "checkpoints" / "main", max_records_per_task=20_000)
        return Pipeline(self.spark, self.catalog, SqlitePaneStore(self.root / "store.db"), config)


def visit_events(n: int, seed: int, start_ms: int, span_ms: int, users: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    times = start_ms + rng.integers(0, span_ms, n)
    user = rng.integers(0, users, n)
    return [{"time": int(t), "page": "/", "ms": 1.0, "user_id": f"user-{u}"} for t, u in zip(times, user, strict=True)]


def test_spark_positions_equal_python_positions(spark):
    keys = ["", "a", "user-1", "é€😀", "a much longer key, longer than one XXH64 stripe of 32 bytes"] + \
        [f"k{i}" for i in range(200)]
    for m, k, seed in ((9592, 7, 0), (1 << 20, 3, -5), (64, 1, 2**63 - 1)):
        df = spark.createDataFrame([(key,) for key in keys], "key string")
        got = df.select(*hash_columns(F.lit(seed))).toArrow()
        pos = positions(got.column("h1").to_numpy(), got.column("h2").to_numpy(), m, k)
        assert pos.tolist() == BloomFilter(m, k, seed).positions(keys).tolist()


def test_first_seen_counts_are_exact_minus_at_most_the_bound_and_a_replay_adds_nothing(tmp_path, spark):
    service = Service(tmp_path, spark)
    # Three batches (one per pipeline run), each a few minutes of traffic with returning users.
    chunks = [visit_events(6000, seed=i, start_ms=T0 + i * 120_000, span_ms=180_000, users=6000) for i in range(3)]
    seen: set[str] = set()
    exact: dict[int, int] = {}
    for chunk in chunks:
        service.post(chunk)
        service.pipeline().run_until_drained()
        df = pd.DataFrame(chunk)
        first = df.groupby("user_id")["time"].min()
        new = first[~first.index.isin(seen)]
        for pane, count in (new - new % 10_000).value_counts().items():
            exact[int(pane)] = exact.get(int(pane), 0) + int(count)
        seen.update(first.index)

    reader = BloomStore(tmp_path / "store.db")
    rows = {r.start_ms: r for r in reader.first_seen_rows("visits", 0, 2**62)}
    assert set(rows) == set(exact)
    total_bound = 0
    for pane, want in exact.items():
        row = rows[pane]
        assert row.new_keys <= want, pane  # a false positive can only make a new key look old
        assert want - row.new_keys <= row.bound, (pane, want, row)
        total_bound += row.bound
    undercount = sum(exact.values()) - sum(r.new_keys for r in rows.values())
    assert undercount > 0, "the overfilled filter should have produced some false positives"
    assert sum(r.expected_fp for r in rows.values()) > 0

    # The stored filter holds every key (no false negatives) and answers like one built in Python.
    stored = reader.first_seen_filter("visits")
    built = BloomFilter(stored.m, stored.k, stored.seed)
    built.add_many(sorted(seen))
    assert stored == built

    # Through the API: stat first_seen, each point with its bound.
    answer = service.client.get("/api/v1/query", params={
        "metric": "new_visitors", "stat": "first_seen", "from": T0, "to": T0 + 600_000, "step": "1m"}).json()
    points = answer["series"][0]["points"]
    for p in points:
        want = sum(v for pane, v in exact.items() if p["t"] <= pane < p["t"] + 60_000)
        assert p["value"] <= want <= p["error"]["upper"]
        assert p["error"]["kind"] == "bloom" and p["error"]["lower"] == p["value"]
    assert sum(p["value"] for p in points) == sum(r.new_keys for r in rows.values())

    # Membership: every key seen answers "probably_yes" in its minute; a key never sent answers "no".
    df = pd.DataFrame([e for chunk in chunks for e in chunk])
    for user, t in df.groupby("user_id")["time"].min().head(50).items():
        got = service.client.get("/api/v1/membership", params={"stream": "visits", "key": user,
                                                                "from": t, "to": t + 1}).json()
        assert got["answer"] == "probably_yes", got
        assert 0 < got["false_positive_probability"] < 0.05 and got["buckets"] == 1
    got = service.client.get("/api/v1/membership", params={"stream": "visits", "key": "user-1",
                                                            "from": T0 - 7_200_000, "to": T0 - 3_600_000}).json()
    assert got == {**got, "answer": "no", "buckets": 0}
    nos = 0
    for i in range(200):
        got = service.client.get("/api/v1/membership", params={"stream": "visits", "key": f"stranger-{i}",
                                                                "from": T0, "to": T0 + 600_000}).json()
        nos += got["answer"] == "no"
    assert nos >= 190  # 10 one-minute buckets OR-ed: fpp well under 5 %

    # Replay the last batch, as Spark does after a crash between our commit and its own: nothing changes.
    before_rows = reader.first_seen_rows("visits", 0, 2**62)
    before_filter = reader.first_seen_filter("visits")
    last = service.store.last_batch_id("main")
    commit_log = tmp_path / "checkpoints" / "main" / "commits" / str(last)
    commit_log.unlink()
    commit_log.with_name(f".{last}.crc").unlink(missing_ok=True)
    pipeline = service.pipeline()
    pipeline.run_until_drained()
    assert pipeline.last_result is not None and pipeline.last_result.committed is False
    assert reader.first_seen_rows("visits", 0, 2**62) == before_rows
    assert reader.first_seen_filter("visits") == before_filter


def expected_bloom_commit(catalog, events: list[dict], prior: BloomFilter) -> BloomCommit:
    """What a batch of `events` (of the stream `visits`) must commit, computed in plain Python:
    distinct keys with their earliest time, positions from sketches.bloom, the first-seen test
    against `prior`, every touched chunk as a 4 KiB little-endian bitmap (Spark's layout)."""
    stream = catalog.streams["visits"]
    ms = stream.membership
    first: dict[str, int] = {}
    per_bucket: dict[int, set[str]] = {}
    for e in events:
        first[e["user_id"]] = min(first.get(e["user_id"], e["time"]), e["time"])
        per_bucket.setdefault(e["time"] - e["time"] % ms.bucket, set()).add(e["user_id"])

    def update(kind, bucket, shape, keys):
        m, k, seed = shape
        chunks: dict[int, bytearray] = {}
        for p in BloomFilter(m, k, seed).positions(sorted(keys)).ravel().tolist():
            chunk = chunks.setdefault(p // CHUNK_BITS, bytearray(CHUNK_BITS // 8))
            chunk[(p % CHUNK_BITS) // 8] |= 1 << (p % 8)
        return FilterUpdate("visits", kind, bucket, m, k, seed, {c: bytes(b) for c, b in sorted(chunks.items())})

    mshape = BloomFilter.for_capacity(ms.capacity, ms.fpp, ms.seed).shape
    updates = [update(FIRST_SEEN, 0, prior.shape, first)]
    updates += [update(MEMBERSHIP, b, mshape, keys) for b, keys in sorted(per_bucket.items())]
    panes: dict[int, list[int]] = {}
    for key, t in first.items():
        counts = panes.setdefault(t - t % stream.pane, [0, 0])
        counts[0] += 1
        counts[1] += key in prior
    fpp = prior.false_positive_probability()
    partials = [FirstSeenPartial("visits", s, s + stream.pane, n - p, n, p, n * fpp, undercount_bound(n, p, fpp))
                for s, (n, p) in sorted(panes.items())]
    return BloomCommit(filters=updates, first_seen=partials)


def test_bloom_commit_of_a_batch_equals_the_python_oracle(spark):
    """The batch's Bloom work (one Spark job, then numpy on the driver) gives exactly the chunks
    and first-seen counts a plain-Python computation gives, against a filter with keys in it."""
    from ingest.source_rows import SPARK_SCHEMA

    catalog = parse_catalog(CONFIG)
    events = visit_events(3000, seed=3, start_ms=T0, span_ms=300_000, users=2500)
    prior = BloomFilter.for_capacity(3000, 0.05, 11)
    prior.add_many([f"user-{u}" for u in range(0, 2500, 3)])  # a third of them seen before

    class Reader:
        def first_seen_filter(self, stream):
            return BloomFilter(prior.m, prior.k, prior.seed, prior.bits.copy())

    rows = [("visits", 0, i, e["time"], e["time"], ["/"], [1.0], [e["user_id"]], None, None, None, None)
            for i, e in enumerate(events)]
    batch = spark.createDataFrame(rows, SPARK_SCHEMA)
    got = BloomFeatures(spark, catalog, Reader()).process(batch)
    want = expected_bloom_commit(catalog, events, prior)
    assert [(u.kind, u.bucket_ms) for u in got.filters] == [(u.kind, u.bucket_ms) for u in want.filters]
    for g, w in zip(got.filters, want.filters, strict=True):
        assert (g.m, g.k, g.seed, sorted(g.chunks)) == (w.m, w.k, w.seed, sorted(w.chunks))
        assert all(g.chunks[c] == w.chunks[c] for c in w.chunks), g.kind
    assert list(got.first_seen) == want.first_seen
    assert 0 < sum(p.positives for p in got.first_seen) < sum(p.tested for p in got.first_seen)


SHARED_CONFIG = CONFIG.replace("""    membership: {field: user_id, bucket: 1m, capacity: 5000, fpp: 0.01, seed: 5}
""", """    membership: {field: user_id, bucket: 1m, capacity: 5000, fpp: 0.01, seed: 5}
    sessions: {key: user_id, gap: 20s}
  screens:
    key_field: device_id
    dimensions: [screen]
    distinct: [device_id]
    pane: 10s
    partitions: 1
    sessions: {key: device_id, gap: 5s}
""")


def test_one_job_gives_the_bloom_commit_and_the_sessions_runs(spark):
    """The pipeline's one per-key job (aggregates/key_rows.py): `visits` has first-seen,
    membership and sessions on user_id (sessions ride on the first-seen row), `screens` sessions
    on device_id only. The Bloom commit equals the plain-Python oracle and the runs a brute-force
    sessionization of each key's times; an empty key is in neither."""
    from aggregates.session_batch import SessionWindows, bloom_and_runs
    from ingest.source_rows import SPARK_SCHEMA
    from tests.unit.test_session_window import sessionize

    catalog = parse_catalog(SHARED_CONFIG)
    visits = visit_events(3000, seed=4, start_ms=T0, span_ms=600_000, users=400)
    screens = [{"time": e["time"], "device_id": e["user_id"].replace("user", "dev")}
               for e in visit_events(2000, seed=5, start_ms=T0, span_ms=300_000, users=300)]
    prior = BloomFilter.for_capacity(3000, 0.05, 11)
    prior.add_many([f"user-{u}" for u in range(0, 400, 3)])

    class Reader:
        def first_seen_filter(self, stream):
            return BloomFilter(prior.m, prior.k, prior.seed, prior.bits.copy())

    rows = [("visits", 0, i, e["time"], e["time"], ["/"], [1.0], [e["user_id"]], None, None, None, None)
            for i, e in enumerate(visits)]
    rows += [("screens", 0, i, e["time"], e["time"], ["home"], [], [e["device_id"]], None, None, None, None)
             for i, e in enumerate(screens)]
    rows += [("visits", 1, 0, T0, T0, ["/"], [1.0], [""], None, None, None, None)]
    batch = spark.createDataFrame(rows, SPARK_SCHEMA)
    bloom, runs = bloom_and_runs(batch, BloomFeatures(spark, catalog, Reader()), SessionWindows(catalog, None))
    want = expected_bloom_commit(catalog, visits, prior)
    assert [(u.kind, u.bucket_ms, u.m, u.k, u.seed, u.chunks) for u in bloom.filters] == \
        [(u.kind, u.bucket_ms, u.m, u.k, u.seed, u.chunks) for u in want.filters]
    assert list(bloom.first_seen) == want.first_seen
    got = sorted(zip(*(runs[c].to_pylist() for c in ("stream", "key", "first_ms", "last_ms", "events")), strict=True))
    def runs_of(stream, events, field, gap):
        keyed = [(e[field], e["time"]) for e in events]
        return [(stream, s.key, s.first_ms, s.last_ms, s.events) for s in sessionize(keyed, gap)]

    exact = sorted(runs_of("visits", visits, "user_id", 20_000) + runs_of("screens", screens, "device_id", 5_000))
    assert got == exact
    assert len(exact) > 400 + 300  # keys with several sessions: the cut matters


SLOTS_CONFIG = CONFIG.replace("""    membership: {field: user_id, bucket: 1m, capacity: 5000, fpp: 0.01, seed: 5}
""", """    membership: {field: user_id, bucket: 1m, capacity: 5000, fpp: 0.01, seed: 5}
    sessions: {key: page, gap: 7s}
  screens:
    key_field: device_id
    dimensions: [screen]
    distinct: [device_id]
    pane: 10s
    partitions: 1
    membership: {field: device_id, bucket: 1m, capacity: 5000, fpp: 0.01, seed: 9}
    sessions: {key: device_id, gap: 25s}
""")


def test_key_slots_with_two_keys_in_a_stream_and_a_gap_that_does_not_divide_the_bucket(spark):
    """The per-key job in its other shapes: `visits` reads two fields (Bloom features on user_id,
    sessions on page: two rows per event), `screens` sessions and membership on device_id with a
    25 s gap and 1 min buckets (5 s slots). Bloom commit and runs equal plain-Python oracles."""
    from aggregates.session_batch import SessionWindows, bloom_and_runs
    from ingest.source_rows import SPARK_SCHEMA
    from tests.unit.test_session_window import sessionize

    catalog = parse_catalog(SLOTS_CONFIG)
    rng = np.random.default_rng(8)
    visits = [dict(e, page=f"/p{rng.integers(0, 30)}")
              for e in visit_events(2000, seed=6, start_ms=T0 - 90_000, span_ms=400_000, users=300)]
    screens = [{"time": e["time"], "device_id": e["user_id"].replace("user", "dev")}
               for e in visit_events(1500, seed=7, start_ms=T0 - 90_000, span_ms=400_000, users=200)]
    prior = BloomFilter.for_capacity(3000, 0.05, 11)

    class Reader:
        def first_seen_filter(self, stream):
            return BloomFilter(prior.m, prior.k, prior.seed, prior.bits.copy())

    rows = [("visits", 0, i, e["time"], e["time"], [e["page"]], [1.0], [e["user_id"]], None, None, None, None)
            for i, e in enumerate(visits)]
    rows += [("screens", 0, i, e["time"], e["time"], ["home"], [], [e["device_id"]], None, None, None, None)
             for i, e in enumerate(screens)]
    batch = spark.createDataFrame(rows, SPARK_SCHEMA)
    bloom, runs = bloom_and_runs(batch, BloomFeatures(spark, catalog, Reader()), SessionWindows(catalog, None))
    want = expected_bloom_commit(catalog, visits, prior)
    ms = catalog.streams["screens"].membership
    shape = BloomFilter.for_capacity(ms.capacity, ms.fpp, ms.seed).shape
    buckets: dict[int, set[str]] = {}
    for e in screens:
        buckets.setdefault(e["time"] - e["time"] % ms.bucket, set()).add(e["device_id"])
    for b, keys in sorted(buckets.items()):
        f = BloomFilter(*shape)
        f.add_many(sorted(keys))
        chunks = {c: f.bits.tobytes()[c * CHUNK_BITS // 8:(c + 1) * CHUNK_BITS // 8].ljust(CHUNK_BITS // 8, b"\0")
                  for c in np.unique(f.positions(sorted(keys)).ravel() // CHUNK_BITS).tolist()}
        want.filters.append(FilterUpdate("screens", MEMBERSHIP, b, *shape, chunks))
    key = lambda u: (u.stream, u.kind, u.bucket_ms)  # noqa: E731
    assert sorted(((*key(u), u.m, u.k, u.seed, dict(u.chunks)) for u in bloom.filters), key=lambda x: x[:3]) == \
        sorted(((*key(u), u.m, u.k, u.seed, dict(u.chunks)) for u in want.filters), key=lambda x: x[:3])
    assert list(bloom.first_seen) == want.first_seen
    got = sorted(zip(*(runs[c].to_pylist() for c in ("stream", "key", "first_ms", "last_ms", "events")), strict=True))
    exact = sorted([("visits", s.key, s.first_ms, s.last_ms, s.events)
                    for s in sessionize([(e["page"], e["time"]) for e in visits], 7_000)]
                   + [("screens", s.key, s.first_ms, s.last_ms, s.events)
                      for s in sessionize([(e["device_id"], e["time"]) for e in screens], 25_000)])
    assert got == exact
    assert len(buckets) > 2 and len(exact) > 30 + 200


@pytest.mark.parametrize("config", [SHARED_CONFIG, SLOTS_CONFIG], ids=["shared key", "two keys, 5 s slots"])
def test_the_key_rows_of_a_batch_on_the_driver_equal_the_spark_jobs(spark, config):
    """A small batch's per-key rows are computed on the driver from its records (no Spark job,
    aggregates/key_rows.py `key_rows_on_driver`): the same rows as the job, hashes included
    (Spark's xxhash64 against the xxhash package), over keys that are non-ASCII, empty, missing
    (a null or short array) and event times before 1970."""
    from aggregates.key_rows import SLOT_SCHEMA, key_records, key_rows, key_rows_on_driver
    from aggregates.session_batch import SessionWindows
    from ingest.source_rows import SPARK_SCHEMA

    catalog = parse_catalog(config)
    rng = np.random.default_rng(3)
    keys = ["user-1", "usér-2", "ключ", "🙂", "a b", "", "x" * 300, "user-1 "]
    rows = []
    for i in range(1500):
        stream = "visits" if i % 3 else "screens"
        key = keys[int(rng.integers(0, len(keys)))]
        ids = None if i % 97 == 0 else [] if i % 89 == 0 else [key]
        t = int(T0 + rng.integers(-200_000, 200_000)) if i % 11 else int(rng.integers(-90_000, 90_000))
        rows.append((stream, 0, i, t, t, [f"/p{i % 7}"], [1.0], ids, None, None, None, None))
    batch = spark.createDataFrame(rows, SPARK_SCHEMA)

    class Reader:
        def first_seen_filter(self, stream):
            return None

    items = [*BloomFeatures(spark, catalog, Reader()).plan().items, *SessionWindows(catalog, None).items()]

    def sorted_rows(key_rows_):
        return sorted(key_rows_.slots.to_pylist(), key=lambda r: (r["group"], r["key"], r["slot"]))

    on_spark = sorted_rows(key_rows(batch, items))
    local = key_rows_on_driver(key_records(batch, items), items)
    assert local.slots.schema.equals(SLOT_SCHEMA)
    assert sorted_rows(local) == on_spark
    assert len(on_spark) > 100 and any(r["h1"] is not None for r in on_spark)
