"""The embedded log's appends and reads with SQLite pages of several sizes (issue 28, session 74).

    python -m bench.log_pages [--events 2000000] [--per-append 10000,100] [--pages 4096,16384,65536]
                              [--repeat 2]

The side by side's `http_requests` events (bench/side_by_side.py, generated once, seeded) are
parsed as the ingest API parses them (ingest/columnar.py) into one table per `--per-append` size;
then, for each page size in turn (`--repeat` rounds, the sizes alternated within a round), a fresh
log file made with that page size (SQLite fixes it when the file is made; `SqliteEventLog` keeps
a file's own) gets the events appended as the API appends them (`append_columns`, one append per
request of that size; at most 2 000 appends, so the small sizes append fewer events) and read back
whole, partition by partition. Prints the process CPU of the appends and of the read, per page
size. Run it with nothing else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.side_by_side import STREAM, generate
from catalog import load_catalog
from demo import DEFAULT_CONFIG
from ingest.columnar import columnar_events
from ingest.log import SqliteEventLog

MAX_APPENDS = 2_000


def made_with_pages(path: Path, page_size: int) -> Path:
    """An empty WAL database file with `page_size` pages, for the log to open and keep."""
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE made_with_pages (page_size INTEGER)")
    return path


def one_run(folder: Path, page_size: int, stream, table, appends: int) -> tuple[float, float, int]:
    """(CPU seconds of the appends, of the read, rows read) on a fresh log of `page_size` pages."""
    path = made_with_pages(folder / f"log-{page_size}-{time.monotonic_ns()}.db", page_size)
    log = SqliteEventLog(path)
    try:
        log.ensure_topic(stream)
        started = time.process_time()
        for i in range(appends):
            log.append_columns(stream, table, 1_700_000_000_000 + i)
        appended = time.process_time() - started
        started, rows = time.process_time(), 0
        for partition, offsets in log.offsets(stream.name).items():
            rows += sum(batch.num_rows for batch in log.read(stream, partition, offsets.start, offsets.end))
        return appended, time.process_time() - started, rows
    finally:
        log.close()
        for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            leftover.unlink(missing_ok=True)  # ~90 MB a run: not kept on disk and in the cache while the next is timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--per-append", default="10000,100", help="events per append (comma separated)")
    parser.add_argument("--pages", default="4096,16384,65536", help="page sizes to compare (comma separated)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    stream = load_catalog(DEFAULT_CONFIG).streams[STREAM]
    pages = [int(p) for p in args.pages.split(",")]
    with tempfile.TemporaryDirectory(prefix="sketchboard-log-pages-") as tmp:
        for per_append in (int(n) for n in args.per_append.split(",")):
            appends = min(MAX_APPENDS, max(1, args.events // per_append))
            body = json.dumps(generate(per_append, per_append)[0], separators=(",", ":")).encode()
            table = columnar_events(stream, body, ndjson=False)
            if table is None:
                raise SystemExit("the generated events did not take the columnar path")
            print(f"{appends:,} appends of {per_append:,} events ({appends * per_append:,} events):", flush=True)
            for round_ in range(args.repeat):
                for page_size in pages if round_ % 2 == 0 else pages[::-1]:  # no size always first
                    appended, read, rows = one_run(Path(tmp), page_size, stream, table, appends)
                    if rows != appends * per_append:
                        raise SystemExit(f"read {rows:,} of {appends * per_append:,} events")
                    print(f"  round {round_ + 1}, pages of {page_size:>6,} bytes: appends {appended:.2f} s CPU,"
                          f" read {read:.2f} s CPU", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
