"""Where one backfill commit's time goes: demo events spread over `--hours`, aggregated into 10 s
panes as the executors would (bench/day_of_data.py demo_partials), committed as ONE batch into a
fresh SQLite store with the shipped tiers, under cProfile. Prints the commit's CPU time and the
profile's top functions (cumulative, then own time); asserts nothing.

    python -m bench.commit_profile                          # 1 000 000 events over 24 h (issue 27's backfill batch)
    python -m bench.commit_profile --events 300000 --top 30
    python -m bench.commit_profile --no-profile             # the commit's CPU time without the profiler
    python -m bench.commit_profile --no-profile --paths rows,columns,rows,columns
        # the partials as objects, then as columns (BatchCommit.partial_columns, as the Arrow
        # partials come), each into a fresh store, alternated in one process
    python -m bench.commit_profile --no-profile --phases --paths columns,rows   # CPU per step of the commit

Session 40, load ~12: 1 M events -> 322 390 partials, commit CPU 20.8 s; tier deltas ~40 % of it,
the pane rows' write ~35 % (a third of that the stats text and sketch blobs), executemany ~10 %."""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.day_of_data import STREAM, demo_partials
from bench.step_timer import wrap_timed
from catalog import load_catalog
from sketchboard.settings import DEFAULT_STREAMS
from store import BatchCommit, SqlitePaneStore
from store.partial_columns import PartialColumns
from store.tiers import catalog_layouts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--hours", type=float, default=24.0)
    parser.add_argument("--top", type=int, default=40, help="functions printed per ordering")
    parser.add_argument("--no-profile", action="store_true",
                        help="time the commit without cProfile (which more than doubles the cost of its Python calls)")
    parser.add_argument("--phases", action="store_true",
                        help="CPU per step of each commit: the store's once-per-commit functions timed around their calls")
    parser.add_argument("--paths", default="columns",
                        help="comma-separated, in turn, each into a fresh store: 'rows' (the partials as objects) or"
                             " 'columns' (as columns, as the Arrow partials come); the last one is profiled")
    args = parser.parse_args()

    catalog = load_catalog(DEFAULT_STREAMS)
    stream = catalog.stream(STREAM)
    end_ms = int(time.time() * 1000)
    partials = [p for batch in demo_partials(catalog, args.events, args.hours, end_ms, args.events) for p in batch]
    n = sum(p.data.count for p in partials)
    columns = PartialColumns.of(STREAM, partials, stream.values, stream.distinct_fields)  # the pipeline has them
    assert columns is not None, "the demo partials follow the columns' rule"
    commit = BatchCommit("main", 0, partials, n, {STREAM: max(p.end_ms for p in partials) - 1}, {},
                         read_by_stream={STREAM: n})
    paths = args.paths.split(",")
    phases = _timed_steps() if args.phases else None
    for k, path in enumerate(paths):
        if phases is not None:
            phases.clear()
        profile = cProfile.Profile()
        with tempfile.TemporaryDirectory() as root:
            store = SqlitePaneStore(Path(root) / "store.db", synchronous="OFF")
            try:
                store.configure_tiers(catalog_layouts(catalog), now_ms=end_ms)
                this = replace(commit, partials=[], partial_columns={STREAM: columns}) if path == "columns" else commit
                cpu = time.process_time()
                if not args.no_profile and k == len(paths) - 1:
                    profile.enable()
                store.commit_batch(this, lateness_ms={STREAM: 30_000}, now_ms=end_ms)
                profile.disable()
                cpu = time.process_time() - cpu
            finally:
                store.close()
        how = "without the profiler" if args.no_profile or k < len(paths) - 1 else "under cProfile"
        print(f"{n:,} events -> {len(partials):,} pane partials, {path}: one commit: {cpu:.1f} s of CPU {how}",
              flush=True)
        for step, seconds in sorted((phases or {}).items(), key=lambda item: -item[1]):
            print(f"    {step:<40} {seconds:6.2f} s")
    if args.no_profile:
        return
    stats = pstats.Stats(profile)
    stats.sort_stats("cumulative").print_stats(args.top)
    stats.sort_stats("tottime").print_stats(args.top // 2)


def _timed_steps() -> dict[str, float]:
    """Wrap the commit's once-per-commit steps (the plan, the tier levels, the writes) to add up
    their CPU time in the returned dict: cProfile's cost per call would distort the per-row ones."""
    import sketches.hll as hll
    import store.sqlite as sqlite
    import store.sqlite_tiers as sqlite_tiers
    import store.tier_levels as tier_levels

    out: dict[str, float] = {}

    for owner, name, label in [
        (sqlite, "pane_keys", "the partials' dimension texts"),
        (sqlite, "pane_rows", ". pane rows encoded"),
        (sqlite, "plan_batch", "the plan, in all"),
        (tier_levels, "_root", ". tiers' first level, from objects"),
        (tier_levels, "_root_of_columns", ". tiers' first level, from columns"),
        (tier_levels, "_group", ". tier levels' grouping"),
        (hll.HllSketch, "merge_all", ". . of which HLL unions"),
        (tier_levels, "_emit", ". tier rows as TierDeltas"),
        (sqlite.SqlitePaneStore, "_stored_panes", "the stored panes' load"),
        (sqlite.SqlitePaneStore, "_write_panes", "writing pane rows and changes"),
        (sqlite_tiers, "apply_deltas", "tier rows' merge and write"),
    ]:
        wrap_timed(owner, name, label, out, time.process_time)
    return out


if __name__ == "__main__":
    main()
