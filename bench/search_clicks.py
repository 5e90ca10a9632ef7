"""Benchmark input: the demo's searches and the clicks on their results, for a window join.

    python -m bench.search_clicks --out DIR [--searches 300000] [--rate 300] [--seed 0]
                                  [--within 30m] [--streams config/streams.yaml] [--ndjson]

Runs the demo's generator (demo/searches.py through DemoTraffic, so the events carry exactly the
declared fields of the `searches` and `clicks` streams) on a simulated clock: `--rate` searches
per second of event time until `--searches` were made, then on until every click was sent (the
slowest come about an hour after their search, the buffered ones after the clicks stream's
allowed lateness). The simulated span ends now, so the events lie within the streams' retention.

Writes, under --out:
- `log.db`: an embedded log (the pipeline's input), both streams appended in send order, each
  event validated as the API does, with its simulated send time as the ingest time;
- with --ndjson: `searches.ndjson` and `clicks.ndjson` in the same order (for a plain Spark
  stream-stream join to compare with);
- `truth.json`: the exact join over the generator's ground truth, per query_category and in total:
  searches, searches clicked within `--within` (0 <= click - search <= within), pairs within it,
  clicks after it, clicks sent after the allowed lateness, clicks naming an unknown search id, and
  the within-window latency's p50/p95/p99 in ms (nearest rank).

Prints the events made, the generator's and the log's events/s, and the click-through rates.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from pathlib import Path

from catalog import load_catalog, parse_duration_ms
from demo import DemoTraffic
from demo.searches import CLICK_LATE
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from sketchboard.settings import DEFAULT_STREAMS

FLUSH_EVENTS = 50_000
DRAIN_STEP_S = 10.0   # once every search is made, the clock moves on in bigger steps


class Truth:
    """The exact join of clicks to searches within a bound, from the generator's own rows."""

    def __init__(self, within_ms: int):
        self.within_ms = within_ms
        self.search: dict[str, tuple[int, str]] = {}     # search id -> (time, category)
        self.clicked: set[str] = set()
        self.rows: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.latency: dict[str, list[int]] = defaultdict(list)

    def searches(self, events: list[dict]) -> None:
        for e in events:
            self.search[e["search_id"]] = (e["time"], e["query_category"])
            self.rows[e["query_category"]]["searches"] += 1

    def clicks(self, events: list[dict], kinds: list[str]) -> None:
        for e, kind in zip(events, kinds, strict=True):
            found = self.search.get(e["search_id"])
            if found is None:
                self.rows["(unknown)"]["unknown_clicks"] += 1
                continue
            t, cat = found
            row = self.rows[cat]
            row["late_clicks"] += kind == CLICK_LATE
            delay = e["time"] - t
            if 0 <= delay <= self.within_ms:
                row["pairs"] += 1
                self.latency[cat].append(delay)
                if e["search_id"] not in self.clicked:
                    self.clicked.add(e["search_id"])
                    row["clicked"] += 1
            else:
                row["clicks_after_window"] += 1

    def summary(self) -> dict:
        keys = ("searches", "clicked", "pairs", "clicks_after_window", "late_clicks", "unknown_clicks")
        out: dict[str, dict] = {}
        for cat in sorted(self.rows):
            out[cat] = {k: self.rows[cat][k] for k in keys} | _ctr_and_latency(self.rows[cat], self.latency[cat])
        total = {k: sum(self.rows[c][k] for c in self.rows) for k in keys}
        out["total"] = total | _ctr_and_latency(total, [x for v in self.latency.values() for x in v])
        return {"within_ms": self.within_ms, "by_category": out}


