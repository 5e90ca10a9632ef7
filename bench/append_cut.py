"""Benchmark: what planning a batch cut at one append time costs (ingest/append_cut.py), next to the
fair plan alone, side by side in one run, on the embedded log.

    python -m bench.append_cut [--appends 2000] [--events-per-append 100] [--batch-records 25000] [--repeat 5]

One embedded log (a temporary SQLite file): a table `users` (1 partition) and `http_requests`
(4 partitions) enriched from it, filled by `--appends` appends of events (one segment per
partition each, as the ingest API writes them), a table change between every ten. Then the
embedded source plans the first batch of a pipeline from the log's start, the whole log its
backlog, `--repeat` times each way alternated: without the catalog's enrichment (the fair plan
alone) and with it (the cut: a binary search on the append time, each probe one indexed query per
partition), the search from all of time or from between the backlog's first and last append
times (what the source does). Prints the median milliseconds per plan, the probes and the load average;
asserts nothing. No Spark, no JVM: the planning runs where Spark's driver asks the source."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

CATALOG = {"streams": {
    "users": {"kind": "table", "key_field": "user_id", "dimensions": ["plan"], "partitions": 1},
    "http_requests": {"key_field": "user_id", "dimensions": ["method"], "partitions": 4,
                      "enrich": [{"table": "users", "by": "user_id", "columns": ["plan"]}]}}}


def fill(path: Path, appends: int, per_append: int) -> int:
    from catalog import Catalog
    from ingest.events import EventValidator
    from ingest.log import SqliteEventLog
    from ingest.tables import TableRowValidator

    catalog = Catalog(**CATALOG)
    users, requests = catalog.streams["users"], catalog.streams["http_requests"]
    log = SqliteEventLog(path)
    for s in (users, requests):
        log.ensure_topic(s)
    t0, validator, rows = 1_700_000_000_000, EventValidator(requests), TableRowValidator(users)
    records = 0
    for i in range(appends):
        at = t0 + i
        if i % 10 == 0:
            log.append(users, [rows.validate({"user_id": f"u{i % 500}", "plan": "pro"}, at)], at)
            records += 1
        log.append(requests, [validator.validate({"time": at, "user_id": f"u{(i * 7 + j) % 500}", "method": "GET"})
                              for j in range(per_append)], at)
        records += per_append
    log.close()
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.append_cut", description=__doc__.split("\n\n")[0])
    ap.add_argument("--appends", type=int, default=2_000)
    ap.add_argument("--events-per-append", type=int, default=100)
    ap.add_argument("--batch-records", type=int, default=25_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    from pyspark.sql.streaming.datasource import ReadMaxRows

    import ingest.append_cut as append_cut
    from catalog import Catalog
    from ingest.spark_source import SketchboardLogReader, source_options

    with tempfile.TemporaryDirectory(prefix="bench-append-cut-") as folder:
        path = Path(folder) / "log.db"
        records = fill(path, args.appends, args.events_per_append)
        plain = {"streams": {n: {k: v for k, v in s.items() if k != "enrich"} for n, s in CATALOG["streams"].items()}}
        readers = {way: SketchboardLogReader(source_options(path, Catalog(**c), args.batch_records, 250_000))
                   for way, c in (("fair", plain), ("cut, searched from all of time", CATALOG),
                                  ("cut", CATALOG))}
        probes = dict.fromkeys(readers, 0)
        original, bounds = append_cut.cut_end_offsets, append_cut.time_bounds
        way = ""

        def counted(ranges, end_at, max_rows, **kw):
            def counting(cut):
                probes[way] += 1
                return end_at(cut)

            return original(ranges, counting, max_rows, **kw)

        append_cut.cut_end_offsets = counted
        times: dict[str, list[float]] = {w: [] for w in readers}
        ends = {}
        try:
            for _ in range(args.repeat):
                for way, reader in readers.items():
                    # The search's start between the backlog's append times, or (its first way) none.
                    append_cut.time_bounds = (lambda *a: None) if way.startswith("cut,") else bounds
                    start = reader.initialOffset()
                    began = time.perf_counter()
                    ends[way] = reader.latestOffset(start, ReadMaxRows(args.batch_records))
                    times[way].append((time.perf_counter() - began) * 1000)
        finally:
            append_cut.cut_end_offsets, append_cut.time_bounds = original, bounds
            for reader in readers.values():
                reader.stop()
    print(f"log: {records} records in {args.appends} appends (users 1 partition, http_requests 4);"
          f" a batch of at most {args.batch_records} from the start")
    for way in readers:
        batch = sum(o for parts in ends[way].values() for o in parts.values())
        print(f"  {way}: {statistics.median(times[way]):.1f} ms per plan (median of {args.repeat}),"
              f" {probes[way] // args.repeat} probes of the log; batch {batch} records: {ends[way]}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
