"""`sketchboard check-config` against the data directory: what a configuration that parses still
cannot do, or will do, with the data already there (docs/configuration.md).

- a stream whose `partitions` is fewer than its log has: the API and the pipeline refuse to start
  (a partition count can grow, not shrink): an error;
- a stream whose definition version differs from the one its served output was built with
  (as GET /api/v1/reprocess lists them): the pipeline goes on computing it as stored until a
  reprocessing switch (docs/reprocessing.md): a note.

Read only, through read-only connections: nothing is created where nothing is. Only the embedded
log and the SQLite store are read here (a Kafka topic's partitions are checked by the API and the
pipeline when they start; a PostgreSQL store is not opened by a configuration check)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from catalog import Catalog
from catalog.versions import changed_streams, short_version
from sketchboard.settings import Settings
from store.namespace import ROOT, sqlite_store_path


def _rows(path: Path, sql: str) -> list[tuple]:
    """The rows of `sql` over the database at `path`; none where the file or the table is not there."""
    if not path.is_file():
        return []
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # no such table: nothing recorded yet
        return []
    finally:
        conn.close()


def partition_shrinks(settings: Settings, catalog: Catalog) -> list[str]:
    """One error per stream configured with fewer partitions than the embedded log has."""
    if settings.log_backend != "embedded":
        return []
    logged = dict(_rows(settings.log_path, "SELECT stream, partitions FROM topics"))
    return [f"stream {name!r}: partitions {stream.partitions} but the log has {logged[name]}; a partition count can"
            f" grow but not shrink (the API and the pipeline refuse to start): configure `partitions: {logged[name]}`"
            for name, stream in catalog.streams.items() if name in logged and logged[name] > stream.partitions]


def changed_definitions(settings: Settings, catalog: Catalog) -> list[str]:
    """One note per stream whose configured definition differs from its served output's."""
    if settings.store_backend != "sqlite":
        return []
    stored = {stream: version for stream, version, _ in _rows(
        sqlite_store_path(settings.data_dir, ROOT), "SELECT stream, version, definition FROM stream_definitions")}
    return [f"stream {name!r}: definition changed (version {short_version(old)} -> {short_version(new)}); the"
            f" pipeline keeps computing it as stored until `sketchboard reprocess {name}` and a switch"
            for name, (old, new) in sorted(changed_streams(catalog, stored).items())]

