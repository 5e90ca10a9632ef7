"""How the PostgreSQL store keeps what every commit rewrites (store/postgres/schema.py
LZ4_COLUMNS: the panes' and tier rows' sketches, the Bloom filters' chunks): compressed with lz4,
set when a store is opened; values a store wrote before with pglz read as they did, beside the new ones."""

from __future__ import annotations

import functools

import psycopg
import pytest

from store import BatchCommit, PanePartial
from store.joins import JoinCommit, JoinEvent
from store.postgres import PostgresPaneStore
from store.postgres.schema import LZ4_COLUMNS
from tests.unit.test_commit_bulk import LAYOUT, PANE, T0, _pane
from tests.unit.test_dim_sets import _everything  # panes, tier rows, sums, newest panes, change feed

pytestmark = pytest.mark.postgres


def _compression(dsn: str) -> dict[tuple[str, str], str]:
    with psycopg.connect(dsn) as conn:
        return {(table, column): conn.execute(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = %s::regclass AND attname = %s",
            (table, column)).fetchone()[0] for table, column in LZ4_COLUMNS}


@functools.cache
def _partials(batch_id: int) -> tuple[PanePartial, ...]:
    """Panes of a few hundred values and users each: sketches of kilobytes, which PostgreSQL
    stores compressed (a row's values past ~2 KB). Made once: a KLL past its k compacts at random."""
    partials = []
    for i in range(6):
        dims = {"a": "xyz"[i % 3], "b": str(i % 2)}
        start = T0 + batch_id * PANE
        values = [float((batch_id * 7 + i) * 1_000 + k) for k in range(600)]
        users = [f"u{batch_id}-{i}-{k}" for k in range(400)]
        partials.append(PanePartial("s", start, start + PANE, dims, _pane(dims, values, users)))
    return tuple(partials)


def _commit(store, batch_id: int, joins: tuple = ()) -> None:
    partials = list(_partials(batch_id))
    store.commit_batch(BatchCommit("main", batch_id, partials, sum(p.data.count for p in partials),
                                   {"s": T0 + batch_id * PANE}, {}, joins=list(joins)), lateness_ms={"s": 0}, now_ms=T0)


def _join(batch_id: int, events: int = 2_000) -> JoinCommit:
    """A batch's window-join events (each batch its own offsets), those of earlier batches expired."""
    at = T0 + batch_id * PANE
    made = [JoinEvent(at, 0, batch_id * events + i, f"k{i}", ("x",)) for i in range(events)]
    return JoinCommit("j", at, at - 1, lefts=made, rights=[e._replace(dims=()) for e in made])


def _exact(store) -> list:
    """The panes and tier rows without their KLLs, which a merge that compacts draws at random."""
    panes, tiers = _everything(store)[:2]
    return [(p.key, p.end_ms, p.data.count, {f: (v.n, v.sum, v.min, v.max) for f, v in p.data.values.items()},
             p.data.distincts) for p in [*panes, *(row for rows in tiers for row in rows)]]


def test_a_new_store_compresses_its_rows_sketches_with_lz4(postgres_server):
    store = PostgresPaneStore(postgres_server.fresh_dsn(), pool_size=1)
    try:
        assert set(_compression(store.dsn).values()) == {"l"}
        with psycopg.connect(store.dsn) as conn:  # every BYTEA column: the open sessions' bodies too
            binary = conn.execute("SELECT table_name, column_name FROM information_schema.columns"
                                  " WHERE table_schema = current_schema() AND data_type = 'bytea'").fetchall()
        assert sorted(binary) == sorted(LZ4_COLUMNS)
    finally:
        store.close()


def test_a_store_of_before_moves_to_lz4_and_reads_its_pglz_rows_as_before(postgres_server):
    dsn = postgres_server.fresh_dsn()
    store = PostgresPaneStore(dsn, pool_size=1)
    with psycopg.connect(dsn, autocommit=True) as conn:  # as a store made before: the server's default
        for table, column in LZ4_COLUMNS:
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION pglz")
    store.configure_tiers({"s": LAYOUT}, now_ms=T0)
    for batch_id in range(3):
        _commit(store, batch_id)
    with psycopg.connect(dsn) as conn:  # sketches past the inline limit, compressed as stored: pglz
        methods = {m for (m,) in conn.execute("SELECT DISTINCT pg_column_compression(sketches) FROM tier_rows")}
    assert "pglz" in methods
    before = _everything(store)
    store.close()

    store = PostgresPaneStore(dsn, pool_size=1)  # opened again: lz4 from now on
    try:
        assert set(_compression(dsn).values()) == {"l"}
        assert _everything(store) == before
        _commit(store, 3)  # merged into rows stored with pglz, written back with lz4
        with psycopg.connect(dsn) as conn:
            methods = {m for (m,) in conn.execute("SELECT DISTINCT pg_column_compression(sketches) FROM tier_rows")}
        assert "lz4" in methods
        fresh = PostgresPaneStore(postgres_server.fresh_dsn(), pool_size=1)  # the same batches, lz4 all along
        try:
            fresh.configure_tiers({"s": LAYOUT}, now_ms=T0)
            for batch_id in range(4):
                _commit(fresh, batch_id)
            assert _exact(store) == _exact(fresh)
        finally:
            fresh.close()
    finally:
        store.close()


def test_the_staging_tables_do_not_grow_commit_after_commit(postgres_server):
    """A commit's rows go through temporary tables (store/postgres/rows.py), emptied after each use.
    Autovacuum never visits a session's temporary tables: the deleted rows stayed, the tables grew
    by a batch's rows and sketches at every commit (218 MB after 58 of bench.steady_commits --mix),
    and each upsert scanning them grew slower. Each writer now vacuums them before its transaction."""
    from store.postgres.rows import _STAGING

    store = PostgresPaneStore(postgres_server.fresh_dsn(), pool_size=1)  # one connection: one set of tables
    try:
        store.configure_tiers({"s": LAYOUT}, now_ms=T0)
        sizes = []
        for batch_id in range(16):
            _commit(store, batch_id, [_join(batch_id)])  # the window joins' events go through staging too
            with store._pool.connection() as conn:
                sizes.append(conn.execute("SELECT sum(pg_total_relation_size(name::regclass))::bigint"
                                          " FROM unnest(%s::text[]) AS t(name)", (list(_STAGING),)).fetchone()[0])
        assert sizes[-1] <= 1.5 * sizes[3], sizes
    finally:
        store.close()
