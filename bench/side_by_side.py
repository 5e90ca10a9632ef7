"""Side by side, in one run on the same cores: Sketchboard end to end against a plain Structured
Streaming job over the same events (issue 28's "ahead of the naive Spark job" bar).

    python -m bench.side_by_side [--events 2000000] [--batch 1000] [--concurrency 4] [--repeat 1]
                                 [--config bench/configs/same_aggregates.yaml]

The same N demo `http_requests` events (generated once, seeded) go through both, each half after a
warm-up batch of 2 000 other events through its own query or service:

1. **Plain job** (what a user would write instead of Sketchboard): the events as NDJSON files,
   Spark's file source with the schema given, a watermark of the stream's allowed lateness, and
   1-minute windows x endpoint with count, sum(latency_ms), `hll_sketch_agg(user_id)` and
   `kll_sketch_agg_double(latency_ms)` kept in Spark's state, written to the `noop` sink in update
   mode. Its query reads the warm-up files, then the events' files are renamed into its folder and
   it is timed until it has processed them all (`processAllAvailable`; Spark's JVM start is
   excluded, as it is for Sketchboard below). Twice in the same JVM, each time a new query from a
   fresh checkpoint: the fresh JVM's first query runs before the JIT has compiled Jackson and the
   aggregation, which a long-running job pays once, so the ratio is to the second (warm) query; the
   first (cold) is printed beside it. Until session 78 the benchmark timed only a cold query, 1.5-2x
   slower for 2 M events; until session 79 with `Trigger.AvailableNow` and no warm-up batch.
2. **Sketchboard** (`sketchboard up --no-demo`; by default the shipped configuration: every
   stream, tiers, first-seen and membership, sessions, enrichment; with `--config
   bench/configs/same_aggregates.yaml` the stream declared with the plain job's window and
   aggregates and nothing optional): the events POSTed as JSON arrays of `--batch` events by
   `--concurrency` clients; timed from the first POST to the moment `GET /api/v1/pipeline` says
   every event was read and committed by the pipeline (aggregated or dead-lettered).

Prints both rates and their ratio, and where the service's CPU went (its API's and pipeline's
processes, read from /proc, during the POSTs and after them, with each one's user and system time
and minor page faults). Each round also prints the bar's arithmetic in CPU: what the warm plain job
spent an event, what Sketchboard's end to end spent (its clients, API, pipeline and the rest of the
service), and what 2x the plain job leaves an event on the cores both share. Asserts nothing. Run it
with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.cpu import Usage, child_by_command, tree_usage
from bench.freshness import Service
from bench.ingest_api import run_bench
from catalog import ConfigError, load_catalog
from demo import DEFAULT_CONFIG, DemoTraffic
from sketchboard.wiring import available_cores

STREAM = "http_requests"
WARM_UP_EVENTS, WARM_UP_SEED = 2_000, 5  # each half's warm-up batch, before its clock starts
SAME_AGGREGATES = Path(__file__).parent / "configs" / "same_aggregates.yaml"
SCHEMA = ("time LONG, endpoint STRING, method STRING, status STRING, region STRING, user_id STRING,"
          " latency_ms DOUBLE, response_bytes LONG")


def generate(events: int, batch: int, seed: int = 11) -> list[list[dict]]:
    """The events, in request-sized chunks (the same chunks become the plain job's files)."""
    traffic = DemoTraffic(load_catalog(DEFAULT_CONFIG), seed=seed)
    chunks, left = [], events
    while left > 0:
        chunk = traffic.generate_stream(STREAM, min(batch, left))
        chunks.append(chunk)
        left -= len(chunk)
    return chunks


def write_files(chunks: list[list[dict]], folder: Path, per_file: int = 100_000) -> int:
    """NDJSON files of about `per_file` events each; returns how many files."""
    folder.mkdir(parents=True, exist_ok=True)
    files, lines = 0, []

    def flush() -> None:
        nonlocal files, lines
        (folder / f"part-{files:05d}.json").write_text("\n".join(lines) + "\n")
        files, lines = files + 1, []

    for chunk in chunks:
        lines.extend(json.dumps(e, separators=(",", ":")) for e in chunk)
        if len(lines) >= per_file:
            flush()
    if lines:
        flush()
    return files


def plain_job(folder: Path, warm_folder: Path, work: Path, lateness_s: int) -> tuple[float, float, float | None]:
    """Seconds the plain Structured Streaming job takes over every file in `folder`, twice: in the
    fresh JVM's first query (cold), then in a second query (warm); and the CPU seconds of the warm
    one (this process and its JVM, from /proc; None elsewhere). Each query first reads the files of
    `warm_folder` (its warm-up batch, as Sketchboard's half gets one), then the timed files are
    renamed into its source folder and timed until the query has processed all of them."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.master("local[2]").appName("plain-structured-streaming")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def run(name: str) -> tuple[float, float | None]:
        source = work / f"{name}-source"
        source.mkdir(parents=True)
        for file in warm_folder.iterdir():
            shutil.copy(file, source / f"warm-{file.name}")
        events = (spark.readStream.schema(SCHEMA).json(str(source))
                  .withColumn("ts", F.timestamp_millis("time"))
                  .withWatermark("ts", f"{lateness_s} seconds"))
        counts = (events.groupBy(F.window("ts", "1 minute"), "endpoint")
                  .agg(F.count(F.lit(1)).alias("n"), F.sum("latency_ms").alias("latency_sum"),
                       F.hll_sketch_agg("user_id").alias("users"),
                       F.kll_sketch_agg_double("latency_ms").alias("latency")))
        query = (counts.writeStream.outputMode("update").format("noop")
                 .option("checkpointLocation", str(work / f"{name}-checkpoint")).start())
        try:
            query.processAllAvailable()  # the warm-up batch
            # Copied under hidden names (the file source skips names starting with "."), then renamed
            # in: the clock starts when the events are there, as it does at Sketchboard's first POST.
            for file in folder.iterdir():
                shutil.copy(file, source / f".{file.name}")
            hidden = sorted(source.glob(".*"))
            cpu_before = tree_usage()  # nothing but this process and its JVM runs: no service yet
            started = time.perf_counter()
            for file in hidden:
                file.rename(source / file.name[1:])
            query.processAllAvailable()
            took = time.perf_counter() - started
            cpu_after = tree_usage()
        finally:
            query.stop()
        if query.exception() is not None:
            raise SystemExit(f"the plain job failed: {query.exception()}")
        shutil.rmtree(source, ignore_errors=True)
        return took, None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before).cpu

    try:
        # The fresh JVM's first query compiles its generated code and runs before the JIT has
        # compiled Jackson and the aggregation: a long-running job pays that once, so the bar is
        # against the second query (session 78 found the first 1.5-2x slower for 2 M events).
        cold_s, _ = run("cold")
        warm_s, warm_cpu_s = run("warm")
        return cold_s, warm_s, warm_cpu_s
    finally:
        spark.stop()


def read_total(base: str) -> int:
    return httpx.get(f"{base}/api/v1/pipeline", timeout=30).json()["events_read"]


POLL_S = 0.05  # between two asks of the pipeline's progress (each ~13 ms of the API's, on the core the tail leaves idle)


def wait_read(base: str, target: int, timeout_s: float, say_every_s: float = 10.0) -> float:
    """Until the pipeline has read `target` events in all; returns when (perf_counter). The end to
    end is late by up to POLL_S and one ask: with 0.2 s between asks it came out ~0.1 s long on
    average, ~2 % of a 5-6 s run."""
    deadline, said = time.monotonic() + timeout_s, time.monotonic()
    while time.monotonic() < deadline:
        done = read_total(base)
        if done >= target:
            return time.perf_counter()
        if time.monotonic() - said >= say_every_s:
            print(f"  sketchboard: {done:,} / {target:,} events read by the pipeline", flush=True)
            said = time.monotonic()
        time.sleep(POLL_S)
    raise SystemExit(f"the pipeline read {read_total(base):,} of {target:,} events in {timeout_s:.0f} s")


def sketchboard_end_to_end(root: Path, chunks: list[list[dict]], concurrency: int, timeout_s: float,
                           config: Path | None = None) -> tuple[float, float, str | None, dict[str, float] | None]:
    """(seconds from the first POST to every event read, seconds the POSTs alone took, where the
    service's CPU went: its API and pipeline processes', read from /proc, and the CPU seconds of the
    whole end to end by part (`spent_by_part`); both None elsewhere)."""
    root.mkdir(parents=True, exist_ok=True)
    # The clients all post from 127.0.0.1, one address to the API's per-client limit (500 000 events/s
    # by default, sketchboard/settings.py): the POSTs now go faster than that. Off, as for a trusted
    # producer: the benchmark measures the service's capacity, not that limit.
    env = {"SKETCHBOARD_RATE_LIMIT_EVENTS": "0"}
    service = Service(root, env if config is None else {**env, "SKETCHBOARD_STREAMS_CONFIG": str(config)})
    try:
        warm = [(len(c), json.dumps(c).encode()) for c in generate(WARM_UP_EVENTS, 1_000, seed=WARM_UP_SEED)]
        run_bench(service.base, STREAM, warm, 1)
        wait_read(service.base, WARM_UP_EVENTS, 300)
        before = read_total(service.base)
        bodies = [(len(c), json.dumps(c, separators=(",", ":")).encode()) for c in chunks]
        events = sum(n for n, _ in bodies)
        # The pipeline's tree: its read-ahead worker's CPU is the pipeline's too.
        pids = {name: child_by_command(service.proc.pid, name) for name in ("api", "pipeline")}
        pids["service"] = service.proc.pid  # `up` and every process it started

        def cpu() -> dict[str, Usage | None]:
            used = {name: None if pid is None else tree_usage(pid) for name, pid in pids.items()}
            # The clients' threads (and the progress asks) are this process's own; its idle JVM
            # from the plain job is a live child, so RUSAGE_SELF leaves it out.
            own = resource.getrusage(resource.RUSAGE_SELF)
            return {**used, "clients": Usage(own.ru_utime, own.ru_stime, own.ru_minflt)}

        at_start = cpu()
        started = time.perf_counter()
        result = run_bench(service.base, STREAM, bodies, concurrency)
        posted = time.perf_counter() - started
        at_posted = cpu()
        if result.accepted != events:
            raise SystemExit(f"the API accepted {result.accepted:,} of {events:,} events ({result.first_problem})")
        done = wait_read(service.base, before + events, timeout_s)
        at_done = cpu()
        return (done - started, posted, cpu_split(at_start, at_posted, at_done, events),
                spent_by_part(at_start, at_done))
    finally:
        service.stop()


def cpu_split(start: dict, posted: dict, done: dict, events: int) -> str | None:
    """The API's and the pipeline's CPU seconds while the POSTs ran and after them, and per event:
    on two cores, whether the API or the pipeline is the wall (docs/benchmarks.md, session 54)."""
    if any(v is None for d in (start, posted, done) for v in d.values()):
        return None
    parts = []
    for name in ("api", "pipeline"):
        during, after = posted[name] - start[name], done[name] - posted[name]
        both = during + after
        # System time and minor faults apart: memory given back and faulted in again shows there
        # (docs/benchmarks.md, session 77), not in the user time.
        parts.append(f"{name} {during.cpu:.1f} s during the POSTs + {after.cpu:.1f} s after"
                     f" ({both.cpu / events * 1e6:.1f} us an event; user {both.user:.1f} s, system"
                     f" {both.system:.1f} s, {both.minor_faults:,} minor faults)")
    return "CPU: " + "; ".join(parts)


def spent_by_part(start: dict[str, Usage | None], done: dict[str, Usage | None]) -> dict[str, float] | None:
    """CPU seconds of the end to end by part: the clients, the API, the pipeline and the rest of the
    service (`up` and its other processes); None where /proc could not be read."""
    if any(v is None for d in (start, done) for v in d.values()):
        return None
    used = {name: (done[name] - start[name]).cpu for name in ("clients", "api", "pipeline", "service")}
    used["rest"] = max(0.0, used.pop("service") - used["api"] - used["pipeline"])
    return used


def budget_line(events: int, cores: int, plain_s: float, plain_cpu_s: float | None,
                spent: dict[str, float] | None, ratio: float = 2.0) -> str:
    """What the bar asks in CPU, beside what each half spent, in microseconds an event. At `ratio`
    x the plain job, Sketchboard's end to end may last the plain job's time over `ratio`, on the
    same `cores`: that is all the CPU its clients, API and pipeline may use together. This is the
    bar's arithmetic (docs/benchmarks.md, session 79), printed by each run."""
    budget_us = cores * plain_s / ratio / events * 1e6
    spent_us = None if spent is None else sum(spent.values()) / events * 1e6
    parts = []
    if plain_cpu_s is not None:
        parts.append(f"the plain job (warm) {plain_cpu_s / events * 1e6:.1f} us")
    if spent is not None:
        split = ", ".join(f"{name} {seconds / events * 1e6:.1f}" for name, seconds in spent.items())
        parts.append(f"Sketchboard {spent_us:.1f} us ({split})")
    line = f"CPU an event: {'; '.join(parts)}. " if parts else ""
    line += f"{ratio:g} x the plain job on {cores} core{'s' if cores != 1 else ''} leaves {budget_us:.1f} us an event"
    if spent_us is not None:
        line += f" for all of Sketchboard's; this run spent {spent_us / budget_us:.1f} x that"
    return line


def rounds_table(rounds: list[tuple[float, float, float]]) -> str:
    """The rates (plain job warm, Sketchboard, plain job cold) of each round as a Markdown table and
    the ratio to the warm plain job (the bar's): one round's, or each round's and their median. The
    ratio to the cold one is what sessions before 78 printed."""
    if len(rounds) == 1:
        (plain, ours, cold), = rounds
        return (f"\n| path | events/s |\n| --- | --- |\n| plain Structured Streaming job (files -> state), warm |"
                f" {plain:,.0f} |\n| the same, the fresh JVM's first query | {cold:,.0f} |"
                f"\n| Sketchboard, POST -> every event aggregated | {ours:,.0f} |\n\nratio Sketchboard / plain:"
                f" {ours / plain:.2f} x (bar: 2 x; to the cold run: {ours / cold:.2f} x)")
    # Round 1's first query is the fresh JVM's; a later round's is in a JVM warm from round 1.
    lines = ["", "| round | plain job warm, events/s | its first query | Sketchboard, events/s | ratio (to the first) |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {i} | {plain:,.0f} | {cold:,.0f} | {ours:,.0f} | {ours / plain:.2f} x ({ours / cold:.2f} x) |"
              for i, (plain, ours, cold) in enumerate(rounds, 1)]
    ratios = [ours / plain for plain, ours, _ in rounds]
    lines += ["", f"median ratio Sketchboard / plain over {len(rounds)} rounds: {statistics.median(ratios):.2f} x"
                  f" (from {min(ratios):.2f} to {max(ratios):.2f}; bar: 2 x)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=1_000, help="events per POST (and per generated chunk)")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent API clients")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the pipeline")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds, each the plain job then Sketchboard: the machine's phase moves both halves,"
                             " so each round's ratio is printed and, past one round, their median")
    parser.add_argument("--config", type=Path, default=None,
                        help="Sketchboard's streams YAML (default: the shipped one; the plain job's aggregates"
                             " and no more: bench/configs/same_aggregates.yaml)")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    if args.config is not None:  # said now, not after the plain job's run
        try:
            streams = load_catalog(args.config).streams
        except (OSError, ConfigError) as exc:
            parser.error(f"--config {args.config}: {exc}")
        if STREAM not in streams:
            parser.error(f"--config {args.config}: no stream {STREAM!r}, which the events are POSTed to")

    lateness_s = load_catalog(DEFAULT_CONFIG).stream(STREAM).allowed_lateness // 1000
    with tempfile.TemporaryDirectory(prefix="sketchboard-side-by-side-") as tmp:
        root = Path(tmp)
        print(f"generating {args.events:,} {STREAM} events ...", flush=True)
        chunks = generate(args.events, args.batch)
        files = write_files(chunks, root / "files")
        write_files(generate(WARM_UP_EVENTS, 1_000, seed=WARM_UP_SEED), root / "warm-files")
        rounds = []
        for r in range(args.repeat):
            label = f"[{r + 1}/{args.repeat}] " if args.repeat > 1 else ""
            print(f"{label}plain Structured Streaming job over {files} NDJSON files ...", flush=True)
            cold_s, plain_s, plain_cpu_s = plain_job(root / "files", root / "warm-files", root / f"plain-{r}",
                                                     lateness_s)
            plain = args.events / plain_s
            # Only round 1's first query is in a fresh JVM: pyspark keeps its JVM when a session stops.
            first = "in the fresh JVM" if r == 0 else "of this round's session (the JVM is warm from round 1)"
            print(f"  plain job: {args.events:,} events in {plain_s:.1f} s = {plain:,.0f} events/s (warm; its first"
                  f" query {first}: {cold_s:.1f} s = {args.events / cold_s:,.0f} events/s)", flush=True)
            configured = "the shipped configuration" if args.config is None else args.config
            print(f"{label}sketchboard up --no-demo ({configured}), POST -> every event read by the pipeline ...",
                  flush=True)
            e2e_s, post_s, split, spent = sketchboard_end_to_end(root / f"sketchboard-{r}", chunks,
                                                                 args.concurrency, args.timeout, args.config)
            shutil.rmtree(root / f"sketchboard-{r}", ignore_errors=True)  # its log: ~100 MB a round
            ours = args.events / e2e_s
            print(f"  sketchboard: {args.events:,} events in {e2e_s:.1f} s = {ours:,.0f} events/s end to end"
                  f" (the POSTs alone: {post_s:.1f} s = {args.events / post_s:,.0f} events/s)", flush=True)
            if split:
                print(f"  {split}", flush=True)
            print(f"  {budget_line(args.events, available_cores(), plain_s, plain_cpu_s, spent)}", flush=True)
            rounds.append((plain, ours, args.events / cold_s))
    print(rounds_table(rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
