"""Measure the ingest API's throughput (events/s) against a running service.

Events come from DemoTraffic and are serialised to JSON bodies before the clock starts,
so the number measures the service (parse, validate, append to the log), not this
client. `concurrency` threads, each with its own keep-alive connection, post the bodies from
a shared queue: through an httpx.Client (the default), or with `--client wire` each request
written whole on its socket (bench/http_wire.py), as a load generator such as wrk does, which
costs a tenth of httpx's CPU a request.

    python -m bench.ingest_api --url http://127.0.0.1:8000 --events 200000 --batch 1000 --concurrency 4

Events are stamped when generated, so on a long run the last ones are older than the
stream's allowed lateness; if the service rejects late events it shows as `rejected`.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.http_wire import WireClient
from catalog import ConfigError, load_catalog
from demo import DEFAULT_CONFIG, INGEST_PATH, DemoTraffic


@dataclass
class BenchResult:
    events: int = 0
    accepted: int = 0
    rejected: int = 0
    failed_requests: int = 0
    requests: int = 0
    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    first_problem: str | None = None

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_s:
            return float("nan")
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


NDJSON = "application/x-ndjson"


def content_type(body_format: str) -> str:
    return NDJSON if body_format == "ndjson" else "application/json"


def prepare_bodies(traffic: DemoTraffic, stream: str, events: int, batch: int,
                   body_format: str = "json") -> list[tuple[int, bytes]]:
    """(event count, body) per request, generated and serialised up front: a JSON array, or
    NDJSON (one event per line) with body_format="ndjson"."""
    bodies: list[tuple[int, bytes]] = []
    left = events
    while left > 0:
        chunk = traffic.generate_stream(stream, min(batch, left))
        if not chunk:  # the demo's clicks come only after searches: bench.search_clicks makes both
            raise SystemExit(f"bench.ingest_api: the demo makes no {stream} events by themselves; pick another stream")
        if body_format == "ndjson":
            body = ndjson_body(chunk)
        else:
            body = json.dumps(chunk, separators=(",", ":")).encode()
        bodies.append((len(chunk), body))
        left -= len(chunk)
    return bodies


def ndjson_body(events: list[dict]) -> bytes:
    """A POST /api/v1/events body of these events, one JSON document a line."""
    return "\n".join(json.dumps(event, separators=(",", ":")) for event in events).encode()


CLIENTS = ("httpx", "wire")


def run_bench(url: str, stream: str, bodies: list[tuple[int, bytes]], concurrency: int,
              body_format: str = "json", client: str = "httpx") -> BenchResult:
    """Post every body once from `concurrency` threads; time from first send to last answer.
    `client`: httpx (a client as an application would use), or `wire` (each request written whole
    on a keep-alive socket, as a load generator such as wrk does: bench/http_wire.py)."""
    work: queue.SimpleQueue[tuple[int, bytes]] = queue.SimpleQueue()
    for item in bodies:
        work.put(item)
    result = BenchResult()
    lock = threading.Lock()  # guards result: workers merge their tallies at the end
    headers = {"content-type": content_type(body_format)}
    token = os.environ.get("SKETCHBOARD_TOKEN")  # a service that requires tokens: one with the ingest scope
    if token:
        headers["authorization"] = f"Bearer {token}"

    def worker() -> None:
        local = BenchResult()
        with _poster(client, url, stream, headers) as post:
            while True:
                try:
                    count, body = work.get_nowait()
                except queue.Empty:
                    break
                local.events += count
                started = time.perf_counter()
                try:
                    status, content = post(body)
                except (httpx.TransportError, OSError) as exc:
                    local.failed_requests += 1
                    local.first_problem = local.first_problem or f"{type(exc).__name__}: {exc}"
                    continue
                local.latencies_s.append(time.perf_counter() - started)
                local.requests += 1
                local.statuses[status] += 1
                if status != 200:
                    local.failed_requests += 1
                    text = content[:200].decode(errors="replace")
                    local.first_problem = local.first_problem or f"HTTP {status}: {text}"
                    continue
                answer = json.loads(content)
                rejected = answer.get("rejected") or []
                local.accepted += int(answer.get("accepted", count - len(rejected)))
                local.rejected += len(rejected)
                if rejected and not local.first_problem:
                    local.first_problem = f"rejected: {rejected[0]}"
        with lock:
            result.events += local.events
            result.accepted += local.accepted
            result.rejected += local.rejected
            result.failed_requests += local.failed_requests
            result.requests += local.requests
            result.latencies_s += local.latencies_s
            result.statuses.update(local.statuses)
            result.first_problem = result.first_problem or local.first_problem

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, concurrency))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - started
    return result


@contextmanager
def _poster(client: str, url: str, stream: str,
            headers: dict[str, str]) -> Iterator[Callable[[bytes], tuple[int, bytes]]]:
    """A function posting a body to the ingest route on one keep-alive connection: (status, answer)."""
    if client == "wire":
        with WireClient(url) as wire:
            head = wire.request_head("POST", f"{INGEST_PATH}?stream={stream}", headers)
            yield lambda body: wire.send(head(len(body)), body)
        return
    with httpx.Client(base_url=url.rstrip("/"), timeout=30.0) as http:
        def post(body: bytes) -> tuple[int, bytes]:
            resp = http.post(INGEST_PATH, params={"stream": stream}, content=body, headers=headers)
            return resp.status_code, resp.content
        yield post


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ingest_api", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1_000, help="events per request")
    parser.add_argument("--concurrency", type=int, default=4, help="parallel connections")
    parser.add_argument("--format", choices=("json", "ndjson"), default="json", help="JSON arrays or NDJSON bodies")
    parser.add_argument("--client", choices=CLIENTS, default="httpx",
                        help="httpx, or requests written whole on the socket as a load generator does (wire)")
    parser.add_argument("--stream", default="http_requests")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    args = parser.parse_args(argv)
    try:
        catalog = load_catalog(args.config)
        catalog.stream(args.stream)
    except (ConfigError, KeyError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2

    prep = time.perf_counter()
    bodies = prepare_bodies(DemoTraffic(catalog, seed=args.seed), args.stream, args.events, args.batch, args.format)
    megabytes = sum(len(b) for _, b in bodies) / 1e6
    print(
        f"prepared {args.events} {args.stream} events in {len(bodies)} bodies ({megabytes:.1f} MB)"
        f" in {time.perf_counter() - prep:.1f} s; posting to {args.url} with concurrency {args.concurrency}",
        flush=True,
    )
    r = run_bench(args.url, args.stream, bodies, args.concurrency, args.format, args.client)
    secs = max(r.seconds, 1e-9)
    print(f"total events     {r.events}")
    print(f"accepted         {r.accepted}")
    print(f"rejected         {r.rejected}")
    print(f"failed requests  {r.failed_requests}  (statuses: {dict(r.statuses)})")
    print(f"seconds          {r.seconds:.2f}")
    print(f"events/s         {r.accepted / secs:,.0f} accepted  ({r.events / secs:,.0f} sent)")
    print(f"requests/s       {r.requests / secs:,.1f}")
    print(f"latency          p50 {r.percentile_ms(0.50):.1f} ms, p99 {r.percentile_ms(0.99):.1f} ms")
    if r.first_problem:
        print(f"first problem    {r.first_problem}")
    return 0 if r.failed_requests == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
