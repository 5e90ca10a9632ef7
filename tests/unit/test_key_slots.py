"""The per-key job's driver side (aggregates/key_rows.py, `KeyRows`): from the slots Spark gives
(one row per group, key and slot with min/max/count of the event time), the first-seen rows,
the membership rows and the sessions' runs are exactly those of every event taken one by one
(Hypothesis: any times, negative ones too, gaps that do or do not divide the bucket, features
present or not)."""

from __future__ import annotations

import zlib
from collections import defaultdict

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.key_rows import (SLOT_SCHEMA, TAG_FIRST_SEEN, TAG_MEMBERSHIP, TAG_SESSIONS, KeyItem, KeyRows,
                                 key_groups)
from tests.unit.test_session_window import sessionize

KEY = "a Column (the driver side never reads it)"


def fake_hash(seed: int, key: str, salt: int) -> int:
    """Stands in for Spark's xxhash64: any function of (seed, key) does for the driver side."""
    return zlib.crc32(f"{seed}:{salt}:{key}".encode()) - 2**31


def slots_of(groups, events: dict[str, list[tuple[str, int]]]) -> pa.Table:
    """What the Spark job computes: per (group, key, slot) min/max/count, the hashes per seed."""
    acc: dict[tuple[int, str, int], list[int]] = defaultdict(list)
    for g in groups:
        for key, t in events[g.stream]:
            if key:
                acc[(g.id, key, t - t % g.slot_ms if g.slot_ms else 0)].append(t)
    by_id = {g.id: g for g in groups}
    rows = []
    for (gid, key, slot), times in acc.items():
        g = by_id[gid]
        fs, mb = g.first_seen, g.membership
        rows.append({"group": gid, "key": key, "slot": slot, "first_ms": min(times), "last_ms": max(times),
                     "events": len(times),
                     "h1": fs and fake_hash(fs.seed, key, 1), "h2": fs and fake_hash(fs.seed, key, 2),
                     "mh1": mb and fake_hash(mb.seed, key, 1), "mh2": mb and fake_hash(mb.seed, key, 2)})
    return pa.Table.from_pylist(rows, schema=SLOT_SCHEMA)


def bloom_tuples(t: pa.Table) -> list[tuple]:
    return sorted(zip(*(t[c].to_pylist() for c in ("stream", "tag", "bucket", "first_ms", "h1", "h2")), strict=True))


def run_tuples(t: pa.Table) -> list[tuple]:
    return sorted(zip(*(t[c].to_pylist() for c in ("stream", "key", "first_ms", "last_ms", "events")), strict=True))


stream_events = st.lists(st.tuples(st.sampled_from(["x", "y", "z", ""]), st.integers(-60, 60)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(web=stream_events, app=stream_events, gap=st.integers(1, 9), bucket=st.sampled_from([6, 10, 12, 30]),
       roles=st.sets(st.sampled_from(["first_seen", "membership", "sessions"]), min_size=1))
def test_slots_give_the_rows_and_runs_of_every_event(web, app, gap, bucket, roles):
    """`web` has the drawn features on one field (one group); `app` sessions only on its own."""
    items = []
    if "first_seen" in roles:
        items.append(KeyItem("web", TAG_FIRST_SEEN, "user", KEY, seed=1))
    if "membership" in roles:
        items.append(KeyItem("web", TAG_MEMBERSHIP, "user", KEY, "bucket column", seed=2, bucket_ms=bucket))
    if "sessions" in roles:
        items.append(KeyItem("web", TAG_SESSIONS, "user", KEY, times=True, gap=gap))
    items.append(KeyItem("app", TAG_SESSIONS, "device", KEY, times=True, gap=3))
    groups = key_groups(items)
    rows = KeyRows(slots_of(groups, {"web": web, "app": app}), groups)

    web_keyed = [(k, t) for k, t in web if k]
    want_bloom = []
    if "first_seen" in roles:
        first: dict[str, int] = {}
        for k, t in web_keyed:
            first[k] = min(t, first.get(k, t))
        want_bloom += [("web", TAG_FIRST_SEEN, 0, t, fake_hash(1, k, 1), fake_hash(1, k, 2)) for k, t in first.items()]
    if "membership" in roles:
        earliest: dict[tuple[str, int], int] = {}
        for k, t in web_keyed:
            b = t - t % bucket
            earliest[(k, b)] = min(t, earliest.get((k, b), t))
        want_bloom += [("web", TAG_MEMBERSHIP, b, t, fake_hash(2, k, 1), fake_hash(2, k, 2))
                       for (k, b), t in earliest.items()]
    assert bloom_tuples(rows.bloom_rows()) == sorted(want_bloom)

    want_runs = [("app", s.key, s.first_ms, s.last_ms, s.events) for s in sessionize([(k, t) for k, t in app if k], 3)]
    if "sessions" in roles:
        want_runs += [("web", s.key, s.first_ms, s.last_ms, s.events) for s in sessionize(web_keyed, gap)]
    assert run_tuples(rows.runs()) == sorted(want_runs)


def test_the_slot_divides_the_gap_and_the_bucket():
    """No run is cut inside a slot (its width is at most the gap) and a slot lies in one bucket."""
    items = [KeyItem("web", TAG_MEMBERSHIP, "user", KEY, seed=2, bucket_ms=3_600_000),
             KeyItem("web", TAG_SESSIONS, "user", KEY, times=True, gap=7 * 60_000),
             KeyItem("web", TAG_FIRST_SEEN, "user", KEY, seed=1),
             KeyItem("web", TAG_SESSIONS, "device", KEY, times=True, gap=300_000),
             KeyItem("app", TAG_FIRST_SEEN, "device", KEY, seed=3)]
    assert [(g.stream, g.field, g.slot_ms) for g in key_groups(items)] == [
        ("web", "user", 60_000), ("web", "device", 300_000), ("app", "device", 0)]
    with pytest.raises(ValueError, match="two sessions items"):
        key_groups([items[1], items[1]])


def test_no_slots_give_empty_rows_and_runs():
    rows = KeyRows(SLOT_SCHEMA.empty_table(), key_groups([KeyItem("web", TAG_SESSIONS, "user", KEY, gap=5),
                                                          KeyItem("web", TAG_FIRST_SEEN, "user", KEY, seed=1)]))
    assert rows.bloom_rows().num_rows == 0 and rows.runs().num_rows == 0
    assert rows.runs().column_names == ["stream", "key", "first_ms", "last_ms", "events"]
