"""Patterns with real Spark (aggregates/patterns.py): a failures-then-success pattern and an
absence pattern over two streams, events of many keys arriving out of order in several phases,
stragglers behind the watermark, a restart between phases and a crash inside a store commit.
The stored matches, less those retracted, equal the brute-force definition (tests/support/patterns.py)
over the events that were not late and the late ones replayed with their key's history (those
after an event of their key that was not late); every late event is recorded; the matches
count as metrics, retractions taken out."""

from __future__ import annotations

import numpy as np
import pytest

from aggregates.pipeline import Pipeline
from catalog import parse_catalog
from patterns.events import PatternEvent
from patterns.plan import compile_pattern
from store import patterns as store_patterns
from tests.log_backends import ON_THE_EMBEDDED_STACK
from tests.spark.events import T0
from tests.spark.test_pipeline import Service
from tests.support.patterns import brute_force

pytestmark = [pytest.mark.spark, ON_THE_EMBEDDED_STACK]  # the pattern store on PostgreSQL: tests/unit/test_pattern_store.py

MIN = 60_000
SPAN = 30 * MIN
CONFIG = """
streams:
  logins: {key_field: user_id, dimensions: [outcome, ip], partitions: 2, allowed_lateness: 30s, max_future_skew: 2h}
  checkouts: {key_field: session_id, dimensions: [stage], values: [amount], partitions: 2, allowed_lateness: 30s,
              max_future_skew: 2h}
patterns:
  - name: stuffing
    key: user_id
    within: 5m
    steps:
      - {name: failures, stream: logins, where: {outcome: failure}, times: 3}
      - {name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}}
    measures:
      attempts: {count: failures}
  - name: abandoned
    key: session_id
    steps:
      - {name: started, stream: checkouts, where: {stage: started}}
    not_followed_by: {name: completed, stream: checkouts, where: {stage: completed}, within: 3m}
"""


def make_events(seed: int) -> list[tuple[str, dict, int]]:
    """(stream, event, phase): times distinct across both streams (so the matching order is the
    time alone), bursts of failures per user, checkouts that complete or not; each event posted in
    the quarter of its time, one in seven two quarters later: behind the pattern's watermark, which
is the streams' watermark stored before a batch (so one batch behind them)."""
    rng = np.random.default_rng(seed)
    used: set[int] = set()

    def unique(t: int) -> int:
        while t in used:
            t += 1
        used.add(t)
        return t

    out = []
    for u in range(16):  # bursts of logins: most inside the 5 minutes a match may span
        start = T0 + int(rng.integers(0, SPAN - 6 * MIN))
        for _ in range(int(rng.integers(4, 10))):
            out.append(("logins", {"time": unique(start + int(rng.integers(0, 6 * MIN))), "user_id": f"u{u}",
                                   "outcome": str(rng.choice(["failure", "success"], p=[0.7, 0.3])),
                                   "ip": str(rng.choice(["10.0.0.1", "10.0.0.2"], p=[0.8, 0.2]))}))
    for s in range(16):  # checkouts over a few minutes: some complete in time, some late, some never
        start = T0 + int(rng.integers(0, SPAN - 6 * MIN))
        for _ in range(int(rng.integers(1, 5))):
            out.append(("checkouts", {"time": unique(start + int(rng.integers(0, 6 * MIN))), "session_id": f"s{s}",
                                      "stage": str(rng.choice(["started", "completed"], p=[0.6, 0.4])),
                                      "amount": float(rng.integers(1, 100))}))
    phased = []
    for stream, event in out:
        phase = 1 + (event["time"] - T0) * 4 // SPAN
        phased.append((stream, event, min(4, phase + 2 * int(rng.random() < 0.15))))
    order = rng.permutation(len(phased))  # arrival order within a phase: shuffled
    return [phased[i] for i in order]


def oracle(catalog, name: str, events: list[tuple[str, dict]], horizon: int) -> list:
    pattern = next(p for p in catalog.patterns if p.name == name)
    plan = compile_pattern(pattern, catalog)
    mine = sorted((PatternEvent(stream, 0, i, e["time"], e[pattern.key], e) for i, (stream, e) in enumerate(events)
                   if stream in pattern.streams and e["time"] <= horizon), key=lambda e: e.order)
    out = []
    for key in sorted({e.key for e in mine}):
        found = brute_force(plan, [e for e in mine if e.key == key], horizon)
        out += [(decided, key, tuple((step, stream, t) for step, stream, _, _, t in matched))
                for decided, matched in found]
    return sorted(out)


