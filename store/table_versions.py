"""Versions of changelog tables' rows, for enrichment (stream-table join, catalog/enrichment.py).

Every change of a row is kept as a version valid from the time it was appended to the log (its
ingest time: the API's receive time, Kafka's LogAppendTime), not the table's own event time: an
event is enriched with the row as the log knew it at the event's time (`as_of`), so an update
that arrives later, even one that carries an older time, never rewrites what was already
computed, and a reprocess of the same log gives the same answer (docs/tables.md, "Enrichment").

`as_of` is the lookup, pure; the store keeps the versions (DDL, `apply`, `prune_query`) in the
batch's transaction, for every backend.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

DDL = """
-- Versions of changelog tables' rows, for enrichment (store/table_versions.py).
CREATE TABLE IF NOT EXISTS table_versions (
    stream TEXT NOT NULL,
    row_key TEXT NOT NULL,
    valid_from_ms INTEGER NOT NULL, -- the change's append time: it holds for events from then on
    log_partition INTEGER NOT NULL,
    log_offset INTEGER NOT NULL,    -- orders changes of one key appended in the same millisecond
    row_json TEXT,                  -- the row's columns (JSON object); NULL: deleted from then on
    batch_id INTEGER NOT NULL,
    PRIMARY KEY (stream, row_key, log_partition, log_offset)
);
"""


@dataclass(frozen=True)
class TableVersion:
    """One change of one key's row: `row` None is a delete."""

    valid_from_ms: int
    partition: int
    offset: int
    row: Mapping[str, Any] | None = None

    @property
    def order(self) -> tuple[int, int, int]:
        return self.valid_from_ms, self.partition, self.offset


def lookup_time(event_time_ms: int, ingest_time_ms: int) -> int:
    """The instant an event is enriched as of: its event time, but never after it was appended
    (an event stamped ahead of its arrival must not see table changes appended after it: they
    may sit in a later batch of the live run, and a reprocess must give the same answer)."""
    return min(event_time_ms, ingest_time_ms)


def as_of(versions: Sequence[TableVersion], at_ms: int) -> Mapping[str, Any] | None:
    """The row valid at `at_ms` among one key's versions (sorted by `order`): the newest version
    appended at or before it; None when there is none or that version is a delete."""
    i = bisect.bisect_right([v.valid_from_ms for v in versions], at_ms)
    return None if i == 0 else versions[i - 1].row


def by_key(versions: Iterable[tuple[str, TableVersion]]) -> dict[str, list[TableVersion]]:
    """(key, version) pairs as each key's versions in order, duplicates (a replayed change) once."""
    out: dict[str, dict[tuple[int, int], TableVersion]] = {}
    for key, v in versions:
        out.setdefault(key, {})[(v.partition, v.offset)] = v
    return {key: sorted(vs.values(), key=lambda v: v.order) for key, vs in out.items()}


def prunable(versions: Sequence[TableVersion], keep_from_ms: int) -> list[TableVersion]:
    """The versions of one key no lookup at or after `keep_from_ms` can need: all older than the
    one valid at `keep_from_ms` (that one stays, it answers every lookup until the next)."""
    i = bisect.bisect_right([v.valid_from_ms for v in versions], keep_from_ms)
    if i == 0:
        return []
    return [v for v in versions[:i - 1] if v.valid_from_ms < versions[i - 1].valid_from_ms]


def prunable_from_ms(versions: Sequence[TableVersion]) -> int | None:
    """The first `keep_from_ms` at which `prunable(versions, keep_from_ms)` is not empty: the first
    time after the key's first version's (versions sorted by `order`). None: never (one version,
    or all from the same millisecond), until another version comes."""
    first = versions[0].valid_from_ms if versions else None
    return next((v.valid_from_ms for v in versions if v.valid_from_ms > first), None)


@dataclass(eq=False)
class SingleVersions:
    """A table's keys that had exactly one kept version when it was made, as columns: for such a
    key `KeptVersions.with_batch` gives that one version, so a batch's lookup can find its keys
    all at once by Arrow's hash instead of one dict lookup per key (aggregates/enrichment_driver.py;
    a demo batch asks for ~30 000-50 000 users of a full table). Made once and kept across batches:
    `KeptVersions.singles` says which of its keys have changed since (not to be taken from it).
    `derived` memoizes what a user computes from `rows` (a column's texts), for as long as it lives."""

    keys: pa.Array  # strings
    valid_from_ms: np.ndarray  # int64, per key
    rows: list[Mapping[str, Any] | None]  # per key; None: deleted from valid_from_ms on
    derived: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, kept: Mapping[str, Sequence[TableVersion]]) -> SingleVersions:
        singles = [(key, vs[0]) for key, vs in kept.items() if len(vs) == 1]
        return cls(pa.array([k for k, _ in singles], pa.string()),
                   np.array([v.valid_from_ms for _, v in singles], np.int64), [v.row for _, v in singles])


