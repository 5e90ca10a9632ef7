"""`sketchboard check-config` against the data already there: what a configuration that parses
still cannot do, or will do, with the configured log and store (docs/configuration.md).

- a stream whose `partitions` is fewer than its log has (the embedded log, or its Kafka topic),
  or, on Kafka, a topic the API and the pipeline would refuse otherwise (fewer partitions than
  configured, a table's topic without broker append times): they refuse to start: an error;
- a stream whose definition version differs from the one its served output was built with
  (as GET /api/v1/reprocess lists them; the SQLite store or the PostgreSQL one): the pipeline
  goes on computing it as stored until a reprocessing switch (docs/reprocessing.md): a note.

Read only: the embedded log and the SQLite store through read-only connections, a PostgreSQL
store through a read-only transaction, Kafka's topics listed and described; nothing is created
where nothing is. A Kafka broker or PostgreSQL server that cannot be reached is a note saying
what was not checked (the file itself is valid; the API and the pipeline report it when they
start)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from catalog import Catalog
from catalog.versions import changed_streams, short_version
from sketchboard.settings import Settings
from store.namespace import ROOT, sqlite_store_path

# How long a check waits for a PostgreSQL server (the store's own pool waits longer: it is starting).
POSTGRES_CONNECT_TIMEOUT_S = 10


@dataclass
class Findings:
    errors: list[str] = field(default_factory=list)  # the API and the pipeline refuse to start
    notes: list[str] = field(default_factory=list)


def check_against_data(settings: Settings, catalog: Catalog) -> Findings:
    """What `check-config` says about `catalog` against the configured log and store."""
    found = Findings()
    changed_definitions(settings, catalog, found)
    log_mismatches(settings, catalog, found)
    return found


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


def log_mismatches(settings: Settings, catalog: Catalog, found: Findings) -> None:
    """An error per stream configured with fewer partitions than the embedded log has; on Kafka,
    per topic the API and the pipeline would refuse (its warnings, and a broker out of reach: notes)."""
    if settings.log_backend == "kafka":
        _kafka_topics(settings, catalog, found)
        return
    logged = dict(_rows(settings.log_path, "SELECT stream, partitions FROM topics"))
    found.errors += [
        f"stream {name!r}: partitions {stream.partitions} but the log has {logged[name]}; a partition count can"
        f" grow but not shrink (the API and the pipeline refuse to start): configure `partitions: {logged[name]}`"
        for name, stream in catalog.streams.items() if name in logged and logged[name] > stream.partitions]


def _kafka_topics(settings: Settings, catalog: Catalog, found: Findings) -> None:
    from ingest.log import LogUnavailable
    from ingest.log.kafka import KafkaEventLog
    from sketchboard.wiring import json_limits

    log = KafkaEventLog(settings.kafka_bootstrap_servers, topic_prefix=settings.kafka_topic_prefix,
                        replication_factor=settings.kafka_replication_factor, options=settings.kafka_options,
                        request_timeout_s=settings.kafka_request_timeout / 1000, json_limits=json_limits(settings))
    try:
        errors, warnings = log.check_topics(catalog.streams.values())
    except LogUnavailable as exc:
        found.notes.append(f"the Kafka topics were not checked: {exc}")
        return
    finally:
        log.close()
    found.errors += errors
    found.notes += warnings


def changed_definitions(settings: Settings, catalog: Catalog, found: Findings) -> None:
    """A note per stream whose configured definition differs from its served output's (a
    PostgreSQL server out of reach: a note saying so)."""
    if settings.store_backend == "postgres":
        try:
            rows = _postgres_rows(settings.postgres_dsn, "SELECT stream, version FROM stream_definitions")
        except Exception as exc:  # noqa: BLE001 - psycopg's OperationalError and kin: not reached, not checked
            found.notes.append(f"the stored stream definitions were not checked: PostgreSQL: {exc}".strip())
            return
    else:
        rows = _rows(sqlite_store_path(settings.data_dir, ROOT), "SELECT stream, version FROM stream_definitions")
    stored = dict(rows)
    found.notes += [
        f"stream {name!r}: definition changed (version {short_version(old)} -> {short_version(new)}); the"
        f" pipeline keeps computing it as stored until `sketchboard reprocess {name}` and a switch"
        for name, (old, new) in sorted(changed_streams(catalog, stored).items())]


def _postgres_rows(dsn: str, sql: str) -> list[tuple]:
    """The rows of `sql` in the store's root (the DSN's search_path), in a read-only transaction;
    none where the table is not there yet (a store the pipeline never opened)."""
    import psycopg

    with psycopg.connect(dsn, connect_timeout=POSTGRES_CONNECT_TIMEOUT_S) as conn:
        conn.read_only = True
        try:
            return conn.execute(sql).fetchall()
        except psycopg.errors.UndefinedTable:
            return []
