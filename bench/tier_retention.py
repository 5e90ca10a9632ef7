"""A batch commit's tier retention on a store holding a day of minute rows (issue 28, session 89).

    python -m bench.tier_retention [--combos 140] [--hours 24] [--repeat 5]

Every batch's commit drops the tier rows its tiers no longer keep (store/tier_retention.py), in
the commit's write transaction. Builds a SQLite store keeping minute rows for a day under the
demo's http_requests layout shape: `--combos` rows of all dimensions and a total per minute over
`--hours`, each with ~3 KB of sketches (what a minute row of the demo holds). Then prints, side
by side in one run, the median time of `--repeat` drops with nothing to drop (every batch but the
first of a minute) and with one minute to drop (the first batch of each minute):

- the statement as it is (a range of the rows' key: stream, granule, projection, start);
- the statement before session 89 (by end time alone), run on the same store as the base.

Run it with nothing else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from store import SqlitePaneStore, tier_retention
from store.commit_plan import tier_horizons
from store.tiers import ALL_DIMS, TierLayout

T0 = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
LAYOUT = TierLayout(10_000, DAY, ((MINUTE, DAY), (HOUR, 90 * DAY)), ("",))


def by_end_time(conn, stream: str, layout: TierLayout, batch_now_ms: int) -> None:
    """The statement before session 89: the base."""
    for granule, horizon in tier_horizons(layout, batch_now_ms):
        conn.execute("DELETE FROM tier_rows WHERE stream = ? AND granule_ms = ? AND end_ms <= ?",
                     (stream, granule, horizon))


def as_kept(conn, stream: str, layout: TierLayout, batch_now_ms: int) -> None:
    tier_retention.drop_expired(conn, "?", stream, layout, batch_now_ms)


def timed(conn, drop, now_ms: int) -> float:
    """One drop inside a transaction rolled back, so that every run sees the same store."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        started = time.perf_counter()
        drop(conn, "s", LAYOUT, now_ms)
        return (time.perf_counter() - started) * 1000
    finally:
        conn.execute("ROLLBACK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--combos", type=int, default=140, help="all-dimension rows a minute")
    parser.add_argument("--hours", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sketchboard-tier-retention-") as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db", synchronous="OFF")
        store.configure_tiers({"s": LAYOUT}, now_ms=T0)
        conn = store._conn  # the store's own connection: the commit runs the drop on it
        started = time.perf_counter()
        minutes = args.hours * 60
        for m in range(minutes):
            conn.execute("BEGIN")
            conn.executemany(
                "INSERT INTO tier_rows (stream, granule_ms, proj, start_ms, dims_id, end_ms, count, stats, revision,"
                " updated_at_ms, last_batch, sketches) VALUES ('s', ?, ?, ?, ?, ?, 1, '{}', 0, 0, 0, zeroblob(3000))",
                [(MINUTE, proj, T0 + m * MINUTE, dims, T0 + (m + 1) * MINUTE)
                 for proj, combos in ((ALL_DIMS, args.combos), ("", 1)) for dims in range(combos)])
            conn.execute("COMMIT")
        rows = conn.execute("SELECT COUNT(*) FROM tier_rows").fetchone()[0]
        print(f"store: {rows:,} minute rows over {args.hours} h ({args.combos} combinations + the total a minute),"
              f" built in {time.perf_counter() - started:.0f} s", flush=True)
        cases = (("nothing to drop", T0 + DAY), ("one minute to drop", T0 + DAY + MINUTE))
        for name, now in cases:
            for label, drop in (("by end time (before)", by_end_time), ("by start range (now)", as_kept)):
                runs = [timed(conn, drop, now) for _ in range(args.repeat)]
                print(f"{name:>18}, {label}: median {statistics.median(runs):.2f} ms"
                      f" ({', '.join(f'{ms:.2f}' for ms in runs)})", flush=True)
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