# When a batch's lookup takes keys from the single-version columns (KeptVersions.singles):
# - it asks for this many distinct keys or more: finding fewer among the columns costs more than a
#   dict lookup each (the columns' keys are hashed again every time: ~2-3 ms for 50 000);
SINGLES_FROM_KEYS = 2_000
# - the table holds at most this many keys per key asked: a table far larger than its batches'
#   keys would be hashed whole for each batch, and made into columns, for a few lookups;
SINGLES_TABLE_PER_KEY = 4
# - made again once 1 / SINGLES_STALE_SHARE of their keys has changed since (a demo table changes a
#   few keys a batch: they last for many batches), but not for SINGLES_REST_BATCHES batches after
#   that: a table changing that fast is looked up in the dicts meanwhile, so making the columns
#   (~1.6 us a key) is paid at most once in that many batches.
SINGLES_STALE_SHARE = 8
SINGLES_REST_BATCHES = 8


class KeptVersions:
    """The enriching tables' versions as the store holds them after a pipeline's last committed
    batch, kept on the driver across batches (aggregates/enrichment.py) instead of read whole from
    the store every batch. Pure: `load` reads one table's stored versions.

    The kept copy is **as of a batch id**: `as_of_store(last)` (the store's last committed batch
    id of the pipeline, read at the start of each batch) reloads everything unless the copy is as
    of exactly that batch, so a batch committed by anyone else (another process of the same
    pipeline, a restart, a commit whose outcome is unknown: `forget`) is never missed. After a
    batch commits, `committed` applies its versions and pruning as the store's transaction did
    (`apply`: a stored position is kept; `prune`), so the copy stays equal to the store."""

    def __init__(self, load: Callable[[str], list[tuple[str, TableVersion]]], tables: Iterable[str], *,
                 singles_stale_share: int = SINGLES_STALE_SHARE, singles_rest_batches: int = SINGLES_REST_BATCHES):
        self.load = load
        self.singles_stale_share, self.singles_rest_batches = singles_stale_share, singles_rest_batches
        self.tables = tuple(tables)
        self.versions: dict[str, dict[str, list[TableVersion]]] = {}
        # Per table, {key: prunable_from_ms} of the keys pruning can shorten at some horizon: each
        # batch names the store only those whose time has come, not every key with two versions
        # (versions are kept for retention + skew, so after days nearly every key has several, and
        # the store's prune costs a correlated subquery per version of each key named).
        self._prunable_from: dict[str, dict[str, int]] = {}
        self._as_of: tuple[int | None] | None = None  # (batch id,) when loaded; None: to be read
        self.loads = 0  # how many times read whole from the store
        self._singles: dict[str, SingleVersions] = {}  # per table, made when first asked for
        self._stale: dict[str, set[str]] = {}  # per table, the keys changed since its singles were made
        self._resting: dict[str, int] = {}  # per table, batches to wait before its singles are made again

    def as_of_store(self, last_batch_id: int | None) -> bool:
        """Make the copy the store's after `last_batch_id`; True when it had to be read again."""
        if self._as_of == (last_batch_id,):
            return False
        self.versions = {t: by_key(self.load(t)) for t in self.tables}
        self._prunable_from = {t: {k: at for k, vs in kept.items() if (at := prunable_from_ms(vs)) is not None}
                               for t, kept in self.versions.items()}
        self._singles, self._stale = {}, {}
        self._as_of = (last_batch_id,)
        self.loads += 1
        return True

    def forget(self) -> None:
        """Whether the store has a batch is unknown (its commit failed midway): read it again."""
        self._as_of = None

    def with_batch(self, table: str, keys: Iterable[str],
                   new: Sequence[tuple[str, TableVersion]]) -> dict[str, list[TableVersion]]:
        """The versions of `keys` with a batch's `new` ones merged in, as `by_key(stored + new)`: the
        kept lists as they are (in by_key's order already) for the keys the batch did not change,
        only the changed keys merged (a 20 000-event batch asks for ~10 000 keys). Walked from the
        smaller side: the table's keys where it holds fewer than the batch asks for (a demo batch
        asks for ~50 000 users; none held: 24 -> 17 ms a batch with _Versions.at's walk)."""
        kept = self.versions[table]
        changed = {k for k, _ in new}
        keys = keys if isinstance(keys, (set, frozenset)) else set(keys)
        if len(kept) < len(keys):  # walked from the smaller side: a batch's ~50 000 keys, a table holding few
            out = {k: vs for k, vs in kept.items() if vs and k in keys and k not in changed}
        else:
            out = {k: vs for k in keys if k not in changed and (vs := kept.get(k))}
        out.update(by_key([*((k, v) for k in changed & keys for v in kept.get(k, ())), *new]))
        return out

    def singles(self, table: str, changed: Iterable[str] = (), *,
                asked: int) -> tuple[SingleVersions, frozenset[str]] | None:
        """For a batch asking for `asked` distinct keys of `table`: the table's single-version keys
        as columns, and the keys of them not to be taken from there (those changed since they were
        made, and `changed`: the batch's new versions' keys, which `with_batch` merges); every other
        key of them has that one version in the copy. None where the batch is better served by the
        dicts (the constants above)."""
        if asked < SINGLES_FROM_KEYS or len(self.versions[table]) > SINGLES_TABLE_PER_KEY * asked \
                or self._resting.get(table, 0) > 0:
            return None
        made = self._singles.get(table)
        if made is None:
            made = self._singles[table] = SingleVersions.of(self.versions[table])
            self._stale[table] = set()
        return made, frozenset(self._stale[table]).union(changed)

    def prune_candidates(self, table: str, new: Iterable[tuple[str, TableVersion]],
                         keep_from_ms: int | None) -> set[str]:
        """The keys of `table` that pruning at `keep_from_ms` (None: none) shortens once the batch's
        `new` versions are in: the only ones the store need look at (the copy must be as of the store)."""
        if keep_from_ms is None:
            return set()
        new = list(new)
        kept, changed = self.versions[table], {key for key, _ in new}
        due = {key for key, at in self._prunable_from[table].items() if at <= keep_from_ms and key not in changed}
        for key, versions in by_key([*((k, v) for k in changed for v in kept.get(k, ())), *new]).items():
            at = prunable_from_ms(versions)  # a new version may come before the kept ones' times
            if at is not None and at <= keep_from_ms:
                due.add(key)
        return due

    def committed(self, batch_id: int, commit: EnrichmentCommit) -> dict[str, set[str]]:
        """Apply batch `batch_id`'s versions and pruning, committed to the store since the copy's
        batch; per table the keys whose versions changed."""
        changed: dict[str, set[str]] = {}
        for table in self.tables:
            kept, due, touched = self.versions[table], self._prunable_from[table], set()
            for key, v in commit.versions.get(table, ()):
                vs = kept.setdefault(key, [])
                if any((o.partition, o.offset) == (v.partition, v.offset) for o in vs):
                    continue  # stored already: the store keeps it as it is
                bisect.insort(vs, v, key=lambda o: o.order)
                touched.add(key)
            for key in touched:
                _set_prunable_from(due, key, kept[key])
            keep_from = commit.keep_from_ms.get(table)
            if keep_from is not None:
                named = (commit.prune_keys or {}).get(table)  # prune_candidates' answer: no second walk
                for key in [key for key, at in due.items() if at <= keep_from] if named is None else named:
                    dropped = len(prunable(kept.get(key, ()), keep_from))  # a prefix of the key's versions
                    if dropped:
                        kept[key] = kept[key][dropped:]
                        touched.add(key)
                        _set_prunable_from(due, key, kept[key])
            changed[table] = touched
            if self._resting.get(table, 0) > 0:
                self._resting[table] -= 1
            if table in self._singles:
                stale = self._stale[table]
                stale |= touched
                if len(stale) * self.singles_stale_share > len(self._singles[table].keys):
                    del self._singles[table], self._stale[table]  # made again when next asked for,
                    self._resting[table] = self.singles_rest_batches  # but not before this many batches
        self._as_of = (batch_id,)
        return changed


