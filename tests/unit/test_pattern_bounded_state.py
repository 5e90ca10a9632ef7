"""A long run of the patterns through the pipeline's driver side (aggregates/patterns.py) and a
real SQLite store, no Spark: four hours of event time, a batch a minute, logins of users that come
and go (the key space keeps growing) and checkouts each with a key of its own. After every batch
the state the store holds (keys, partial matches, pattern_history rows) stays within what the
pattern's `within`, its absence window and the history's horizon allow behind its watermark:
it follows the traffic of the last stretch of time, not the number of batches nor of keys seen."""

from __future__ import annotations

import random

import pyarrow as pa

from aggregates.pattern_batch import history_span_ms
from aggregates.patterns import PatternRunner, with_patterns
from catalog import parse_catalog
from patterns.plan import compile_pattern
from store import BatchCommit, SqlitePaneStore
from tests.support.patterns import EXAMPLES_YAML

T0 = 1_794_999_600_000
SEC, MIN = 1_000, 60_000
BATCHES = 240  # four hours of event time, a batch a minute
CATALOG = parse_catalog(EXAMPLES_YAML)
PATTERNS = ("credential_stuffing", "abandoned_checkout")


def table(rows) -> pa.Table:
    names = ["stream", "partition", "offset", "event_time", "dims", "vals", "ids"]
    return pa.table({n: pa.array([r[i] for r in rows], type=pa.list_(pa.float64()) if n == "vals" else None)
                     for i, n in enumerate(names)})


def minute_of_traffic(rng: random.Random, minute: int, offset: int, pending: list) -> list[tuple]:
    """The records that arrive in one minute: about 15 logins of the 30 users active in this
    20-minute generation (one in eight fails, now and then a burst of failures), 3 checkouts
    started (each its own key) and the completions due; in any order within the minute."""
    start = T0 + minute * MIN
    rows = []
    generation = minute // 20
    for _ in range(15):
        user = f"u{generation}-{rng.randrange(30)}"
        burst = rng.random() < 0.05
        for _ in range(6 if burst else 1):
            outcome = "failure" if burst or rng.random() < 0.125 else "success"
            rows.append(("logins", 0, 0, start + rng.randrange(MIN), [outcome, "10.0.0.1"], [], [user]))
        if burst:
            rows.append(("logins", 0, 0, start + MIN - 1, ["success", "10.0.0.1"], [], [user]))
    for n in range(3):
        session, t = f"s{minute}-{n}", start + rng.randrange(MIN)
        rows.append(("checkouts", 1, 0, t, ["started"], [float(rng.randint(1, 900))], [session]))
        if rng.random() < 0.7:
            pending.append((t + rng.randint(1 * MIN, 40 * MIN), session))
    for due, session in [p for p in pending if p[0] < start + MIN]:
        pending.remove((due, session))
        rows.append(("checkouts", 1, 0, due, ["completed"], [None], [session]))
    rng.shuffle(rows)
    return [(s, p, offset + i, t, d, v, ids) for i, (s, p, _, t, d, v, ids) in enumerate(rows)]


def test_keys_partial_matches_and_history_stay_bounded_by_within_and_the_horizon_over_a_long_run(tmp_path):
    store = SqlitePaneStore(tmp_path / "store.db")
    runner = PatternRunner(CATALOG, store)
    lateness = {n: s.allowed_lateness for n, s in CATALOG.streams.items()}
    plans = {p.name: compile_pattern(p, CATALOG) for p in CATALOG.patterns if p.name in PATTERNS}
    stream_of = {p.name: p.streams[0] for p in CATALOG.patterns}
    rng = random.Random(5)
    pending: list = []
    seen: list[tuple] = []  # (stream, time, key) of every record sent
    sizes_over_time = []
    offset = 0
    for batch_id in range(BATCHES):
        rows = minute_of_traffic(rng, batch_id, offset, pending)
        offset += len(rows)
        seen += [(r[0], r[3], r[6][0]) for r in rows]
        newest: dict[str, int] = {}
        for r in rows:
            newest[r[0]] = max(newest.get(r[0], r[3]), r[3])
        done = runner.run(table(rows), store.watermarks())
        commit = with_patterns(BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0,
                                           max_event_ms=newest), done, runner.names)
        assert store.commit_batch(commit, lateness_ms=lateness, now_ms=T0 + batch_id * MIN).committed
        sizes = store.pattern_sizes()
        sizes_over_time.append(sizes)
        for name, plan in plans.items():
            s = sizes[name]
            if s.watermark_ms is None:
                continue
            mine = [(t, key) for stream, t, key in seen if stream == stream_of[name]]
            # What the pattern may still hold behind its watermark: partial matches younger than
            # `within`, absences not yet due; the history: the kept span behind the watermark.
            reach = s.watermark_ms - (plan.within or 0) - (plan.absence_within or 0)
            recent = [(t, key) for t, key in mine if t > reach]
            assert s.keys_held <= len({key for _, key in recent}), (batch_id, name)
            assert s.partial_matches <= len(recent), (batch_id, name)
            assert s.history_rows <= sum(1 for t, _ in mine if t >= s.watermark_ms - history_span_ms(plan))

    # Not growing with the batches: the last hour holds no more than the hour before it (same traffic),
    # while the keys seen and the events sent kept growing.
    for name in PATTERNS:
        keys = {key for stream, _, key in seen if stream == stream_of[name]}
        events = sum(1 for stream, _, _ in seen if stream == stream_of[name])
        for kind in ("keys_held", "partial_matches", "history_rows"):
            third, fourth = ([getattr(s[name], kind) for s in sizes_over_time[h * 60:(h + 1) * 60]] for h in (2, 3))
            assert max(fourth) <= 1.2 * max(third), (name, kind, max(third), max(fourth))
        last = sizes_over_time[-1][name]
        assert last.keys_held < len(keys) / 4 and last.history_rows < events / 2, (name, last, len(keys), events)
        assert last.matches > 0  # the run matched all along
    store.close()
