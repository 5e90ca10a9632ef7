"""Benchmark: what one CDC follower's status() costs (the dashboard's pipeline feed asks every
follower once a second, /metrics at each scrape), side by side in one process on one embedded
log: the position read from the log at every call (`log`, the old path: POSITION_TTL_S = 0)
against the position the follower keeps in memory (`memory`, now).

    python -m bench.cdc_status [--calls 2000] [--rounds 3]

No PostgreSQL is needed: the status is what the follower last saw, and the position is one
recorded in the log. Printed, never asserted; `uptime` is printed with the figures. On the Kafka
log the old path was costlier still (a read of the compacted positions topic per call).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from catalog import parse_catalog
from ingest.cdc import follower as cdc
from ingest.log import SqliteEventLog

CONFIG = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan]
    source: {postgres_dsn: "host=db", table: users, key: id}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    stream = parse_catalog(CONFIG).streams["users"]
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteEventLog(Path(tmp) / "log.db")
        log.ensure_topic(stream)
        position = cdc.Position(lsn=1 << 24, slot="sketchboard_users", snapshot_lsn=1 << 24, snapshot_rows=0,
                                snapshot_at_ms=0)
        log.append_at(stream, [], 0, cdc.source_id(stream), position.dump(), None)
        follower = cdc.CdcFollower(stream, log)
        ttl = cdc.POSITION_TTL_S
        print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
        for round_ in range(args.rounds):  # the two paths alternate
            for name, ttl_s in (("log (before)", 0.0), ("memory (now)", ttl)):
                cdc.POSITION_TTL_S = ttl_s
                follower.status()
                start = time.perf_counter()
                for _ in range(args.calls):
                    follower.status()
                per_call = (time.perf_counter() - start) / args.calls
                print(f"round {round_ + 1} {name:>13}: {per_call * 1e6:7.1f} us per status()")
        cdc.POSITION_TTL_S = ttl
        log.close()
    print(f"load average {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")


if __name__ == "__main__":
    main()
