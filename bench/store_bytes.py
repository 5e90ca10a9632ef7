"""Where the bytes of a day of data go: the store's tables and indexes (SQLite's dbstat), its
WAL, the log's segments, and the stored rows' parts (dimensions, stats, sketches). Prints
figures; asserts nothing.

    python -m bench.store_bytes                                   # 200 000 demo events over 24 h
    python -m bench.store_bytes --events 1000000 --batch 1000000 --log   # the backfill shape, log too

The store is filled as bench/day_of_data.py fills it (demo events aggregated into 10 s panes,
committed in batches of `--batch` events with the shipped tiers); `--log` also appends the
same number of demo events, spread over the same hours, to a fresh embedded log
(bench/throughput.py fill_log), so the data folder is measured whole: log + store."""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.day_of_data import STREAM, demo_partials
from catalog import load_catalog
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit, SqlitePaneStore
from store.tiers import catalog_layouts


def fill_store(root: Path, catalog, events: int, hours: float, batch: int, end_ms: int) -> tuple[int, int, float]:
    """A fresh SQLite store (synchronous=OFF, as the benches run it) with `events` demo events;
    returns (events, pane partials, commit CPU seconds)."""
    store = SqlitePaneStore(root / "store.db", synchronous="OFF")
    store.configure_tiers(catalog_layouts(catalog), now_ms=end_ms)
    done, partials_n, cpu_s = 0, 0, 0.0
    for batch_id, partials in enumerate(demo_partials(catalog, events, hours, end_ms, batch)):
        n = sum(p.data.count for p in partials)
        commit = BatchCommit("main", batch_id, partials, n, {STREAM: max(p.end_ms for p in partials) - 1}, {},
                             read_by_stream={STREAM: n})
        cpu = time.process_time()
        store.commit_batch(commit, lateness_ms={STREAM: 30_000}, now_ms=end_ms)
        cpu_s += time.process_time() - cpu
        done, partials_n = done + n, partials_n + len(partials)
    print("store files after the last batch, still open:", _sizes(root))
    store.commit_batch(BatchCommit("main", batch_id + 1, [], 0, {}, {}), lateness_ms={}, now_ms=end_ms)
    print("after one more (empty) batch:", _sizes(root))
    store.close()
    return done, partials_n, cpu_s


def _sizes(root: Path) -> str:
    return ", ".join(f"{f.name} {f.stat().st_size / 2**20:.1f} MiB" for f in sorted(root.glob("store.db*")))


def table_bytes(path: Path) -> list[tuple[str, int, int]]:
    """(table, bytes with its indexes, rows) for every table of an SQLite file, largest first."""
    conn = sqlite3.connect(path)
    owner = {name: table for name, table in conn.execute("SELECT name, tbl_name FROM sqlite_master")}
    sizes: dict[str, int] = {}
    for name, size in conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name"):
        table = owner.get(name, name)
        sizes[table] = sizes.get(table, 0) + size
    out = []
    for table, size in sizes.items():
        try:
            rows = conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0]
        except sqlite3.Error:
            rows = 0
        out.append((table, size, rows))
    conn.close()
    return sorted(out, key=lambda t: -t[1])


def index_bytes(path: Path) -> list[tuple[str, str, int]]:
    """(index, its table, bytes) of every index with pages of its own (a WITHOUT ROWID table's key is the table)."""
    conn = sqlite3.connect(path)
    found = conn.execute("SELECT m.name, m.tbl_name, SUM(d.pgsize) FROM sqlite_master m JOIN dbstat d"
                         " ON d.name = m.name WHERE m.type = 'index' GROUP BY m.name ORDER BY 3 DESC").fetchall()
    conn.close()
    return found


def column_bytes(path: Path, table: str) -> dict[str, float]:
    """Mean stored length of each column of `table` (text and blob: bytes; numbers: their text)."""
    conn = sqlite3.connect(path)
    columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    means = conn.execute(f"SELECT {', '.join(f'AVG(LENGTH({c}))' for c in columns)} FROM {table}").fetchone()
    conn.close()
    return {c: m or 0.0 for c, m in zip(columns, means)}


def files(root: Path) -> list[tuple[str, int]]:
    return sorted(((str(f.relative_to(root)), f.stat().st_size) for f in root.rglob("*") if f.is_file()),
                  key=lambda t: -t[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--batch", type=int, default=100_000, help="events per committed batch")
    ap.add_argument("--log", action="store_true", help="also fill an embedded log with as many events")
    ap.add_argument("--keep", help="fill this folder (kept) instead of a temporary one")
    args = ap.parse_args(argv)
    catalog = load_catalog(DEFAULT_STREAMS)
    end_ms = int(time.time() * 1000) // 60_000 * 60_000
    with tempfile.TemporaryDirectory(prefix="store-bytes-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        events, partials, cpu_s = fill_store(root, catalog, args.events, args.hours, args.batch, end_ms)
        print(f"{events:,} events -> {partials:,} pane partials in batches of {args.batch:,};"
              f" commit CPU {cpu_s:.1f} s = {events / cpu_s:,.0f} events per CPU-second")
        if args.log:
            from bench.throughput import fill_log
            from ingest.log.sqlite import SqliteEventLog

            log = SqliteEventLog(root / "log.db", synchronous="OFF")
            for stream in catalog.streams.values():
                log.ensure_topic(stream)
            fill_log(log, catalog, args.events, spread_hours=args.hours)
            log.close()
        store = root / "store.db"
        print("\n| table (with its indexes) | MiB | rows | bytes per event |\n| --- | --- | --- | --- |")
        for table, size, rows in table_bytes(store):
            if size >= 4096 * 4:
                print(f"| {table} | {size / 2**20:.1f} | {rows:,} | {size / events:.0f} |")
        print("\n| index | table | MiB |\n| --- | --- | --- |")
        for name, table, size in index_bytes(store):
            if size >= 4096 * 4:
                print(f"| {name} | {table} | {size / 2**20:.1f} |")
        for table in ("panes", "tier_rows", "changes"):
            means = column_bytes(store, table)
            print(f"\n{table}: mean stored length per column: "
                  + ", ".join(f"{c} {m:.1f}" for c, m in means.items()))
        total = 0
        print("\n| file | MiB | bytes per event |\n| --- | --- | --- |")
        for name, size in files(root):
            total += size
            print(f"| {name} | {size / 2**20:.1f} | {size / events:.0f} |")
        print(f"| data folder | {total / 2**20:.1f} | {total / events:.0f} |")


if __name__ == "__main__":
    main()