def _set_prunable_from(due: dict[str, int], key: str, versions: Sequence[TableVersion]) -> None:
    at = prunable_from_ms(versions)
    if at is None:
        due.pop(key, None)
    else:
        due[key] = at


# -- the store ---------------------------------------------------------------------------------


def apply(cur, versions: Mapping[str, Sequence[tuple[str, TableVersion]]], batch_id: int, placeholder: str) -> None:
    """Write a batch's table versions with `cur` (the batch's transaction); a version already
    stored (same key and log position) is kept as it is."""
    p = placeholder
    rows = [(stream, key, v.valid_from_ms, v.partition, v.offset,
             None if v.row is None else json.dumps(v.row, separators=(",", ":"), sort_keys=True), batch_id)
            for stream, pairs in versions.items() for key, v in pairs]
    if rows:
        cur.executemany(
            "INSERT INTO table_versions (stream, row_key, valid_from_ms, log_partition, log_offset, row_json, batch_id)"
            f" VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p})"
            " ON CONFLICT (stream, row_key, log_partition, log_offset) DO NOTHING", rows)


SEEDED_BATCH_ID = -1  # the batch id of versions copied in from another store, before any batch of its own


# Keys named in one DELETE when a commit says which keys pruning can shorten; more go in several.
PRUNE_KEYS_PER_STATEMENT = 500


