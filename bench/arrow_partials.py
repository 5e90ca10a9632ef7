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
import random
import time

SPANS_MS = {"day": 86_400_000, "minutes": 120_000}


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
    args = parser.parse_args(argv)

    from aggregates.partials import arrow_partial_aggregates, partial_aggregates
    from aggregates.spark import build_spark
    from catalog import load_catalog
    from ingest.source_rows import SPARK_SCHEMA
    from sketchboard.settings import DEFAULT_STREAMS

    catalog = load_catalog(DEFAULT_STREAMS)
    stream = catalog.streams["http_requests"]
    spark = build_spark("local[2]")
    print(f"{args.events:,} rows per shape; seconds per pass (min of {args.repeats}, alternated):")
    print("| shape | groups | Spark groupBy (KLL/HLL aggregates) + collect | repartition + mapInArrow + toArrow | ratio |")
    print("| --- | --- | --- | --- | --- |")
    try:
        for shape in args.shapes.split(","):
            df = spark.createDataFrame(rows(stream, args.events, SPANS_MS[shape]), SPARK_SCHEMA).cache()
            df.count()
            now = int(time.time() * 1000)
            times: dict[str, list[float]] = {"spark": [], "arrow": []}
            found: dict[str, list] = {}

            def key(r: dict) -> tuple:
                return (r["dead_reason"] or "", r["pane_start"] or 0, tuple(r["dims"] or ()), r["count"], r["n_0"],
                        r["min_0"], r["max_0"])

            passes = {  # what the pipeline runs: the job and its collect (the driver's reading is apart)
                "spark": lambda: partial_aggregates(df, catalog, batch_now_ms=now).collect(),
                "arrow": lambda: arrow_partial_aggregates(df, catalog, batch_now_ms=now).toArrow(),
            }
            for i in range(args.repeats):  # alternated, so load swings hit both
                for name in ("spark", "arrow") if i % 2 == 0 else ("arrow", "spark"):
                    started = time.perf_counter()
                    result = passes[name]()
                    times[name].append(time.perf_counter() - started)
                    found[name] = sorted(map(key, [r.asDict() for r in result] if name == "spark"
                                             else result.to_pylist()))
            same = "same groups and stats" if found["spark"] == found["arrow"] else "GROUPS DIFFER"
            s, a = min(times["spark"]), min(times["arrow"])
            print(f"| {shape} | {len(found['spark']):,} ({same}) | {s:.2f} | {a:.2f} | {s / a:.1f}x |", flush=True)
            df.unpersist()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
