"""The enriching tables' versions kept on the driver across batches (store/table_versions.py
KeptVersions) never differ from the store's: after every committed batch they equal what the store
reads back (Hypothesis over random batches of changes, replays and pruning horizons), a batch's
merged view equals the old path's `by_key(stored + new)`, and a copy that is not as of the store's
last batch (another writer of the pipeline, a restart, a failed commit) is read again (both stores)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from store import SqlitePaneStore
from store.base import BatchCommit
from store.table_versions import (SINGLES_FROM_KEYS, SINGLES_REST_BATCHES, SINGLES_TABLE_PER_KEY, EnrichmentCommit,
                                  KeptVersions, SingleVersions, TableVersion, by_key)

T0 = 1_700_000_000_000


def commit(batch_id, versions=(), keep_from=None, prune_keys=None) -> BatchCommit:
    return BatchCommit("main", batch_id, [], 0, enrichment=EnrichmentCommit(
        {"users": list(versions)}, {} if keep_from is None else {"users": keep_from}, {},
        None if prune_keys is None else {"users": prune_keys}))


def stored(store) -> dict[str, list[TableVersion]]:
    return by_key(store.table_versions("users"))


# One batch: changes (key, ms after the previous change, partition, a replay of an earlier change?,
# plan or None for a delete) and a pruning horizon (ms before the batch's last change, or none).
batches = st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from(["u1", "u2", "u3", "u4"]), st.integers(0, 3), st.integers(0, 1),
                       st.booleans(), st.one_of(st.none(), st.sampled_from(["free", "pro"]))), max_size=6),
    st.one_of(st.none(), st.integers(0, 12))), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(batches, st.booleans(), st.sampled_from([0, 1, 8]))
@example([([("u1", 0, 0, False, None)] * 4 + [("u1", 1, 0, False, None)], 0), ([("u1", 0, 0, True, None)], 0)], True, 8)
def test_kept_versions_equal_the_stores_after_every_batch_and_merge_a_batch_as_the_store_would(plan, name_keys,
                                                                                               stale_share):
    """name_keys: the commit names the keys pruning can shorten (the pipeline's way), else the
    store looks at every key; the store must prune alike. The single-version columns give each key
    they may be taken for the one version the batch's merged view has (stale_share 0: never made
    again, so the keys changed since must be told apart; 1 and 8: made again as they go stale)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db")
        kept = KeptVersions(store.table_versions, ["users"], singles_stale_share=stale_share)
        at, offsets, seen = T0, [0, 0], []
        for batch_id, (changes, horizon) in enumerate(plan):
            new = []
            for key, step, partition, replay, plan_name in changes:
                if replay and seen:
                    new.append(seen[(step * 7 + len(new)) % len(seen)])  # a change the log gives again
                    continue
                at += step
                offsets[partition] += 1
                version = TableVersion(at, partition, offsets[partition], None if plan_name is None else {"plan": plan_name})
                new.append((key, version))
                seen.append((key, version))
            assert not kept.as_of_store(store.last_batch_id("main")) or batch_id == 0  # read once, then kept
            keys = {k for k, _ in new} | {"u1"}
            merged = by_key([*store.table_versions("users"), *new])
            assert kept.with_batch("users", keys, new) == {k: vs for k, vs in merged.items() if k in keys}
            # From the second batch on: made from an empty copy, the columns would hold nothing to check.
            offered = kept.singles("users", (k for k, _ in new), asked=SINGLES_FROM_KEYS) if batch_id else None
            held, excluded = offered or (SingleVersions.of({}), ())  # None: resting after going stale
            for key, valid_from, row in zip(held.keys.to_pylist(), held.valid_from_ms.tolist(), held.rows):
                if key not in excluded:
                    [version] = merged[key]
                    assert (version.valid_from_ms, version.row) == (valid_from, row)
            before = stored(store)
            keep_from = None if horizon is None else at - horizon
            named = kept.prune_candidates("users", new, keep_from) if name_keys else None
            done = commit(batch_id, new, keep_from, named)
            assert store.commit_batch(done, lateness_ms={}, now_ms=T0).committed
            changed = kept.committed(batch_id, done.enrichment)
            after = stored(store)
            assert kept.versions["users"] == after
            # The keys said changed include every key whose versions differ (a lookup frame made
            # before must stop answering for them) and otherwise only keys of the batch's changes
            # (a replayed change the store already pruned changes nothing, yet is named: harmless).
            differ = {k for k in {*before, *after} if before.get(k) != after.get(k)}
            assert differ <= changed["users"] <= differ | {k for k, _ in new}
        assert kept.loads == 1
        store.close()


