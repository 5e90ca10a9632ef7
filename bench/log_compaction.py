"""The embedded log's compaction pass over a changelog table with a long history (issue 28, session 89).

    python -m bench.log_compaction [--keys 100000] [--appends 1000] [--rows 200] [--repeat 5]

The API process runs one pass a minute over every table partition (sketchboard/retention.py,
ingest/log/sqlite_compaction.py). Builds the demo's `users` table (config/streams.yaml) from
`--appends` appends of `--rows` upserts each, of keys drawn from `--keys` (a few tombstones among
them), then prints the time of:

- the first pass, which drops the superseded rows;
- `--repeat` passes with nothing new (median): every pass of a table nobody writes to;
- a pass after one more append of `--rows` rows to the table (it has something to drop again).

Run it with nothing else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from catalog import load_catalog
from demo import DEFAULT_CONFIG
from ingest.log import SqliteEventLog
from ingest.tables import TableRowValidator, tombstone

T0 = 1_700_000_000_000
PLANS = ("free", "team", "business", "enterprise")


def append_rows(log: SqliteEventLog, stream, validator: TableRowValidator, rng: random.Random, keys: int,
                rows: int, at_ms: int) -> None:
    batch = []
    for _ in range(rows):
        key = f"u{rng.randrange(keys)}"
        if rng.random() < 0.01:
            batch.append(tombstone(stream, key, at_ms))
        else:
            batch.append(validator.validate({"user_id": key, "plan": rng.choice(PLANS), "country": "de"}, at_ms))
    log.append(stream, batch, at_ms)


def timed(log: SqliteEventLog, now_ms: int) -> tuple[float, int]:
    started = time.perf_counter()
    dropped = log.compact(now_ms)
    return (time.perf_counter() - started) * 1000, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--appends", type=int, default=1_000)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    stream = load_catalog(DEFAULT_CONFIG).streams["users"]
    validator, rng = TableRowValidator(stream), random.Random(89)
    with tempfile.TemporaryDirectory(prefix="sketchboard-log-compaction-") as tmp:
        path = Path(tmp) / "log.db"
        log = SqliteEventLog(path, synchronous="OFF")
        log.ensure_topic(stream)
        started = time.perf_counter()
        for i in range(args.appends):
            append_rows(log, stream, validator, rng, args.keys, args.rows, T0 + i)
        print(f"table: {args.appends * args.rows:,} changes of {args.keys:,} keys in {stream.partitions}"
              f" partitions (built in {time.perf_counter() - started:.0f} s)", flush=True)
        now = T0 + args.appends  # tombstones younger than their retention: kept, as in the first hour
        ms, dropped = timed(log, now)
        with sqlite3.connect(path) as conn:
            segments, records = conn.execute("SELECT COUNT(*), SUM(record_count) FROM segments").fetchone()
        print(f"first pass: {ms:.1f} ms, {dropped:,} superseded changes dropped ({segments:,} segments left)",
              flush=True)
        idle = [timed(log, now)[0] for _ in range(args.repeat)]
        print(f"a pass with nothing new: median {statistics.median(idle):.1f} ms"
              f" ({', '.join(f'{ms:.1f}' for ms in idle)})", flush=True)
        # Each case on its own copy of the table: one append, then one pass.
        snapshot = Path(tmp) / "snapshot.db"
        with sqlite3.connect(path) as conn:
            conn.execute("VACUUM INTO ?", (str(snapshot),))
        for case in ("reading every segment (before session 90)", "reading what was appended since"):
            copy = Path(tmp) / "copy.db"
            copy.write_bytes(snapshot.read_bytes())
            other = SqliteEventLog(copy, synchronous="OFF")
            if case.startswith("reading what"):  # the state the first pass left, as a running API process has it
                other.compact(now)
            append_rows(other, stream, validator, random.Random(90), args.keys, args.rows, now)
            ms, dropped = timed(other, now)
            print(f"a pass after one append of {args.rows} rows, {case}: {ms:.1f} ms, {dropped:,} dropped",
                  flush=True)
            other.close()
            copy.unlink()
        log.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
