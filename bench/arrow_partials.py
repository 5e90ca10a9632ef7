"""Benchmark: Spark's sketch aggregation beside an Arrow group-by on the executors, same rows.

    python -m bench.arrow_partials [--events 300000] [--shapes day,minutes] [--repeats 2]

Issue 27's backfill spends its batch in the pipeline's partial aggregation (docs/benchmarks.md,
"The day-of-data backfill through Spark"): when a batch's events spread over a day, nearly every
event is a (pane, dimensions) group of its own, and Spark's object aggregates (a KLL or HLL
object per group, serialized for the shuffle and merged after it) cost ~80-100 us per group. This
measures the alternative before the pipeline gets it: the rows hashed by pane to the executors
(`repartition`), then one `mapInArrow` per partition that sorts the rows by group with numpy and
writes each group's sketch bytes from its items (exact-mode KLL bytes for groups of at most k
values, `sketches/kll_exact.py`; DataSketches for larger ones and for the HLLs).

Two shapes of synthetic `http_requests`-like rows (4 dimensions of 12 x 4 x 2 x 5 values, two
value fields, one distinct field of 5 000 users): `day`, event times spread over 24 h (a
backfill: ~1 group per event), and `minutes`, spread over 2 minutes (a live batch: few groups,
many events each). Both paths must find the same groups with the same counts (checked); the
time is the Spark job's wall time, collect/toArrow included. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import pyarrow as pa

PANE_MS = 10_000
KLL_K, HLL_LG_K = 200, 12
VALUES = 2
SPANS_MS = {"day": 86_400_000, "minutes": 120_000}
OUT_SCHEMA = ("pane_start long, dims array<string>, count long, "
              + ", ".join(f"n_{i} long, sum_{i} double, min_{i} double, max_{i} double, kll_{i} binary"
                          for i in range(VALUES)) + ", hll_0 binary")


def rows(n: int, span_ms: int, seed: int = 1) -> list[tuple]:
    rng = random.Random(seed)
    end = 1_700_000_000_000
    return [("http_requests", end - span_ms + i * span_ms // n,
             [f"e{rng.randrange(12)}", f"r{rng.randrange(4)}", rng.choice("GP"), str(rng.randrange(5))],
             [rng.random() * 100, rng.random() * 1e4], [f"u{rng.randrange(5000)}"]) for i in range(n)]


def group_partition(batches):
    """mapInArrow: one partition's rows (all of its record batches together: a group may span
    them) -> one row per (pane_start, dims) with count, n/sum/min/max/KLL per value, HLL."""
    import pyarrow.compute as pc
    from datasketches import hll_sketch, kll_doubles_sketch, tgt_hll_type

    from sketches.kll_exact import exact_bytes_of

    table = pa.Table.from_batches(list(batches))
    if table.num_rows == 0:
        return
    key = pc.binary_join(table["dims"], "\x1f").combine_chunks().dictionary_encode()
    codes = key.indices.to_numpy(zero_copy_only=False)
    pane = table["pane_start"].to_numpy()
    order = np.lexsort((codes, pane))
    sorted_pane, sorted_codes = pane[order], codes[order]
    breaks = np.flatnonzero((sorted_pane[1:] != sorted_pane[:-1]) | (sorted_codes[1:] != sorted_codes[:-1])) + 1
    starts = np.concatenate(([0], breaks)).astype(np.int64)
    ends = np.concatenate((breaks, [len(order)])).astype(np.int64)
    cols: dict[str, object] = {
        "pane_start": sorted_pane[starts],
        "dims": table["dims"].combine_chunks().take(pa.array(order[starts])),
        "count": ends - starts,
    }
    flat = table["vals"].combine_chunks().flatten().to_numpy(zero_copy_only=False).reshape(-1, VALUES)[order]
    for i in range(VALUES):
        values = np.ascontiguousarray(flat[:, i])
        lo, hi = np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)
        cols.update({f"n_{i}": ends - starts, f"sum_{i}": np.add.reduceat(values, starts), f"min_{i}": lo, f"max_{i}": hi})
        raw, blobs = values.tobytes(), []
        for a, b, low, high in zip(starts.tolist(), ends.tolist(), lo.tolist(), hi.tolist()):
            if b - a <= KLL_K:
                blobs.append(exact_bytes_of(raw[8 * a:8 * b], b - a, low, high, KLL_K))
            else:
                sketch = kll_doubles_sketch(KLL_K)
                sketch.update(values[a:b])
                blobs.append(sketch.serialize())
        cols[f"kll_{i}"] = pa.array(blobs, pa.binary())
    ids = table["ids"].combine_chunks().flatten().to_pylist()
    ids = [ids[j] for j in order.tolist()]
    hlls = []
    for a, b in zip(starts.tolist(), ends.tolist()):
        sketch = hll_sketch(HLL_LG_K, tgt_hll_type.HLL_8)
        for item in ids[a:b]:
            sketch.update(item)
        hlls.append(sketch.serialize_compact())
    cols["hll_0"] = pa.array(hlls, pa.binary())
    yield pa.RecordBatch.from_pydict(cols)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.arrow_partials", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--shapes", default="day,minutes")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)

    from pyspark.sql import functions as F

    from aggregates.spark import build_spark

    spark = build_spark("local[2]")
    schema = "stream string, event_time long, dims array<string>, vals array<double>, ids array<string>"
    print(f"{args.events:,} rows per shape; seconds per pass (min of {args.repeats}):")
    print("| shape | groups | Spark groupBy (KLL/HLL aggregates) | repartition + mapInArrow | ratio |")
    print("| --- | --- | --- | --- | --- |")
    try:
        for shape in args.shapes.split(","):
            df = spark.createDataFrame(rows(args.events, SPANS_MS[shape]), schema).cache()
            df.count()
            paned = df.withColumn("pane_start", F.col("event_time") - F.pmod("event_time", F.lit(PANE_MS)))
            aggs = [F.count(F.lit(1)).alias("count")]
            for i in range(VALUES):
                v = F.get(F.col("vals"), i)
                aggs += [F.count(v), F.sum(v), F.min(v), F.max(v), F.kll_sketch_agg_double(v, KLL_K)]
            aggs.append(F.hll_sketch_agg(F.get(F.col("ids"), 0), HLL_LG_K))
            times: dict[str, list[float]] = {"spark": [], "arrow": []}
            found = {}
            for _ in range(args.repeats):  # alternated, so load swings hit both
                started = time.perf_counter()
                spark_rows = paned.groupBy("stream", "pane_start", "dims").agg(*aggs).collect()  # every aggregate
                times["spark"].append(time.perf_counter() - started)
                started = time.perf_counter()
                arrow = paned.repartition(2, "stream", "pane_start").mapInArrow(group_partition, OUT_SCHEMA).toArrow()
                times["arrow"].append(time.perf_counter() - started)
                found = {"spark": sorted((r.pane_start, tuple(r.dims), r["count"]) for r in spark_rows),
                         "arrow": sorted(zip(arrow["pane_start"].to_pylist(), map(tuple, arrow["dims"].to_pylist()),
                                             arrow["count"].to_pylist()))}
            same = "same groups" if found["spark"] == found["arrow"] else "GROUPS DIFFER"
            s, a = min(times["spark"]), min(times["arrow"])
            print(f"| {shape} | {len(found['spark']):,} ({same}) | {s:.2f} | {a:.2f} | {s / a:.1f}x |", flush=True)
            df.unpersist()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