def prune(cur, stream: str, keep_from_ms: int, placeholder: str, keys: Collection[str] | None = None) -> None:
    """Drop the versions of `stream` that no lookup at or after `keep_from_ms` needs: each key's
    versions older than its newest one valid at `keep_from_ms`. `keys`: only these keys can have
    such versions (the others have one version each), so only they are looked at; None: every key.
    The whole table costs a correlated subquery per stored row: ~0.1 s per batch for the demo's
    50 000 users on SQLite, where a batch's few changed keys cost nothing."""
    p = placeholder
    older = (" AND valid_from_ms < (SELECT MAX(n.valid_from_ms) FROM table_versions n"
             " WHERE n.stream = table_versions.stream AND n.row_key = table_versions.row_key"
             " AND n.valid_from_ms <= " + p + ")")
    if keys is None:
        cur.execute("DELETE FROM table_versions WHERE stream = " + p + older, (stream, keep_from_ms))
        return
    keys = sorted(keys)
    for i in range(0, len(keys), PRUNE_KEYS_PER_STATEMENT):
        chunk = keys[i:i + PRUNE_KEYS_PER_STATEMENT]
        cur.execute(f"DELETE FROM table_versions WHERE stream = {p} AND row_key IN ({', '.join([p] * len(chunk))})"
                    + older, (stream, *chunk, keep_from_ms))


def versions_query(placeholder: str) -> str:
    """Every stored version of a table: args (stream,)."""
    return ("SELECT row_key, valid_from_ms, log_partition, log_offset, row_json FROM table_versions"
            f" WHERE stream = {placeholder} ORDER BY row_key, valid_from_ms, log_partition, log_offset")


def to_version(found: tuple) -> tuple[str, TableVersion]:
    key, valid_from, partition, offset, row_json = found
    return key, TableVersion(valid_from, partition, offset, None if row_json is None else json.loads(row_json))


# -- enrichment misses: events whose key had no row at their time, per stream and table ----------

MISSES_DDL = """
CREATE TABLE IF NOT EXISTS enrich_misses (
    stream TEXT NOT NULL,
    table_name TEXT NOT NULL,
    count INTEGER NOT NULL,         -- events enriched with "" because the key had no row at their time
    PRIMARY KEY (stream, table_name)
);
"""


def add_misses(cur, misses: Mapping[tuple[str, str], int], placeholder: str) -> None:
    p = placeholder
    rows = [(stream, table, n) for (stream, table), n in misses.items() if n]
    if rows:
        cur.executemany(f"INSERT INTO enrich_misses (stream, table_name, count) VALUES ({p}, {p}, {p})"
                        " ON CONFLICT (stream, table_name) DO UPDATE SET count = enrich_misses.count + excluded.count",
                        rows)


def miss_counts(cur) -> dict[str, dict[str, int]]:
    """{stream: {table: events enriched with "" so far}}."""
    cur.execute("SELECT stream, table_name, count FROM enrich_misses")
    out: dict[str, dict[str, int]] = {}
    for stream, table, n in cur.fetchall():
        out.setdefault(stream, {})[table] = n
    return out


@dataclass(frozen=True)
class EnrichmentCommit:
    """What a batch's enrichment writes in its transaction: the tables' new versions (per table,
    (key, version) pairs), per table the instant from which lookups must stay answerable (older
    versions are pruned), and the misses per (stream, table). `prune_keys`: per table the only keys
    pruning at its instant shortens (KeptVersions.prune_candidates); a table not in it (or None)
    has every key looked at."""

    versions: Mapping[str, Sequence[tuple[str, TableVersion]]]
    keep_from_ms: Mapping[str, int]
    misses: Mapping[tuple[str, str], int]
    prune_keys: Mapping[str, Collection[str]] | None = None


def apply_commit(cur, commit: EnrichmentCommit, batch_id: int, placeholder: str) -> None:
    apply(cur, commit.versions, batch_id, placeholder)
    for stream, keep_from in commit.keep_from_ms.items():
        prune(cur, stream, keep_from, placeholder, (commit.prune_keys or {}).get(stream))
    add_misses(cur, commit.misses, placeholder)
