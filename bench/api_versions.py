"""The ingest API of two versions of the code side by side: the same bodies posted, alternated.

    git worktree add --detach /tmp/before <commit>
    python -m bench.api_versions --before /tmp/before --batch 1000 --format json --events 200000 --reps 2

Each run is a fresh process whose service (build_api, uvicorn in a thread, a fresh data dir) is
imported from one checkout: `--before PATH`, then this one, `--reps` times, alternated, so both
see the same machine load. The client is this checkout's bench.ingest_api (4 threads in the
same process, as bench.throughput runs it) for both, so an older checkout needs none of its
options (NDJSON bodies). One request is posted before the clock starts, so both are measured
warm. Each line gives events/s, p50/p99 per request, and the process CPU per accepted event
(client and server: steadier than events/s on a shared machine) with the load average.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run_one(label: str, batch: int, events: int, body_format: str, concurrency: int) -> None:
    """In a process whose sys.path starts at the checkout under test."""
    import importlib.util
    import resource
    import tempfile

    spec = importlib.util.spec_from_file_location("bench_client", HERE / "bench" / "ingest_api.py")
    client = importlib.util.module_from_spec(spec)
    sys.modules["bench_client"] = client
    spec.loader.exec_module(client)

    from bench.serve import free_port, serving
    from catalog import load_catalog
    from demo import DemoTraffic
    from sketchboard.settings import DEFAULT_STREAMS, Settings
    from sketchboard.wiring import build_api

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    bodies = client.prepare_bodies(DemoTraffic(load_catalog(DEFAULT_STREAMS), seed=3), "http_requests", events,
                                   batch, body_format)
    port = free_port()
    app, ctx = build_api(Settings(data_dir=Path(tempfile.mkdtemp(prefix="sketchboard-versions-")), port=port,
                                  streams_config=DEFAULT_STREAMS))
    url = f"http://127.0.0.1:{port}"
    with serving(app, port, join_s=10):
        client.run_bench(url, "http_requests", bodies[:1], 1, body_format)  # warm: imports, first thread
        load, spent = os.getloadavg()[0], cpu()
        r = client.run_bench(url, "http_requests", bodies, concurrency, body_format)
        spent = cpu() - spent
    ctx.log.close()
    print(f"{label:7s} {body_format:6s} x{batch:<6d} {r.accepted / r.seconds:9,.0f} events/s"
          f"  p50 {r.percentile_ms(0.5):6.1f} ms  p99 {r.percentile_ms(0.99):7.1f} ms"
          f"  CPU {spent / max(r.accepted, 1) * 1e6:5.2f} us/event  load {load:.1f}"
          + (f"  failed {r.failed_requests}: {r.first_problem}" if r.failed_requests else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_versions", description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the older code")
    parser.add_argument("--batch", type=int, default=1000, help="events per request")
    parser.add_argument("--format", choices=("json", "ndjson"), default="json")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: the label of a single run
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, args.batch, args.events, args.format, args.concurrency)
        return 0
    status = 0
    for _ in range(args.reps):
        for label, tree in (("before", args.before.resolve()), ("after", HERE)):
            command = [sys.executable, "-c", "import sys, runpy; sys.argv = sys.argv[1:];"
                       f" runpy.run_path({str(HERE / 'bench' / 'api_versions.py')!r}, run_name='__main__')",
                       "api_versions", "--before", str(args.before), "--one", label, "--batch", str(args.batch),
                       "--format", args.format, "--events", str(args.events), "--concurrency", str(args.concurrency)]
            env = {**os.environ, "PYTHONPATH": str(tree)}
            status |= subprocess.run(command, cwd=tree, env=env).returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main())
