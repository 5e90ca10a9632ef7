"""Enrichment on the driver against a full table: a batch's keys looked up one by one in the kept
versions' dicts, against found all at once among the table's single-version keys kept as columns
(store.table_versions.SingleVersions), in one run.

    python -m bench.enrichment_lookup [--events 100000,500000] [--users 49500] [--repeat 7]

For each size, the side by side's `http_requests` events (bench.side_by_side: generated once,
seeded) are appended to a fresh embedded log as the ingest API appends them and read back as a
batch's source rows (ingest.spark_source.read_batch). The demo's `user_plans` view is looked up
(aggregates.enrichment_driver.enrich_table) with `--users` users in the `users` table (one version
each, as a demo table mostly holds) and a few plans, through `KeptVersions` as the pipeline keeps
them: `dicts` with every key fetched, `columns` with the single-version columns. The two alternate
`--repeat` times; each figure is the lookup's process CPU, and the columns' first lookup (which
makes them and their texts) is printed apart. The two answers are checked equal. Printed, never
asserted; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc

from aggregates.enrichment_driver import enrich_table, plan
from api.bodies import columnar_body
from bench.side_by_side import STREAM, generate
from catalog import load_catalog
from demo import DEFAULT_CONFIG
from ingest.json_limits import JsonLimits
from ingest.log.sqlite import SqliteEventLog
from ingest.spark_source import read_batch
from store.table_versions import KeptVersions, TableVersion

PLANS = ("free", "pro", "team", "enterprise", "student")


def batch_rows(catalog, events: int, folder: Path):
    """`events` of the side by side as a batch's source rows, read from a fresh log."""
    stream = catalog.stream(STREAM)
    log = SqliteEventLog(folder / f"log-{events}.db")
    try:
        log.ensure_topic(stream)
        for chunk in generate(events, 10_000):
            columns = columnar_body(stream, json.dumps(chunk).encode(), "application/json", JsonLimits())
            log.append_columns(stream, columns, 1_700_000_000_000)
        end = {stream.name: {p: o.end for p, o in log.offsets(stream.name).items()}}
        return read_batch(log, catalog, {stream.name: {p: 0 for p in end[stream.name]}}, end)
    finally:
        log.close()


def table_versions(users: int) -> dict[str, list[tuple[str, TableVersion]]]:
    """A `users` table of one version a user (the side by side's user ids) and its plans."""
    return {
        "users": [(f"u{i:05d}", TableVersion(0, 0, i, {"plan": PLANS[i % len(PLANS)], "country": ("DE", "FR", "US")[i % 3]}))
                  for i in range(users)],
        "plans": [(name, TableVersion(0, 0, i, {"tier": ("basic", "paid")[i % 2]})) for i, name in enumerate(PLANS)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", default="100000,500000", help="batch sizes (comma separated)")
    parser.add_argument("--users", type=int, default=49_500, help="users in the table (the demo's population)")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    catalog = load_catalog(DEFAULT_CONFIG)
    tables = {n: s for n, s in catalog.streams.items() if s.kind == "table"}
    streams = {n: s for n, s in catalog.streams.items() if s.kind != "table"}
    lookups = plan(catalog, streams, tables, [STREAM])
    stored = table_versions(args.users)
    print("| batch | distinct users | dicts | single-version columns | their first lookup |\n| --- | --- | --- | --- | --- |",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="sketchboard-enrichment-lookup-") as tmp:
        for events in (int(n) for n in args.events.split(",")):
            rows = batch_rows(catalog, events, Path(tmp))
            kept = KeptVersions(lambda table: stored.get(table, []), ["users", "plans"])
            kept.as_of_store(0)

            def fetch(table: str, keys: set[str]):
                return kept.with_batch(table, keys, ())

            def singles(table: str, asked: int):
                return kept.singles(table, asked=asked)

            def timed(way) -> tuple[float, tuple]:
                started = time.process_time()
                answer = enrich_table(rows, lookups, fetch, way)
                return time.process_time() - started, answer

            first, with_columns = timed(singles)
            _, with_dicts = timed(None)
            if not (with_columns[0].equals(with_dicts[0])
                    and all(with_columns[1][m].equals(with_dicts[1][m]) for m in with_dicts[1])):
                raise SystemExit("the two lookups gave different answers")
            times: dict[str, list[float]] = {"dicts": [], "columns": []}
            for round_ in range(args.repeat):
                for name, way in (("dicts", None), ("columns", singles))[::1 if round_ % 2 else -1]:
                    times[name].append(timed(way)[0])
            users = len(pc.unique(pc.list_element(rows["ids"].combine_chunks(), 0)))
            print(f"| {events:,} events | {users:,} | {statistics.median(times['dicts']) * 1e3:.1f} ms"
                  f" | {statistics.median(times['columns']) * 1e3:.1f} ms | {first * 1e3:.1f} ms |", flush=True)
    print(f"\n(medians of {args.repeat}, process CPU of enrich_table; {args.users:,} users in the table)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
