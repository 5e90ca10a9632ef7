"""The SQLite store's WAL does not keep the size of its largest transaction (issue 27's disk bar:
a backfill batch of 1 M events grew it to ~360 MiB, kept while any connection stayed open)."""

from __future__ import annotations

from store import SqlitePaneStore
from store import connection


def test_the_wal_shrinks_back_after_a_large_transaction(tmp_path, monkeypatch):
    monkeypatch.setattr(connection, "WAL_LIMIT_BYTES", 2**20)  # 1 MiB here, to write little
    store = SqlitePaneStore(tmp_path / "store.db", synchronous="OFF")
    db = store.side_db()
    db.execute("CREATE TABLE filler (data BLOB)")
    with db.transaction():  # ~4 MiB in one transaction, as a backfill batch writes hundreds
        db.executemany("INSERT INTO filler (data) VALUES (?)", [(bytes(4000),)] * 1000)
    wal = tmp_path / "store.db-wal"
    assert wal.stat().st_size > 4 * 2**20
    with db.transaction():  # the next write, after the checkpoint that followed the large one
        db.execute("INSERT INTO filler (data) VALUES (?)", (b"x",))
    assert wal.stat().st_size <= 2**20
    db.close()
    store.close()
