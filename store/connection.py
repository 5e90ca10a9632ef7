"""Opening the store's SQLite file: every store module (panes, bloom filters, lag samples,
Spark progress, alerts) uses its own connection to the same file, set up the same way.

The side stores (lag samples, Spark progress, alerts) are written once for every backend
over `Db`: plain SQL both SQLite and PostgreSQL run (`?` parameters, ON CONFLICT upserts,
CAST for a parameter only compared with NULL), SQLite-flavoured DDL the PostgreSQL Db
translates, and the few spellings that differ (`greatest`, `insert_id`) asked of the Db.
`SqliteDb` is here; `store.postgres.db.PostgresDb` is the other."""

from __future__ import annotations

import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from store.exact_sum import ExactSumAggregate


WAL_LIMIT_BYTES = 64 * 2**20


def open_connection(path: Path, *, synchronous: str | None = "NORMAL", busy_timeout_s: float = 30.0,
                    existing: bool = False) -> sqlite3.Connection:
    """Autocommit (transactions are explicit), shareable across threads (callers hold a lock),
    WAL so readers see the last commit while another process writes. `existing`: another
    connection to a file that must be there (an error if it is gone: no folder or empty database
    made in its place)."""
    if not existing:
        path.parent.mkdir(parents=True, exist_ok=True)
    target = f"{path.resolve().as_uri()}?mode=rw" if existing else path
    with naming_file(path):
        return _set_up(sqlite3.connect(target, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False,
                                       uri=existing), synchronous)


def _set_up(conn: sqlite3.Connection, synchronous: str | None) -> sqlite3.Connection:
    conn.execute("PRAGMA journal_mode=WAL")
    # A backfill batch's transaction grows the WAL to the size of what it wrote (hundreds of MiB
    # for 1 M events), and SQLite keeps the file that large for as long as a connection is open:
    # truncated to this once a checkpoint has copied it into the database.
    conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
    if synchronous is not None:
        conn.execute(f"PRAGMA synchronous={synchronous}")
    # Sums of float parts in SQL, exactly rounded as the pane roll-up's (store/sqlite_tiers.aggregate).
    conn.create_aggregate("exact_sum", 1, ExactSumAggregate)
    return conn


@contextmanager
def naming_file(path: Path) -> Iterator[None]:
    """A SQLite error raised inside says which file it is about (`db_path`, unless an inner one
    set it): `sketchboard` prints it with the reason (a full disk at start, sketchboard/cli.py)."""
    try:
        yield
    except sqlite3.Error as exc:
        if getattr(exc, "db_path", None) is None:
            exc.db_path = Path(path)
        raise


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any error (nothing half-written)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        # After SQLITE_FULL or an I/O error SQLite may have rolled back already; a ROLLBACK then
        # would raise "no transaction is active" and hide the real error.
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN (deferred) ... COMMIT around reads: they all see the file as one commit left it (WAL:
    a writer's commit meanwhile is not seen), where each statement of an autocommit connection
    sees the newest; takes no write lock."""
    conn.execute("BEGIN")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def where(*conditions: tuple[str, object]) -> tuple[str, list]:
    """" WHERE a = ? AND ..." and its arguments from (clause, value) pairs, skipping the pairs
    whose value is None (filters the caller did not ask for); "" when none is left."""
    kept = [(clause, value) for clause, value in conditions if value is not None]
    if not kept:
        return "", []
    return " WHERE " + " AND ".join(clause for clause, _ in kept), [value for _, value in kept]


class Db(ABC):
    """One store's SQL, whatever the backend (callers hold their own lock around it)."""

    greatest: str  # the two-argument maximum: SQLite MAX(a, b), PostgreSQL GREATEST(a, b)

    @abstractmethod
    def execute(self, sql: str, args: Sequence = ()):
        """Run one statement; the result has fetchone(), fetchall(), iteration and rowcount."""

    @abstractmethod
    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None: ...

    @abstractmethod
    def insert_id(self, sql: str, args: Sequence = ()) -> int:
        """Run an INSERT into a table with an `id` key made by the store; the new row's id."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Db]:
        """Everything inside commits together or not at all (rolled back on any error)."""

    @abstractmethod
    def create(self, ddl: str) -> None:
        """Create tables and indexes from SQLite-flavoured DDL (IF NOT EXISTS)."""

    @abstractmethod
    def close(self) -> None: ...


class SqliteDb(Db):
    greatest = "MAX"

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def execute(self, sql: str, args: Sequence = ()):
        return self.conn.execute(sql, args)

    def executemany(self, sql: str, rows: Sequence[Sequence]) -> None:
        self.conn.executemany(sql, rows)

    def insert_id(self, sql: str, args: Sequence = ()) -> int:
        return self.conn.execute(sql, args).lastrowid

    def transaction(self) -> AbstractContextManager[Db]:
        @contextmanager
        def block() -> Iterator[Db]:
            with transaction(self.conn):
                yield self
        return block()

    def create(self, ddl: str) -> None:
        self.conn.executescript(ddl)

    def close(self) -> None:
        self.conn.close()


class SideStore:
    """A store module with its own tables beside the panes (lag samples, Spark progress,
    alerts): its Db (a path opens a connection to that SQLite file), the lock that guards it,
    the schema, close()."""

    def __init__(self, target: str | Path | Db, schema: str, *, synchronous: str = "NORMAL",
                 busy_timeout_s: float = 30.0):
        if isinstance(target, Db):
            self._conn = target
        else:
            self.path = Path(target)
            self._conn = SqliteDb(open_connection(self.path, synchronous=synchronous, busy_timeout_s=busy_timeout_s))
        self._lock = threading.Lock()
        with self._lock:
            self._conn.create(schema)

    def add_column(self, table: str, column: str, ddl: str) -> None:
        """A column a table made by a version before lacks (CREATE TABLE IF NOT EXISTS kept it as it
        was), added in place: replicas of that version may still be using the table. Asked first:
        PostgreSQL's ALTER TABLE takes its exclusive lock before it finds the column there, and
        would queue every read and write behind another replica's long read. Call with the lock held."""
        if column in columns_of(self._conn, table):
            return
        if isinstance(self._conn, SqliteDb):
            try:
                self._conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {ddl}")
            except sqlite3.OperationalError as exc:  # another process added it meanwhile
                if "duplicate column" not in str(exc):
                    raise
        else:
            self._conn.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {ddl}")

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def columns_of(db: Db, table: str) -> list[str]:
    """A table's columns, in order, on either backend."""
    if isinstance(db, SqliteDb):
        return [row[1] for row in db.execute(f"PRAGMA main.table_info({table})").fetchall()]
    return [row[0] for row in db.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
        " AND table_name = ? ORDER BY ordinal_position", (table,)).fetchall()]
