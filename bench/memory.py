"""Memory of the whole embedded service under sustained traffic (issue 28's memory bar:
the embedded service ≤ 4 GiB resident after an hour at 20 000 events/s).

Starts `sketchboard up --no-demo` on a free loopback port with a fresh data directory (the
shipped configuration: API, websocket hub, Spark pipeline on the embedded log, SQLite store),
posts demo `http_requests` traffic at --rate events/s for --duration seconds, and every
--sample seconds prints the memory of the service's process tree, read from /proc:

- PSS summed over the tree (each shared page counted once, split between its sharers: the
  figure that adds up to what the service costs the machine), and RSS summed (counts shared
  pages, e.g. the Python interpreter's, once per process: an upper bound);
- the JVM's share (the Spark driver; `java` processes of the tree) and the Python processes';
- the PSS of each role of the tree (`up`, `api`, `api pool`, `pipeline`, `pipeline pool`,
  `ingest worker`s summed, `java`, `other`: `role_of`), so a growth can be placed in a process;
- the pipeline's lag (events appended and not yet aggregated), so a growing figure can be told
  apart from a pipeline falling behind (which holds more in memory by design).

The growth it reports is the median of the last fifth of the samples against the median of the
fifth that ends at half time: the tree's PSS moves by ~5 % from one minute to the next (a batch,
a compaction), so one sample against another says little.

    python -m bench.memory --rate 20000 --duration 3600 --sample 60    # the bar's run
    python -m bench.memory --rate 20000 --duration 600 --sample 30     # a short form

Run by hand: it prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.freshness import Producer, Service

KIB = 1024
GIB = 1024 ** 3


def children_of(pid: int) -> list[tuple[int, int]]:
    """(process, its parent) for the process and all its descendants (by /proc/*/stat parent
    ids), each parent before its children."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name may hold spaces and parentheses
        parents.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [(pid, 0)]
    while todo:
        p, parent = todo.pop(0)
        tree.append((p, parent))
        todo.extend((child, p) for child in parents.get(p, []))
    return tree


def rollup(text: str) -> dict[str, int]:
    """Bytes by field of a /proc/PID/smaps_rollup text ("Rss:  1234 kB" lines)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "kB":
            out[parts[0].rstrip(":")] = int(parts[1]) * KIB
    return out


ROLES = ("up", "api", "api pool", "pipeline", "pipeline pool", "ingest worker", "java", "other")


def role_of(name: str, argv: list[str], parent_role: str = "other") -> str:
    """Which part of the service a process is, from its name and command line: a
    `python -m sketchboard.cli <command>` child is its command, the API's ingest worker
    processes one role together, the JVM (Spark's driver, when the pipeline runs on Spark)
    `java`, and the processes a multiprocessing pool of the API's or the pipeline's starts
    (the websocket queries', the read-ahead's, and their resource tracker) its `pool`."""
    if name == "java":
        return "java"
    if "api.ingest_worker" in argv:
        return "ingest worker"
    if "sketchboard.cli" in argv:
        command = argv[argv.index("sketchboard.cli") + 1:argv.index("sketchboard.cli") + 2]
        if command and command[0] in ROLES:
            return command[0]
    if any(word.startswith("from multiprocessing.") for word in argv) and f"{parent_role} pool" in ROLES:
        return f"{parent_role} pool"
    return "other"


def tree_memory(pid: int) -> dict:
    """PSS and RSS of the tree, the JVM's PSS, and PSS by role (`ROLES`), in bytes."""
    total: dict = {"pss": 0, "rss": 0, "jvm_pss": 0, "processes": 0, "roles": dict.fromkeys(ROLES, 0)}
    roles: dict[int, str] = {}
    for p, parent in children_of(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                mem = rollup(f.read())
            with open(f"/proc/{p}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:  # exited meanwhile
            continue
        total["pss"] += mem.get("Pss", 0)
        total["rss"] += mem.get("Rss", 0)
        total["processes"] += 1
        roles[p] = role_of(name, argv, roles.get(parent, "other"))
        total["roles"][roles[p]] += mem.get("Pss", 0)
        if name == "java":
            total["jvm_pss"] += mem.get("Pss", 0)
    return total


def growth(values: list[float]) -> float:
    """The median of the last fifth of `values` against the median of the fifth that ends at
    half time, as a fraction (0.1 is +10 %): robust to one sample's spike."""
    fifth = max(1, len(values) // 5)
    middle = len(values) // 2
    before = values[max(0, middle - fifth):middle] or values[:1]
    return statistics.median(values[-fifth:]) / max(statistics.median(before), 1) - 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=20_000, help="events/s posted")
    p.add_argument("--duration", type=float, default=600, help="seconds of traffic (the bar: 3600)")
    p.add_argument("--sample", type=float, default=30, help="seconds between samples")
    p.add_argument("--batch", type=int, default=1000, help="events per POST")
    p.add_argument("--producers", type=int, default=4, help="posting threads")
    p.add_argument("--keep", type=Path, default=None, help="data folder to keep (default: a temporary one)")
    args = p.parse_args(argv)

    holder = None if args.keep else tempfile.TemporaryDirectory(prefix="sketchboard-memory-")
    folder = args.keep or Path(holder.name)
    folder.mkdir(parents=True, exist_ok=True)
    service = Service(folder, {})
    try:
        service.wait_pipeline()
        idle = tree_memory(service.proc.pid)
        print(f"memory: idle service, pipeline up: PSS {idle['pss'] / GIB:.2f} GiB (JVM {idle['jvm_pss'] / GIB:.2f}),"
              f" RSS summed {idle['rss'] / GIB:.2f} GiB, {idle['processes']} processes", flush=True)
        producer = Producer(service.base, args.rate, args.batch, args.producers)
        producer.start()
        started = time.monotonic()
        samples = []
        roles = "  ".join(f"{role:>13}" for role in ROLES)
        print(f"memory:  minute  PSS GiB  JVM GiB  RSS GiB  accepted ev/s  lag events  {roles} (PSS MiB)", flush=True)
        while (elapsed := time.monotonic() - started) < args.duration:
            time.sleep(min(args.sample, max(0.0, args.duration - elapsed)))
            mem = tree_memory(service.proc.pid)
            lag = httpx.get(f"{service.base}/api/v1/pipeline", timeout=30).json().get("lag_events")
            rate = producer.accepted / max(time.monotonic() - started, 1e-9)
            samples.append(mem)
            print(f"memory: {(time.monotonic() - started) / 60:7.1f}  {mem['pss'] / GIB:7.2f}  {mem['jvm_pss'] / GIB:7.2f}"
                  f"  {mem['rss'] / GIB:7.2f}  {rate:13.0f}  {lag!s:>10}  "
                  + "  ".join(f"{mem['roles'][role] / 2 ** 20:13.0f}" for role in ROLES), flush=True)
        achieved = producer.stop()
        pss = [s["pss"] for s in samples]
        half = pss[len(pss) // 2:] or pss
        print(f"memory: {args.duration / 60:.0f} min at {achieved:.0f} events/s accepted ({producer.errors} failed"
              f" requests): PSS last {pss[-1] / GIB:.2f} GiB, max {max(pss) / GIB:.2f} GiB, median of the second half"
              f" {statistics.median(half) / GIB:.2f} GiB; growth over the second half (last fifth's median"
              f" against the fifth before half time) {growth(pss) * 100:+.1f} %, by role: "
              + ", ".join(f"{role} {growth([s['roles'][role] for s in samples]) * 100:+.1f} %" for role in ROLES
                          if samples[-1]["roles"][role]))
    finally:
        service.stop()
        if holder:
            holder.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
