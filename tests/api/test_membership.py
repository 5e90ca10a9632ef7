"""GET /api/v1/membership and stat first_seen over a real store file (filters committed like the
pipeline commits them; no Spark): answers, OR over buckets, clear 4xx for bad input."""

from __future__ import annotations

import math
from dataclasses import replace

from sketches.bloom import BloomFilter, optimal_shape
from store import BatchCommit
from store.bloom import MEMBERSHIP, BloomCommit, FilterUpdate, FirstSeenPartial
from tests.api.conftest import NOW_MS

HOUR = 3_600_000
BASE = NOW_MS - NOW_MS % HOUR - 3 * HOUR  # three hours ago, on a bucket boundary


def membership_commit(catalog, batch_id: int, keys_per_bucket: dict[int, list[str]]) -> BatchCommit:
    decl = catalog.streams["http_requests"].membership
    m, k = optimal_shape(decl.capacity, decl.fpp)
    updates = []
    for bucket, keys in keys_per_bucket.items():
        bloom = BloomFilter(m, k, decl.seed)
        bloom.add_many(keys)
        chunks = {i: bloom.chunk(i) for i in range(bloom.chunks) if any(bloom.chunk(i))}
        updates.append(FilterUpdate("http_requests", MEMBERSHIP, bucket, m, k, decl.seed, chunks))
    first_seen = [FirstSeenPartial("http_requests", BASE, BASE + 10_000, 7, 10, 3, 0.25, 2)]
    return BatchCommit(pipeline="main", batch_id=batch_id, partials=[], events_read=0,
                       bloom=BloomCommit(filters=updates, first_seen=first_seen))


def ask(client, **params):
    return client.get("/api/v1/membership", params={"stream": "http_requests", **params})


def test_membership_answers_no_or_probably_yes_over_the_or_of_buckets(client, ctx, catalog):
    result = ctx.store.commit_batch(
        membership_commit(catalog, 0, {BASE: ["alice", "bob"], BASE + HOUR: ["carol"]}),
        lateness_ms={}, now_ms=NOW_MS)
    assert result.committed
    r = ask(client, key="alice", **{"from": BASE, "to": BASE + 2 * HOUR})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answer"] == "probably_yes" and body["buckets"] == 2 and body["bucket"] == "1h"
    assert 0 < body["false_positive_probability"] < 1e-6  # three keys in filters sized for 200 000
    assert ask(client, key="carol", **{"from": BASE, "to": BASE + 2 * HOUR}).json()["answer"] == "probably_yes"
    # carol was seen in the second hour only; the range is widened to whole buckets.
    assert ask(client, key="carol", **{"from": BASE + 60_000, "to": BASE + HOUR}).json()["answer"] == "no"
    nobody = ask(client, key="mallory", **{"from": BASE, "to": BASE + 2 * HOUR}).json()
    assert nobody["answer"] == "no"
    empty = ask(client, key="alice", **{"from": BASE - 5 * HOUR, "to": BASE}).json()
    assert empty["answer"] == "no" and empty["buckets"] == 0 and empty["false_positive_probability"] == 0
    # +0.0, not -0.0 (what -expm1(0) gives): a client printing the JSON number must not see "-0.0".
    assert math.copysign(1.0, empty["false_positive_probability"]) == 1.0


def test_a_replayed_batch_adds_nothing(client, ctx, catalog):
    commit = membership_commit(catalog, 5, {BASE: ["alice"]})
    assert ctx.store.commit_batch(commit, lateness_ms={}, now_ms=NOW_MS).committed
    before = ask(client, key="alice", **{"from": BASE, "to": BASE + HOUR}).json()
    replay = membership_commit(catalog, 5, {BASE: ["alice", "eve"]})  # same batch id, even with other bits
    assert not ctx.store.commit_batch(replay, lateness_ms={}, now_ms=NOW_MS).committed
    assert ask(client, key="eve", **{"from": BASE, "to": BASE + HOUR}).json()["answer"] == "no"
    assert ask(client, key="alice", **{"from": BASE, "to": BASE + HOUR}).json() == before
    points = client.get("/api/v1/query", params={"metric": "new_users", "stat": "first_seen", "from": BASE,
                                                  "to": BASE + 60_000, "step": "1m"}).json()["series"][0]["points"]
    assert points[0]["value"] == 7  # counted once
    assert points[0]["error"] == {"kind": "bloom", "lower": 7, "upper": 9, "relative_error": None,
                                  "rank_error": None, "expected_undercount": 0.25}


def test_past_retention_a_key_is_no_longer_a_member_nor_counted_first_seen(client, ctx, catalog):
    """The retention run of a later batch drops the buckets and first-seen counts it is past, as
    the pipeline commits it (retention and membership bucket from the catalog)."""
    stream = catalog.streams["http_requests"]
    old = BASE - 400 * 24 * HOUR
    commit = membership_commit(catalog, 0, {old: ["alice"]})
    commit = replace(commit, bloom=replace(commit.bloom, first_seen=[
        FirstSeenPartial("http_requests", old, old + stream.pane, 1, 1, 0, 0.0, 0)]))
    assert ctx.store.commit_batch(commit, lateness_ms={}, now_ms=old).committed
    seen = ask(client, key="alice", **{"from": old, "to": old + HOUR}).json()
    assert seen["answer"] == "probably_yes" and seen["buckets"] == 1
    assert ctx.store.commit_batch(BatchCommit(pipeline="main", batch_id=1, partials=[], events_read=0,
                                              batch_now_ms=NOW_MS), lateness_ms={}, now_ms=NOW_MS,
                                  retention_ms={stream.name: stream.retention},
                                  membership_bucket_ms={stream.name: stream.membership.bucket}).committed
    gone = ask(client, key="alice", **{"from": old, "to": old + HOUR}).json()
    assert gone["answer"] == "no" and gone["buckets"] == 0
    [point] = client.get("/api/v1/query", params={"metric": "new_users", "stat": "first_seen", "from": old,
                                                  "to": old + HOUR, "step": "1h"}).json()["series"][0]["points"]
    assert (point["value"], point["count"]) == (0, 0)


def test_bad_membership_requests_are_clear_4xx(client):
    assert ask(client, key="").status_code == 400
    assert "key" in str(client.get("/api/v1/membership", params={"stream": "http_requests"}).json())
    r = client.get("/api/v1/membership", params={"stream": "nope", "key": "a"})
    assert r.status_code == 404 and "unknown stream" in r.json()["detail"]
    r = client.get("/api/v1/membership", params={"stream": "orders", "key": "a"})
    assert r.status_code == 400 and "declares no membership" in r.json()["detail"]
    r = ask(client, key="a", **{"from": "yesterday"})
    assert r.status_code == 400
    r = ask(client, key="a", **{"from": "now", "to": "now-1h"})
    assert r.status_code == 400 and "after" in r.json()["detail"]
    r = ask(client, key="a", **{"from": "now-10000d"})
    assert r.status_code == 400 and "buckets" in r.json()["detail"]


def test_first_seen_needs_a_declaring_metric_and_no_dimensions(client):
    r = client.get("/api/v1/query", params={"metric": "requests", "stat": "first_seen"})
    assert r.status_code == 400 and "first_seen" in r.json()["detail"]
    r = client.get("/api/v1/query", params={"metric": "new_users", "stat": "first_seen", "group_by": "endpoint"})
    assert r.status_code == 400 and "per stream" in r.json()["detail"]
    r = client.get("/api/v1/query", params={"metric": "new_users", "stat": "first_seen"})
    assert r.status_code == 200
    assert all(p["value"] == 0 for p in r.json()["series"][0]["points"])
