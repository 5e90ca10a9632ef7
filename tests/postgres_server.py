"""A real PostgreSQL server for the tests: Debian's `postgresql` package (initdb, pg_ctl),
a cluster in a fresh temporary folder, listening on a free loopback port only, with the
durability settings off (fsync, synchronous_commit, full_page_writes: nothing a test
needs survives a power cut), stopped and removed at the end. The `postgres_server`
fixture in tests/conftest.py starts one per test session (~1 s: initdb dominates) and
each test gets its own schema (`fresh_dsn`), far cheaper than a database per test.

PostgreSQL refuses to run as root: when the suite runs as root (CI containers), initdb and
pg_ctl run as the `postgres` user the Debian package creates, through `runuser`, and the
folder is made theirs. Why Debian's package rather than the `pgserver` wheel: it is the
distribution's maintained build (security updates, `.ci/run` installs it with apt like the
JVM and Chromium), where the wheel's last release is from 2024."""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.procs import free_port

SUPERUSER = "postgres"


class PostgresMissing(RuntimeError):
    pass


def find_bindir() -> Path:
    """initdb/pg_ctl: $PG_BINDIR, else the newest /usr/lib/postgresql/<major>/bin (Debian keeps
    them off PATH), else PATH."""
    candidates = [os.environ.get("PG_BINDIR", "")]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if folder and (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    raise PostgresMissing("no PostgreSQL server binaries (initdb, pg_ctl): apt-get install postgresql,"
                          " or set PG_BINDIR")


class PostgresServer:
    def __init__(self, bindir: Path | None = None, *, logical: bool = False):
        self.bindir = bindir or find_bindir()
        # wal_level=logical (change data capture tests: replication slots, pgoutput); the default
        # `replica` writes less WAL, which the other tests do not need.
        self.logical = logical
        self.root = Path(tempfile.mkdtemp(prefix="sketchboard-pg-"))  # not under pytest's 0700 root-owned tmp
        self.data = self.root / "data"
        self.port = free_port()
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            # PostgreSQL will not run as root; the Debian package's `postgres` user runs it.
            owner = pwd.getpwnam(SUPERUSER)
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as_user = ["runuser", "-u", SUPERUSER, "--"]
        self._schemas = itertools.count()
        self._free: list[str] = []  # schemas given back by finished tests, wiped before reuse
        self.running = False

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                  "--no-sync", "--encoding=UTF8", "--locale=C")
        options = " ".join([
            "-c listen_addresses=127.0.0.1", f"-p {self.port}",
            "-c unix_socket_directories=''",  # TCP on loopback only: no socket in a shared folder
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off",  # tests need no durability
            "-c max_connections=200",
            # synchronous_commit on: logical decoding reads only flushed WAL, and a test that has
            # committed a change expects the slot to show it at once (off: up to wal_writer_delay later).
            *(["-c wal_level=logical -c max_replication_slots=20 -c max_wal_senders=20 -c synchronous_commit=on"]
              if self.logical else []),
        ])
        self._options = options
        self._pg_ctl_start()

    def _pg_ctl_start(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", self._options, "-w", "-t", "60", "start")
        self.running = True

    def restart(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: as a crash, no shutdown checkpoint; `fast`: a clean stop)
        and start it again on the same port and data: what a client sees as PostgreSQL restarting."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")
        self.running = False
        self._pg_ctl_start()

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={dbname}"

    LINGUISTIC_DB = "linguistic"

    def linguistic_database(self) -> str:
        """A database whose default collation is linguistic (ICU en-US: 'a' < 'B', punctuation
        skipped), as a deployment's database usually is (en_US.UTF-8): the cluster's own are
        initdb'd with the C locale, which orders text as the code points. Made on first use."""
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.LINGUISTIC_DB,)).fetchone() is None:
                conn.execute(f"CREATE DATABASE {self.LINGUISTIC_DB} TEMPLATE template0 ENCODING 'UTF8'"
                             " LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'")
        return self.LINGUISTIC_DB

    def fresh_dsn(self, dbname: str = "postgres") -> str:
        """A DSN whose tables land in an empty schema of its own (its search_path), in `dbname`.

        A schema given back (`give_back`) is reused with its tables emptied and their identity
        counters restarted: ~15 ms where creating the store's tables again costs ~130 ms, which
        matters to property tests that make a store per example."""
        import psycopg

        if dbname != "postgres":  # not reused (give_back keeps the default database's only)
            name = f"t{os.getpid()}_{next(self._schemas)}"
            with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
                conn.execute(f"CREATE SCHEMA {name}")
            return f"{self.dsn(dbname)} options='-c search_path={name}'"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            if self._free:
                name = self._free.pop()
                tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (name,))]
                identities = conn.execute(
                    "SELECT table_name, column_name FROM information_schema.columns"
                    " WHERE table_schema = %s AND is_identity = 'YES'", (name,)).fetchall()
                statements = [f"DELETE FROM {name}.{t}" for t in tables]
                statements += [f"ALTER TABLE {name}.{t} ALTER COLUMN {c} RESTART" for t, c in identities]
                if statements:
                    conn.execute("; ".join(statements))
            else:
                name = f"t{os.getpid()}_{next(self._schemas)}"
                conn.execute(f"CREATE SCHEMA {name}")
        return self._dsn_for(name)

    def _dsn_for(self, schema: str) -> str:
        return f"{self.dsn()} options='-c search_path={schema}'"

    def give_back(self, dsn: str) -> None:
        """A schema whose stores are all closed may be handed out again by fresh_dsn."""
        schema = dsn.rsplit("search_path=", 1)[1].rstrip("'")
        if self._dsn_for(schema) == dsn and schema not in self._free:
            self._free.append(schema)

    def stop(self) -> None:
        if self.running:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
            self.running = False
        shutil.rmtree(self.root, ignore_errors=True)
