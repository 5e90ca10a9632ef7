"""A batch commit's tier retention on a store holding days of the demo's tier rows (issue 28, session 89).

    python -m bench.tier_retention [--days 1] [--repeat 5]
    python -m bench.tier_retention --days 8    # the minute rows' retention: the steady state
    python -m bench.tier_retention --store postgres   # on a throwaway local PostgreSQL server

Every batch's commit drops the tier rows its tiers no longer keep (store/tier_retention.py), in
the commit's write transaction. Builds a SQLite store holding `--days` (each tier at most its own
retention) of the shipped `http_requests` layout (config/streams.yaml: the pane-granule total,
minute rows of the group-bys kept 8 days, hour rows of all dimensions and the group-bys kept 90
days), each tier and projection with as many rows a granule as the demo's traffic has distinct
values of it (counted on 20 000 generated events), each row with ~3 KB of sketches. Then prints,
side by side in one run, the median time of `--repeat` drops with nothing to drop (what most
batches find):

- the statement as it is (a range of the rows' key: stream, granule, projection, start);
- the statement before session 89 (by end time alone), run on the same store as the base.

`--store postgres` runs it on the PostgreSQL store, on a throwaway local server started as the
tests start theirs (tests/postgres_server.py), the sketches random bytes (PostgreSQL compresses
what it keeps out of line: zeros would weigh nothing).

Run it with nothing else on the machine; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from catalog import load_catalog
from demo import DEFAULT_CONFIG, DemoTraffic
from store import SqlitePaneStore, tier_retention
from store.commit_plan import tier_horizons
from store.tiers import TierLayout, layout_for, project

STREAM = "http_requests"
NOW = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
DAY = 86_400_000


def by_end_time(conn, p: str, stream: str, layout: TierLayout, batch_now_ms: int) -> None:
    """The statement before session 89: the base."""
    for granule, horizon in tier_horizons(layout, batch_now_ms):
        conn.execute(f"DELETE FROM tier_rows WHERE stream = {p} AND granule_ms = {p} AND end_ms <= {p}",
                     (stream, granule, horizon))


def timed(conn, p: str, layout: TierLayout, drop, now_ms: int) -> float:
    """One drop inside a transaction rolled back, so that every run sees the same store."""
    conn.execute("BEGIN")
    try:
        started = time.perf_counter()
        drop(conn, p, STREAM, layout, now_ms)
        return (time.perf_counter() - started) * 1000
    finally:
        conn.execute("ROLLBACK")


def fill(conn, p: str, layout: TierLayout, rows_a_granule: dict[str, int], days: float, sketch) -> list[str]:
    """Each tier's rows over `days` (at most its retention) up to NOW; what was written, per tier."""
    built = []
    for tier in layout.tiers():
        starts = range(NOW - min(tier.keep_ms, int(days * DAY)), NOW, tier.granule_ms)
        conn.execute("BEGIN")
        conn.cursor().executemany(
            "INSERT INTO tier_rows (stream, granule_ms, proj, start_ms, dims_id, end_ms, count, stats, revision,"
            f" updated_at_ms, last_batch, sketches) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, 1, '{{}}', 0, 0, 0, {p})",
            [(STREAM, tier.granule_ms, tier.proj, start, dims, start + tier.granule_ms, sketch())
             for start in starts for dims in range(rows_a_granule[tier.proj])])
        conn.execute("COMMIT")
        rows = len(starts) * rows_a_granule[tier.proj]
        built.append(f"{tier.granule_ms // 1000} s x {tier.proj or 'total'}: {rows:,}")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args(argv)
    catalog = load_catalog(DEFAULT_CONFIG)
    stream = catalog.streams[STREAM]
    layout = layout_for(stream)
    sample = DemoTraffic(catalog, seed=89).generate_stream(STREAM, 20_000)
    rows_a_granule = {t.proj: len({tuple(sorted(project({d: str(e.get(d, "")) for d in stream.dimensions},
                                                         t.proj).items())) for e in sample})
                      for t in layout.tiers()}
    server = None
    with tempfile.TemporaryDirectory(prefix="sketchboard-tier-retention-") as tmp:
        if args.store == "postgres":
            import psycopg

            from store.postgres import PostgresPaneStore
            from tests.postgres_server import PostgresServer

            server = PostgresServer()
            server.start()
            dsn = server.fresh_dsn()
            store = PostgresPaneStore(dsn)
            conn, p = psycopg.connect(dsn, autocommit=True), "%s"  # explicit BEGIN and ROLLBACK below
            sketch = lambda: os.urandom(3000)  # noqa: E731
        else:
            store = SqlitePaneStore(Path(tmp) / "store.db", synchronous="OFF")
            conn, p = store._conn, "?"  # the store's own connection: the commit runs the drop on it
            sketch = lambda: bytes(3000)  # noqa: E731
        try:
            store.configure_tiers({STREAM: layout}, now_ms=NOW)
            started = time.perf_counter()
            built = fill(conn, p, layout, rows_a_granule, args.days, sketch)
            rows = conn.execute("SELECT COUNT(*) FROM tier_rows").fetchone()[0]
            print(f"{args.store} store: {rows:,} tier rows of {args.days:g} days ({'; '.join(built)}),"
                  f" built in {time.perf_counter() - started:.0f} s", flush=True)
            # Each tier's oldest row ends a granule after NOW - span: at NOW nothing is past its
            # retention, as for every batch between two granules' ends (dropping a granule's rows
            # adds their own deletes to both statements alike).
            for label, drop in (("by end time (before)", by_end_time),
                                ("by start range (now)", tier_retention.drop_expired)):
                runs = [timed(conn, p, layout, drop, NOW) for _ in range(args.repeat)]
                print(f"a commit's tier retention, nothing to drop, {label}: median {statistics.median(runs):.2f} ms"
                      f" ({', '.join(f'{ms:.2f}' for ms in runs)})", flush=True)
        finally:
            if args.store == "postgres":
                conn.close()
            store.close()
            if server is not None:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
