"""Benchmark: Spark's sketch aggregation beside the Arrow group-by on the executors, same rows.

    python -m bench.arrow_partials [--events 300000] [--shapes day,minutes] [--repeats 2]

Issue 27's backfill spent its batch in the pipeline's partial aggregation (docs/benchmarks.md,
"The day-of-data backfill through Spark"): when a batch's events spread over a day, nearly every
event is a (pane, dimensions) group of its own, and Spark's object aggregates (a KLL or HLL
object per group, serialized for the shuffle and merged after it) cost ~80-100 us per group. This
times the pipeline's two paths (`PipelineConfig.partials`) on the same rows of the source's schema
for the shipped `http_requests` stream: `aggregates.partials.partial_aggregates` (Spark's groupBy,
collected) and `arrow_partial_aggregates` (the rows hashed by (stream, pane) to the executors, then
aggregates/arrow_partials.py's numpy group-by per partition, collected as Arrow).

Two shapes of synthetic rows (4 dimensions of 12 x 4 x 2 x 5 values, the stream's value fields, one
distinct field of 5 000 users, a few dead letters): `day`, event times spread over 24 h (a
backfill: ~1 group per event), and `minutes`, spread over 2 minutes (a live batch: few groups,
many events each). Both paths must find the same groups with the same counts and n/min/max
(checked); the time is the Spark job's wall time, collect/toArrow included, alternated. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import time

SPANS_MS = {"day": 86_400_000, "minutes": 120_000}
TITLES = {"spark": "Spark groupBy + collect", "rows": "rows shuffled, mapInArrow, toArrow",
          "shuffle": "map-side mapInArrow, partials shuffled + merged, toArrow",
          "driver": "map-side mapInArrow, toArrow, merged on the driver"}


def rows(stream, n: int, span_ms: int, seed: int = 1) -> list[tuple]:
    """Source rows (ingest.source_rows.SPARK_SCHEMA) of `stream`; one in 1 000 too old (a dead letter)."""
    rng = random.Random(seed)
    end = int(time.time() * 1000)
    out = []
    for i in range(n):
        t = end - span_ms + i * span_ms // n if i % 1000 else end - 400 * 86_400_000
        dims = [f"e{rng.randrange(12)}", f"r{rng.randrange(4)}", rng.choice("GP"), str(rng.randrange(5))]
        vals = [rng.random() * 100 if j == 0 else rng.random() * 1e4 for j in range(len(stream.values))]
        ids = [f"u{rng.randrange(5000)}" for _ in stream.distinct_fields]
        out.append((stream.name, i % stream.partitions, i, t, end, dims[:len(stream.dimensions)], vals, ids, None,
                    None, None, None))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arrow_partials", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--shapes", default="day,minutes")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--paths", default="spark,rows,shuffle,driver",
                        help="spark: Spark's groupBy; rows: every row shuffled, then the Arrow group-by; shuffle:"
                             " the Arrow group-by on the map side, its partials shuffled and merged; driver: the"
                             " same partials merged on the driver after toArrow")
    parser.add_argument("--partitions", type=int, default=6, help="input partitions (a batch's log slices)")
    args = parser.parse_args(argv)

    from aggregates.partials import arrow_partials_table, partial_aggregates
    from aggregates.spark import build_spark
    from catalog import load_catalog
    from ingest.source_rows import SPARK_SCHEMA
    from sketchboard.settings import DEFAULT_STREAMS

    catalog = load_catalog(DEFAULT_STREAMS)
    stream = catalog.streams["http_requests"]
    spark = build_spark("local[2]")
    paths = args.paths.split(",")
    print(f"{args.events:,} rows per shape in {args.partitions} input partitions; seconds per pass (min of"
          f" {args.repeats}, alternated); load average {os.getloadavg()[0]:.1f} at start:")
    print("| shape | groups | " + " | ".join(TITLES[p] for p in paths) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in paths) + " |")
    try:
        for shape in args.shapes.split(","):
            df = spark.createDataFrame(rows(stream, args.events, SPANS_MS[shape]), SPARK_SCHEMA) \
                .repartition(args.partitions).cache()
            df.count()
            now = int(time.time() * 1000)
            times: dict[str, list[float]] = {p: [] for p in paths}
            found: dict[str, list] = {}

            def key(r: dict) -> tuple:
                return (r["dead_reason"] or "", r["pane_start"] or 0, tuple(r["dims"] or ()), r["count"], r["n_0"],
                        r["min_0"], r["max_0"], len(r["dead_records"]))

            def run(path: str):  # what the pipeline runs: the job and its collect (the driver's reading is apart)
                if path == "spark":
                    return partial_aggregates(df, catalog, batch_now_ms=now).collect()
                return arrow_partials_table(df, catalog, batch_now_ms=now, merge=path)

            for i in range(args.repeats):  # alternated, so load swings hit all
                for path in paths if i % 2 == 0 else paths[::-1]:
                    started = time.perf_counter()
                    result = run(path)
                    times[path].append(time.perf_counter() - started)
                    found[path] = sorted(map(key, [r.asDict() for r in result] if path == "spark"
                                             else result.to_pylist()))
            same = "same groups and stats" if all(f == found[paths[0]] for f in found.values()) else "GROUPS DIFFER"
            cells = " | ".join(f"{min(times[p]):.2f}" for p in paths)
            print(f"| {shape} | {len(found[paths[0]]):,} ({same}) | {cells} |", flush=True)
            df.unpersist()
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
