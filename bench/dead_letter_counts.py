"""The dead_letters alert's count on a store keeping many dead letters (issue 28, session 89).

    python -m bench.dead_letter_counts [--kept 2000000] [--streams 8] [--repeat 5]

The dead_letters alert kind asks the store every evaluation (10 s by default) for the dead
letters of each stream in its window (store/dead_letter_counts.py), under the store's lock. At
20 000 events/s of the demo's traffic ~14 dead letters arrive a second, kept for their stream's
retention: millions. Builds a SQLite store keeping `--kept` dead letters over `--streams`
streams, spread over 8 days, then prints side by side the median time of `--repeat` counts over
the last 5 minutes: the query as it is (one index range per stream) and the one before session 89
(by time alone), run on the same store as the base.

Run it with nothing else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from store import SqlitePaneStore

T0 = 1_700_000_000_000
DAY, WINDOW = 86_400_000, 300_000
BY_TIME = "SELECT stream, COUNT(*) FROM dead_letters WHERE at_ms >= ? AND at_ms < ? GROUP BY stream"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kept", type=int, default=2_000_000)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    span = 8 * DAY
    with tempfile.TemporaryDirectory(prefix="sketchboard-dead-letters-") as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db", synchronous="OFF")
        conn = store._conn
        started = time.perf_counter()
        step = span // args.kept
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO dead_letters (pipeline, batch_id, stream, partition, \"offset\", reason, at_ms)"
            " VALUES ('main', 0, ?, 0, ?, 'future_skew', ?)",
            ((f"stream{i % args.streams}", i, T0 + i * step) for i in range(args.kept)))
        conn.execute("COMMIT")
        print(f"store: {args.kept:,} dead letters of {args.streams} streams over 8 days,"
              f" built in {time.perf_counter() - started:.0f} s", flush=True)
        end = T0 + args.kept * step  # just after the last
        for label, ask in (("by time alone (before)", lambda: dict(conn.execute(BY_TIME, (end - WINDOW, end)))),
                           ("per stream (now)", lambda: store.dead_letter_counts(end - WINDOW, end))):
            runs, counted = [], None
            for _ in range(args.repeat):
                started = time.perf_counter()
                counted = ask()
                runs.append((time.perf_counter() - started) * 1000)
            print(f"a count over the last 5 minutes, {label}: median {statistics.median(runs):.2f} ms"
                  f" ({', '.join(f'{ms:.2f}' for ms in runs)}); {sum(counted.values()):,} counted", flush=True)
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
