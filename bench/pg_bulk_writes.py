"""A batch's window-join events and corrections written into PostgreSQL, row by row against in bulk
(issue 28, session 97).

    python -m bench.pg_bulk_writes [--lefts 300] [--rights 200] [--corrections 100] [--kept 50000] [--rounds 20]

Each micro-batch saves, in its store transaction, the window join's new and newly matched events
(store/joins.py `apply`) and the corrections of the final panes it changed. At the demo's whole
traffic (bench.freshness --mix: about 0.05 searches and 0.035 clicks a request, ~5 500-10 000
requests a batch at 15 000 a second) that is ~300 left and ~200 right events a batch, and ~70-100
corrections (mobile_app's late events; p90 ~200-260). Starts a PostgreSQL server as the tests do
(tests/postgres_server.py: no fsync), keeps `--kept` events of the join stored, then times each
write both ways, alternated `--rounds` times in one run, each round in a transaction rolled back
after it (every round writes into the same stored state):

- the join's events as an `executemany` (each row sent and bound on its own, as before session 97)
  against the store's COPY path (store/postgres/rows.py `upsert`);
- the corrections as an `INSERT ... RETURNING id` each (a round trip a correction, as before session
  97) against the store's ids-then-COPY (store/postgres/panes.py `_save_corrections`).

Prints the median and best time of each way. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from store import joins as join_store
from store.base import BatchCommit
from store.commit_plan import CorrectionRecord
from store.joins import JoinCommit, JoinEvent

T0 = 1_700_000_000_000
SUMMARY = {"count": 3, "values": {"latency_ms": {"n": 3, "sum": 61.5, "min": 12.0, "max": 30.5}},
           "distinct": {"u": 3.0}}


def events(count: int, first_offset: int, dims: tuple = ()) -> list[JoinEvent]:
    return [JoinEvent(T0 + i, i % 4, first_offset + i, f"s{first_offset + i}", dims) for i in range(count)]


def corrected_rows(count: int) -> list[tuple]:
    """pane_rows' rows (store/commit_plan.py) of `count` corrected panes: what the commit saves of them."""
    return [("mobile_app", T0 + i * 10_000, T0 + (i + 1) * 10_000, f'{{"screen":"s{i % 40}"}}', 3, "", 2, b"", 1,
             CorrectionRecord(1, 2, SUMMARY, SUMMARY)) for i in range(count)]


def one_insert_each(cur, corrected: list[tuple], commit: BatchCommit, now_ms: int) -> list[int]:
    """Session 96's way: an INSERT ... RETURNING id a correction."""
    from store.postgres.panes import _json

    return [cur.execute(
        "INSERT INTO corrections (stream, pane_start_ms, pane_end_ms, dims, revision_from, revision_to,"
        " pipeline, batch_id, events_added, at_ms, old, new)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
        (stream, start, end, key, c.revision_from, c.revision_to, commit.pipeline, commit.batch_id, added, now_ms,
         _json(c.old), _json(c.new))).fetchone()[0]
        for stream, start, end, key, _, _, _, _, added, c in corrected]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lefts", type=int, default=300)
    parser.add_argument("--rights", type=int, default=200)
    parser.add_argument("--corrections", type=int, default=100)
    parser.add_argument("--kept", type=int, default=50_000, help="events of each side stored before the rounds")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)

    from store.postgres import PostgresPaneStore
    from store.postgres import rows
    from store.postgres.panes import _save_corrections
    from tests.postgres_server import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        store = PostgresPaneStore(server.fresh_dsn(), pool_size=1)
        dims = ("books", "web")
        kept = JoinCommit("sc", T0, None, lefts=events(args.kept, 0, dims), rights=events(args.kept, 0))
        batch = JoinCommit("sc", T0 + 1, None, lefts=events(args.lefts, args.kept, dims),
                           rights=events(args.rights, args.kept))
        commit = BatchCommit("main", 1, [], 0, {}, {})
        corrected = corrected_rows(args.corrections)
        with store._pool.connection() as conn:
            rows.ensure_staging(conn)
            with conn.transaction(), conn.cursor() as cur:
                join_store.apply(cur, [kept], "%s")

            def bulk(table, columns, found):
                rows.upsert(conn, table, columns, join_store.EVENT_KEY, ("matched",), found)

            ways: dict[str, Callable] = {
                "join events, executemany": lambda cur: join_store.apply(cur, [batch], "%s"),
                "join events, COPY": lambda cur: join_store.apply(cur, [batch], "%s", upsert=bulk),
                "corrections, INSERT each": lambda cur: one_insert_each(cur, corrected, commit, T0),
                "corrections, ids and COPY": lambda cur: _save_corrections(conn, cur, corrected, commit, T0),
            }
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, write in ways.items():
                    rows.ensure_staging(conn)  # outside the transaction, as a commit does (vacuums the staging)
                    with conn.transaction(force_rollback=True), conn.cursor() as cur:
                        started = time.perf_counter()
                        write(cur)
                        times[name].append(time.perf_counter() - started)
        store.close()
    finally:
        server.stop()
    print(f"a batch of {args.lefts} left and {args.rights} right join events ({args.kept} of each kept) and"
          f" {args.corrections} corrections, {args.rounds} rounds:")
    for name, spent in times.items():
        print(f"  {name:>26}: median {statistics.median(spent) * 1000:6.2f} ms, best {min(spent) * 1000:6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