def stored(store, name: str) -> list:
    """The stored matches, less those retracted (each retraction withdraws the match it names)."""
    rows = store.pattern_matches(name, limit=10_000)
    withdrawn = {m.retracts for m in rows if m.retracts is not None}
    assert len(withdrawn) == sum(m.retracts is not None for m in rows)  # none withdrawn twice
    return sorted((m.decided_at_ms, m.key, tuple((e["step"], e["stream"], e["time"]) for e in m.events))
                  for m in rows if m.retracts is None and m.id not in withdrawn)


def test_stored_matches_equal_the_definition_with_out_of_order_arrival_stragglers_and_a_restart(
        tmp_path, spark, log_backend, store_backend, monkeypatch):
    catalog = parse_catalog(CONFIG)
    service = Service(log_backend.new(tmp_path), catalog, spark, store_backend)
    events = make_events(3)

    def drain() -> None:  # a new pipeline each time: a restart on the same store and log
        config = service.test_log.pipeline_config(max_records_per_batch=100_000, max_records_per_task=20_000)
        Pipeline(spark, catalog, store_backend.reopen(service.store), config, log=service.test_log.open(catalog),
                 clock=lambda: (T0 + 600_000) / 1000).run_until_drained()

    for phase in (1, 2, 3, 4, 5):
        if phase >= 4:
            # Events an hour on move both streams' watermarks past everything; the pattern's
            # watermark is the one stored before a batch, so the next batch releases the rest.
            for stream, key, field in (("logins", "user_id", "outcome"), ("checkouts", "session_id", "stage")):
                service.post(stream, [{"time": T0 + (56 + phase) * MIN, key: "flush", field: "x", "ip": "x"}
                                      if stream == "logins" else
                                      {"time": T0 + (56 + phase) * MIN + 1, key: "flush", field: "x"}])
        for stream in ("logins", "checkouts"):
            if phased := [e for s, e, p in events if s == stream and p == phase]:
                service.post(stream, phased)
        if phase == 3:
            # The pipeline dies inside its store commit, after the patterns' rows were written:
            # nothing of the batch stays, and the batch Spark replays at the next start runs afresh.
            real_apply = store_patterns.apply

            def crash(*args, **kwargs):
                real_apply(*args, **kwargs)
                raise RuntimeError("killed in the middle of the store commit")

            monkeypatch.setattr(store_patterns, "apply", crash)
            with pytest.raises(Exception, match="killed in the middle"):
                drain()
            monkeypatch.setattr(store_patterns, "apply", real_apply)
        drain()
    sizes = service.store.pattern_sizes()
    late = {(stream, t) for name in ("stuffing", "abandoned")
            for stream, _, _, t, watermark, _ in service.store.pattern_late(name, limit=10_000)}
    assert late and all(t <= w for name in ("stuffing", "abandoned")
                        for _, _, _, t, w, _ in service.store.pattern_late(name, limit=10_000))
    assert sum(s.late_events for s in sizes.values()) == len(late)  # each late event once, for its pattern
    assert all(s.late_events > 0 for s in sizes.values())
    on_time = [(s, e) for s, e, _ in events if (s, e["time"]) not in late]
    # A late event is replayed with its key's history when an event of its key came before it in
    # time and in time (fed before the late one arrived); the others are only recorded.
    keys = {"logins": "user_id", "checkouts": "session_id"}
    first = {}
    for s, e in on_time:
        first[s, e[keys[s]]] = min(first.get((s, e[keys[s]]), e["time"]), e["time"])
    corrected = [(s, e) for s, e, _ in events
                 if (s, e["time"]) in late and first.get((s, e[keys[s]]), e["time"]) < e["time"]]
    assert corrected and len(corrected) < len(late)  # the seed has both kinds
    for name in ("stuffing", "abandoned"):
        horizon = sizes[name].watermark_ms
        assert horizon >= T0 + 60 * MIN - 30_000
        want = oracle(catalog, name, on_time + corrected, horizon)
        assert want and stored(service.store, name) == want
        assert sizes[name].matches == len(want)
        # Matches as metrics: the count per window sums to the matches, through the one query path.
        answer = service.query(metric=f"{name}_matches", stat="count", **{"from": T0, "to": T0 + 70 * MIN}, step="10m")
        assert sum(p["value"] or 0 for s in answer["series"] for p in s["points"]) == len(want)
    # Nothing is held: the watermark passed every event a step might take, and the flush events
    # (which no step takes) were never buffered.
    assert {name: (s.keys_held, s.buffered_events) for name, s in sizes.items()} == {"stuffing": (0, 0),
                                                                                      "abandoned": (0, 0)}
    attempts = service.query(metric="stuffing_matches_attempts", stat="sum", **{"from": T0, "to": T0 + 70 * MIN},
                             step="70m")
    assert sum(p["value"] or 0 for s in attempts["series"] for p in s["points"]) == 3 * sizes["stuffing"].matches
    service.log.close()