def _ctr_and_latency(row, latencies: list[int]) -> dict:
    extra: dict = {"ctr": round(row["clicked"] / row["searches"], 4) if row["searches"] else None}
    ordered = sorted(latencies)
    for q in (50, 95, 99):
        extra[f"latency_p{q}_ms"] = ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)] if ordered else None
    return extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.search_clicks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for log.db, truth.json (and the NDJSON files)")
    parser.add_argument("--searches", type=int, default=300_000, help="searches to make (default %(default)s)")
    parser.add_argument("--rate", type=int, default=300, help="searches per second of event time (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--within", default="30m", help="the join bound truth.json is computed for (default %(default)s)")
    parser.add_argument("--streams", type=Path, default=DEFAULT_STREAMS, help="stream configuration with searches and clicks")
    parser.add_argument("--ndjson", action="store_true", help="also write searches.ndjson and clicks.ndjson")
    args = parser.parse_args(argv)
    if args.searches < 1 or args.rate < 1:
        parser.error("--searches and --rate must be at least 1")
    catalog = load_catalog(args.streams)
    for name in ("searches", "clicks"):
        if name not in catalog.streams:
            parser.error(f"{args.streams} declares no {name!r} stream")
    streams = {name: catalog.stream(name) for name in ("searches", "clicks")}
    args.out.mkdir(parents=True, exist_ok=True)

    # Simulated clock: searches for searches/rate seconds, then at most 2 h for the last clicks.
    clicks = streams["clicks"]
    span_s = args.searches / args.rate + 3_600 + (clicks.allowed_lateness + clicks.pane) / 1000 * 10
    clock = [time.time() - span_s]
    traffic = DemoTraffic(catalog, seed=args.seed, clock=lambda: clock[0])
    truth = Truth(parse_duration_ms(args.within))
    validators = {name: EventValidator(s) for name, s in streams.items()}
    log = SqliteEventLog(args.out / "log.db")
    for s in streams.values():
        log.ensure_topic(s)
    files = {name: open(args.out / f"{name}.ndjson", "w") for name in streams} if args.ndjson else {}
    pending: dict[str, list[dict]] = {name: [] for name in streams}
    made = {name: 0 for name in streams}
    generate_s = append_s = 0.0
    kinds_seen: dict[str, int] = defaultdict(int)

    def flush(final: bool = False) -> None:
        nonlocal append_s
        for name, events in pending.items():
            if not events or (not final and len(events) < FLUSH_EVENTS):
                continue
            started = time.perf_counter()
            log.append(streams[name], [validators[name].validate(e) for e in events], int(clock[0] * 1000))
            append_s += time.perf_counter() - started
            if name in files:
                files[name].writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
            events.clear()

    try:
        left = args.searches
        while left > 0 or traffic.search_clicks.pending:
            started = time.perf_counter()
            n = min(args.rate, left)
            searches = traffic.generate_stream("searches", n) if n else []
            due = traffic.generate_stream("clicks", 0)
            kinds = traffic.last_kinds
            generate_s += time.perf_counter() - started
            left -= n
            truth.searches(searches)
            truth.clicks(due, kinds)
            for kind in kinds:
                kinds_seen[kind] += 1
            pending["searches"] += searches
            pending["clicks"] += due
            made["searches"] += len(searches)
            made["clicks"] += len(due)
            flush()
            clock[0] += 1.0 if left > 0 else DRAIN_STEP_S
        flush(final=True)
    finally:
        log.close()
        for f in files.values():
            f.close()

    summary = truth.summary()
    (args.out / "truth.json").write_text(json.dumps(summary, indent=2) + "\n")
    total = made["searches"] + made["clicks"]
    print(f"searches {made['searches']:,}, clicks {made['clicks']:,} ({dict(kinds_seen)}); event time"
          f" {args.searches / args.rate / 60:.1f} min of searches at {args.rate}/s, then the clicks' tail")
    print(f"generator: {total / generate_s:,.0f} events/s; log append (validated): {total / append_s:,.0f} events/s")
    print(f"exact join within {args.within}: " + ", ".join(
        f"{cat} {row['ctr']:.3f}" for cat, row in summary["by_category"].items() if row["ctr"] is not None)
          + f"; unknown clicks {summary['by_category']['total']['unknown_clicks']:,}"
          + f", after the window {summary['by_category']['total']['clicks_after_window']:,}")
    print(f"wrote {args.out / 'log.db'}, {args.out / 'truth.json'}" + (", the NDJSON files" if files else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
