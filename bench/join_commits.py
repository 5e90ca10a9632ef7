"""A batch's window-join events written into PostgreSQL, both ways side by side (issue 28, session 97).

    python -m bench.join_commits [--lefts 300] [--rights 200] [--kept 50000] [--rounds 20]

Each micro-batch saves the join's new and newly matched events (store/joins.py `apply`) in its
store transaction. At the demo's mix of traffic (bench.freshness --mix: about 0.05 searches and
0.035 clicks a request, ~5 500 requests a batch at 15 000 a second) that is ~300 left and ~200 right
events a batch. Starts a PostgreSQL server as the tests do (tests/postgres_server.py: no fsync),
keeps `--kept` events of the join stored, then times `apply` of a batch's events, alternated
`--rounds` times in one run: as an `executemany` (each row sent and bound on its own, as before
session 97) and through the store's COPY path (store/postgres/rows.py `upsert`). Each round runs in
a transaction rolled back after it, so every round writes into the same stored state. Prints the
median and best time of each way.

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from store import joins as join_store
from store.joins import JoinCommit, JoinEvent

T0 = 1_700_000_000_000


def events(count: int, first_offset: int, dims: tuple = ()) -> list[JoinEvent]:
    return [JoinEvent(T0 + i, i % 4, first_offset + i, f"s{first_offset + i}", dims) for i in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lefts", type=int, default=300)
    parser.add_argument("--rights", type=int, default=200)
    parser.add_argument("--kept", type=int, default=50_000, help="events of each side stored before the rounds")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args(argv)

    from store.postgres import PostgresPaneStore
    from store.postgres import rows
    from tests.postgres_server import PostgresServer

    server = PostgresServer()
    server.start()
    try:
        store = PostgresPaneStore(server.fresh_dsn(), pool_size=1)
        dims = ("books", "web")
        kept = JoinCommit("sc", T0, None, lefts=events(args.kept, 0, dims), rights=events(args.kept, 0))
        batch = JoinCommit("sc", T0 + 1, None, lefts=events(args.lefts, args.kept, dims),
                           rights=events(args.rights, args.kept))
        with store._pool.connection() as conn:
            rows.ensure_staging(conn)
            with conn.transaction(), conn.cursor() as cur:
                join_store.apply(cur, [kept], "%s")

            def bulk(table, columns, found):
                rows.upsert(conn, table, columns, join_store.EVENT_KEY, ("matched",), found)

            ways = {"executemany": None, "COPY": bulk}
            times: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, upsert in ways.items():
                    rows.ensure_staging(conn)  # outside the transaction, as a commit does (vacuums the staging)
                    with conn.transaction(force_rollback=True), conn.cursor() as cur:
                        started = time.perf_counter()
                        join_store.apply(cur, [batch], "%s", upsert=upsert)
                        times[name].append(time.perf_counter() - started)
        store.close()
    finally:
        server.stop()
    print(f"{args.lefts} left and {args.rights} right events a batch, {args.kept} of each kept, {args.rounds} rounds:")
    for name, spent in times.items():
        print(f"  {name:>12}: median {statistics.median(spent) * 1000:6.2f} ms, best {min(spent) * 1000:6.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
