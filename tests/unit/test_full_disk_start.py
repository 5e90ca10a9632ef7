"""Starting on a full disk (session 63's hunt): an up-to-date SQLite store opens without writing
anything, and `sketchboard` names the SQLite file it cannot open or write instead of a traceback."""

from __future__ import annotations

from sketchboard import cli
from store import SqlitePaneStore


def test_an_up_to_date_store_opens_without_writing(tmp_path):
    SqlitePaneStore(tmp_path / "store.db").close()  # created, then closed: its WAL folded back and removed
    store = SqlitePaneStore(tmp_path / "store.db")
    try:
        # Nothing appended to the WAL: on a full disk any write fails (the schema version was written
        # again at each open, which made an up-to-date store unopenable there).
        assert (tmp_path / "store.db-wal").stat().st_size == 0
    finally:
        store.close()


def test_a_sqlite_error_at_start_is_one_line_naming_the_file(tmp_path, capsys):
    # A store file SQLite cannot read stands for one it cannot write (a full disk): both raise
    # sqlite3 errors from the same opening, which reached the user as a traceback.
    (tmp_path / "store.db").write_bytes(b"not a database, " * 512)
    assert cli.main(["token", "create", "--data-dir", str(tmp_path), "--scope", "read", "first"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"sketchboard: cannot open or write the SQLite file {tmp_path / 'store.db'}: file is not a database"
