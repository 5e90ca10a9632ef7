"""The embedded log's retention pass on a log of many segments (issue 28, session 88).

    python -m bench.log_retention [--segments 60000] [--partitions 4] [--repeat 5]

The API process runs one pass a minute (sketchboard/retention.py) under the log's lock and its write
transaction, so every append waits for it. At 20 000 events/s the log holds ~60 000 segments of ~250
events (~11 KB each) after ~15 minutes, and the shipped cap (1 GiB a partition) ~6 times that.

Builds such a log: 1 000 of the side by side's `http_requests` events appended once as the API
appends them, then their segments written again and again (one transaction per `--partitions`
segments x 100) up to `--segments`. Then prints the median time of `--repeat` passes:

- with nothing to drop (the age and size limits far away: every pass until the log is full);
- at the cap: each pass's size limit ~100 segments under what the largest partition keeps (about a
  minute of 20 000 events/s), so each pass drops that much (every pass once the log is full);
- a log made before the partitions' weight (the column dropped, where there is one): the first pass
  weighs it once.

Run it with nothing else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from bench.side_by_side import STREAM, generate
from catalog import load_catalog
from demo import DEFAULT_CONFIG
from ingest.columnar import columnar_events
from ingest.log import SqliteEventLog

T0 = 1_700_000_000_000
DAY_MS = 86_400_000


def build(path: Path, stream, segments: int) -> None:
    log = SqliteEventLog(path, synchronous="OFF")
    log.ensure_topic(stream)
    body = json.dumps(generate(1_000, 1_000)[0], separators=(",", ":")).encode()
    log.append_columns(stream, columnar_events(stream, body, ndjson=False), T0)
    log.close()
    with sqlite3.connect(path) as conn:
        parts = {p: (count, data) for p, count, data in conn.execute(
            "SELECT partition, record_count, data FROM segments ORDER BY base_offset DESC")}
    log = SqliteEventLog(path, synchronous="OFF")
    written, i = len(parts), 0
    while written < segments:
        i += 1
        # The same segments again (their records keep their first append time inside: retention
        # reads only the segments' rows, never their records).
        log._append_encoded(stream, {p: [seg] * 100 for p, seg in parts.items()}, T0 + i)
        written += 100 * len(parts)
    log.close()


def timed(log: SqliteEventLog, now_ms: int, max_bytes: int) -> tuple[float, int]:
    started = time.perf_counter()
    dropped = log.apply_retention(now_ms, 7 * DAY_MS, max_bytes)
    return (time.perf_counter() - started) * 1000, dropped


def kept_bytes(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT MAX(total) FROM (SELECT SUM(bytes) AS total FROM segments"
                            " GROUP BY stream, partition)").fetchone()[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=60_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    stream = load_catalog(DEFAULT_CONFIG).streams[STREAM].model_copy(update={"partitions": args.partitions})
    with tempfile.TemporaryDirectory(prefix="sketchboard-log-retention-") as tmp:
        path = Path(tmp) / "log.db"
        started = time.perf_counter()
        build(path, stream, args.segments)
        with sqlite3.connect(path) as conn:
            count, size = conn.execute("SELECT COUNT(*), SUM(bytes) FROM segments").fetchone()
        print(f"log: {count:,} segments, {size / 2**20:,.0f} MiB in {args.partitions} partitions"
              f" (built in {time.perf_counter() - started:.0f} s)", flush=True)
        log = SqliteEventLog(path)
        now = T0 + 10**6
        idle = [timed(log, now, 1 << 40)[0] for _ in range(args.repeat)]
        print(f"a pass with nothing to drop: median {statistics.median(idle):.1f} ms"
              f" ({', '.join(f'{ms:.1f}' for ms in idle)})", flush=True)
        at_cap, dropped = [], []
        for _ in range(args.repeat):
            ms, n = timed(log, now, kept_bytes(path) - 100 * size // count)  # ~100 segments of the largest
            at_cap.append(ms)
            dropped.append(n)
        print(f"a pass at the cap ({statistics.median(dropped):,.0f} events dropped):"
              f" median {statistics.median(at_cap):.1f} ms ({', '.join(f'{ms:.1f}' for ms in at_cap)})", flush=True)
        log.close()
        with sqlite3.connect(path) as conn:
            weighed = "bytes" in {row[1] for row in conn.execute("PRAGMA table_info(partitions)")}
            if weighed:
                conn.execute("ALTER TABLE partitions DROP COLUMN bytes")
        if weighed:
            log = SqliteEventLog(path)
            first, second = timed(log, now, 1 << 40)[0], timed(log, now, 1 << 40)[0]
            print(f"a log made before the weight: first pass {first:.1f} ms (weighs it), then {second:.1f} ms",
                  flush=True)
            log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