def test_a_copy_not_as_of_the_stores_last_batch_is_read_again(store_backend):
    store = store_backend.create()
    v1, v2 = TableVersion(T0, 0, 1, {"plan": "free"}), TableVersion(T0 + 10, 0, 2, {"plan": "pro"})
    store.commit_batch(commit(0, [("u1", v1)]), lateness_ms={}, now_ms=T0)
    kept = KeptVersions(store.table_versions, ["users"])
    assert kept.as_of_store(store.last_batch_id("main")) and kept.versions["users"] == {"u1": [v1]}
    assert not kept.as_of_store(store.last_batch_id("main"))  # kept: not read again
    assert kept.singles("users", asked=SINGLES_FROM_KEYS)[0].keys.to_pylist() == ["u1"]  # u1's one version, as columns
    # Another process of the pipeline (a restart, a takeover) commits batch 1: the copy is as of 0.
    other = store_backend.reopen(store)
    other.commit_batch(commit(1, [("u1", v2)]), lateness_ms={}, now_ms=T0)
    assert kept.as_of_store(store.last_batch_id("main")) and kept.versions["users"] == {"u1": [v1, v2]}
    assert kept.singles("users", asked=SINGLES_FROM_KEYS)[0].keys.to_pylist() == []  # made again from the copy read again: u1 has two
    assert kept.loads == 2
    # A commit that failed midway: whether the store has the batch is unknown, the copy is read again.
    kept.forget()
    assert kept.as_of_store(store.last_batch_id("main")) and kept.loads == 3
    # Its own committed batch keeps it as of that batch, pruned as the store pruned (naming the keys
    # pruning can shorten, as the pipeline does: u1 has two versions).
    done = commit(2, [("u2", v1)], keep_from=T0 + 10, prune_keys=kept.prune_candidates("users", [("u2", v1)], T0 + 10))
    assert done.enrichment.prune_keys == {"users": {"u1"}}  # u2's one version: nothing to prune
    store.commit_batch(done, lateness_ms={}, now_ms=T0)
    assert kept.committed(2, done.enrichment) == {"users": {"u1", "u2"}}  # u1: its first version pruned
    assert not kept.as_of_store(store.last_batch_id("main"))
    assert kept.versions["users"] == stored(store_backend.reopen(store)) == {"u1": [v2], "u2": [v1]}


def test_the_single_version_columns_are_offered_to_large_batches_of_a_table_not_far_larger_nor_fast_changing():
    users = [(f"u{i}", TableVersion(T0, 0, i, {"plan": "free"})) for i in range(4 * SINGLES_FROM_KEYS)]
    kept = KeptVersions(lambda table: users, ["users"])
    kept.as_of_store(None)
    assert kept.singles("users", asked=SINGLES_FROM_KEYS - 1) is None  # a few keys: a dict lookup each
    assert kept.singles("users", asked=len(users) // SINGLES_TABLE_PER_KEY - 1) is None  # the table far larger
    held, excluded = kept.singles("users", asked=SINGLES_FROM_KEYS * 4 // SINGLES_TABLE_PER_KEY)
    assert len(held.keys) == len(users) and not excluded
    # An eighth of the keys changed by one batch: the columns go, and are not made again for the
    # next SINGLES_REST_BATCHES batches (a table changing that fast is looked up in the dicts).
    changes = [(key, TableVersion(T0 + 1, 0, len(users) + i, {"plan": "pro"}))
               for i, (key, _) in enumerate(users[:len(users) // 8 + 1])]
    kept.committed(1, EnrichmentCommit({"users": changes}, {}, {}))
    for batch_id in range(2, 2 + SINGLES_REST_BATCHES):
        assert kept.singles("users", asked=len(users)) is None
        kept.committed(batch_id, EnrichmentCommit({}, {}, {}))
    held, excluded = kept.singles("users", asked=len(users))
    assert len(held.keys) == len(users) - len(changes) and not excluded  # the changed keys have two versions now


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20), max_size=8), st.integers(-2, 25))
def test_a_keys_versions_are_prunable_from_the_first_time_after_its_first(times, keep_from):
    from store.table_versions import prunable, prunable_from_ms

    versions = by_key([("u", TableVersion(T0 + t, 0, i)) for i, t in enumerate(times)]).get("u", [])
    at = prunable_from_ms(versions)
    assert bool(prunable(versions, T0 + keep_from)) == (at is not None and T0 + keep_from >= at)


def test_a_batch_names_the_store_only_the_keys_pruning_shortens_now():
    """Versions are kept for retention + skew (8 days in the demo), so after a while nearly every
    key has several; naming every such key to the store each batch made its prune look at all of
    their versions with a correlated subquery each (quadratic in a key's versions), to drop a few."""
    users = [(f"u{i}", TableVersion(T0 + step, 0, 2 * i + step // 100, {"plan": "free"}))
             for i in range(1_000) for step in (0, 100)]
    kept = KeptVersions(lambda table: users, ["users"])
    kept.as_of_store(None)
    assert kept.prune_candidates("users", [], T0 + 99) == set()  # every key has two versions, none prunable yet
    assert kept.prune_candidates("users", [], None) == set()
    assert len(kept.prune_candidates("users", [], T0 + 100)) == 1_000
    early = TableVersion(T0 + 10, 1, 0, {"plan": "pro"})  # a new version before u7's second
    assert kept.prune_candidates("users", [("u7", early)], T0 + 50) == {"u7"}
    # Committed, the copy prunes what the store pruned and names nothing more until the next time.
    kept.committed(0, EnrichmentCommit({"users": [("u7", early)]}, {"users": T0 + 50}, {}, {"users": {"u7"}}))
    assert kept.versions["users"]["u7"] == [early, users[15][1]]
    assert kept.prune_candidates("users", [], T0 + 99) == set()
    assert kept.prune_candidates("users", [], T0 + 100) == {f"u{i}" for i in range(1_000)}
