"""How long a synchronized switch delays the serving pipeline's commit beyond the hold itself
(docs/benchmarks.md, "how long a synchronized switch holds the serving pipeline"): a real SQLite
store, a hold set for H seconds (what the run's final batch takes) by another thread, and the
serving pipeline's committer (aggregates/store_commit.py) committing a batch meanwhile, as its
foreachBatch would. Side by side, alternating: the committer as before (the hold waited out with
the store-error back-off: 0.5 s, 1 s, 2 s, ... up to 30 s) and now (the back-off cut short by a
poll of the hold). No Spark: the switch's own time is not what is measured, the delay after it is.

    .venv/bin/python -m bench.switch_hold --holds 1.2 5.2 12 --rounds 2
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from aggregates.batch_gate import BatchGate
from aggregates.store_commit import StoreCommitter
from catalog import Catalog
from catalog.versions import catalog_versions
from store.base import BatchCommit, PanePartial
from store.definitions import DefinitionStore
from store.panes import PaneData
from store.sqlite import SqlitePaneStore

CATALOG = Catalog(streams={"http": {"key_field": "user"}})
NOW = 1_800_000_000_000


def one(store: SqlitePaneStore, batch_id: int, hold_s: float, poll: bool) -> float:
    """Seconds from the hold's release to the held batch's commit."""
    holds = DefinitionStore(store.side_db())
    holds._conn.execute("INSERT INTO switch_holds (pipeline, run_id, at_ms) VALUES ('main', 'bench', 0)")
    released = {}

    def release() -> None:
        time.sleep(hold_s)
        holds._conn.execute("DELETE FROM switch_holds WHERE pipeline = 'main'")
        released["at"] = time.monotonic()

    committer = StoreCommitter(store, "main", BatchGate(), log=logging.getLogger("bench"))
    if not poll:  # as before: the hold waited out with the plain back-off
        committer._wait_held = committer.gate.sleep
    releaser = threading.Thread(target=release)
    releaser.start()
    commit = BatchCommit(pipeline="main", batch_id=batch_id,
                         partials=[PanePartial("http", NOW, NOW + 10_000, {}, PaneData(count=1))], events_read=1,
                         max_event_ms={"http": NOW}, end_offsets={"http": {0: batch_id + 1}},
                         definition_versions=catalog_versions(CATALOG))
    committer.commit(commit, lateness_ms={"http": 0}, retention_ms={"http": 10 * 86_400_000})
    done = time.monotonic()
    releaser.join()
    holds.close()
    return done - released["at"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holds", type=float, nargs="+", default=[1.2, 5.2, 12.0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlitePaneStore(Path(tmp) / "store.db")
        DefinitionStore(store.side_db()).close()  # makes switch_holds
        batch_id = 0
        print(f"load average: {os.getloadavg()}")
        for hold_s in args.holds:
            for r in range(args.rounds):
                for poll in ((False, True) if r % 2 == 0 else (True, False)):
                    late = one(store, batch_id, hold_s, poll)
                    batch_id += 1
                    print(f"hold {hold_s:5.1f} s  {'now (poll)' if poll else 'before (back-off)':18s}"
                          f"  committed {late:6.2f} s after the release", flush=True)
        print(f"load average: {os.getloadavg()}")
        store.close()


if __name__ == "__main__":
    main()
