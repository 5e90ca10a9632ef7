"""A pipeline's checkpoint, store and log that disagree (aggregates/checkpoint_checks.py; session
63's hunt): an unreadable last offset log entry is written again from the store, never read as
"no offsets" (which counted the whole log twice); a store or a log behind the checkpoint is
refused with what to do, never read past. Checkpoint files that cannot be written say which
(aggregates/checkpoint_moves.py write_whole) and a full disk is waited out."""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from aggregates.batch_gate import BatchGate
from aggregates.checkpoint_checks import CheckpointDisagrees, check_checkpoint
from aggregates.checkpoint_moves import CheckpointSpaceError, CheckpointWriteError, write_whole
from aggregates.commit_retry import Backoff
from aggregates.pipeline import PipelineConfig
from aggregates.store_commit import StoreCommitter
from catalog import Catalog
from ingest.events import EventValidator
from ingest.log import SqliteEventLog
from ingest.log.base import PartitionOffsets
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline
from store import BatchCommit

STREAM = {"key_field": "k", "partitions": 2, "dimensions": ["d"], "tiers": []}
CATALOG = {"streams": {"a": STREAM}}


def counted(store) -> int:
    return sum(p.data.count for p in store.read_panes("a", 0, 2**62))


def append(log: SqliteEventLog, catalog: Catalog, n: int, first: int) -> None:
    now = int(time.time() * 1000)
    validator = EventValidator(catalog.stream("a"))
    log.append(catalog.stream("a"), [validator.validate({"time": now, "k": f"k{first + i}", "d": "x"})
                                     for i in range(n)], now)


@pytest.mark.parametrize("damage", ["", "v1\n{}\n\x00\x01garbage{{"], ids=["empty", "garbled"])
def test_an_unreadable_last_offsets_file_is_written_again_from_the_store_and_nothing_is_counted_twice(tmp_path, damage):
    (tmp_path / "streams.yaml").write_text(yaml.safe_dump(CATALOG))
    settings = Settings(data_dir=tmp_path / "data", streams_config=tmp_path / "streams.yaml", alerts_config=None,
                        log_backend="embedded", max_records_per_batch=40)
    catalog = Catalog(**CATALOG)
    log = SqliteEventLog(tmp_path / "data" / "log.db")
    log.ensure_topic(catalog.stream("a"))
    append(log, catalog, 100, 0)
    pipeline = build_pipeline(settings, name="main")
    pipeline.run_until_drained()  # on the driver, in batches of its own: no Spark
    assert counted(pipeline.store) == 100
    pipeline.store.close()
    offsets = Path(pipeline.config.checkpoint_dir) / "offsets"
    last = max(int(p.name) for p in offsets.iterdir() if p.name.isdigit())
    before = json.loads((offsets / str(last)).read_text().splitlines()[2])
    (offsets / str(last)).write_text(damage)  # a crash that left it 0 bytes, a failed disk

    append(log, catalog, 30, 100)
    pipeline = build_pipeline(settings, name="main")
    # Written again from the end offsets the store committed with that batch, as its source writes them.
    assert json.loads((offsets / str(last)).read_text().splitlines()[2]) == before
    pipeline.run_until_drained()
    assert counted(pipeline.store) == 130  # not 100 + 130: the log read again from its start
    pipeline.store.close()
    log.close()


def stand_in(tmp_path: Path, store, ends: dict[int, int]):
    catalog = Catalog(**CATALOG)
    config = PipelineConfig(name="main", log_path=tmp_path / "log.db", checkpoint_dir=tmp_path / "cp")
    log = SimpleNamespace(offsets_of=lambda streams: {s: {p: PartitionOffsets(0, e) for p, e in ends.items()}
                                                     for s in streams})
    return SimpleNamespace(config=config, catalog=catalog, store=store, log=log)


def checkpointed(tmp_path: Path, batch: int, offsets: dict[int, int], *, committed: bool = True) -> None:
    for folder in ("offsets", "commits"):
        (tmp_path / "cp" / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / "cp" / "offsets" / str(batch)).write_text(
        "\n".join(["v1", '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}',
                   json.dumps({"a": {str(p): o for p, o in offsets.items()}})]))
    if committed:
        (tmp_path / "cp" / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def stored(store, batch: int, offsets: dict[int, int]) -> None:
    store.commit_batch(BatchCommit(pipeline="main", batch_id=batch, partials=[], events_read=0,
                                   end_offsets={"a": offsets}), lateness_ms={}, now_ms=int(time.time() * 1000))


def test_a_store_behind_the_checkpoint_is_refused(store_backend, tmp_path):
    """The store replaced by an empty file (or restored from an older copy): the batches it lacks
    were never aggregated again, silently."""
    store = store_backend.create()
    checkpointed(tmp_path, 0, {0: 300, 1: 276})
    checkpointed(tmp_path, 1, {0: 576, 1: 624})
    pipeline = stand_in(tmp_path, store, {0: 576, 1: 624})
    with pytest.raises(CheckpointDisagrees, match="the store is behind the checkpoint") as refused:
        check_checkpoint(pipeline)
    assert str(tmp_path / "cp") in str(refused.value) and "no batch" in str(refused.value)
    stored(store, 0, {0: 300, 1: 276})
    with pytest.raises(CheckpointDisagrees, match="batches up to 0"):
        check_checkpoint(pipeline)
    stored(store, 1, {0: 576, 1: 624})
    check_checkpoint(pipeline)  # they agree


def test_a_log_behind_the_checkpoint_is_refused_as_a_log_that_lost_records(store_backend, tmp_path):
    """The log's write-ahead file removed after a crash: it starts again below where the pipeline
    read, and what is appended at the offsets it lost would never be read."""
    store = store_backend.create()
    checkpointed(tmp_path, 0, {0: 576, 1: 624})
    stored(store, 0, {0: 576, 1: 624})
    check_checkpoint(stand_in(tmp_path, store, {0: 576, 1: 700}))
    with pytest.raises(CheckpointDisagrees, match="the log lost records: stream 'a' partition 1 ends at offset 0,"
                                                   " below offset 624"):
        check_checkpoint(stand_in(tmp_path, store, {0: 576, 1: 0}))


def test_an_unreadable_entry_the_store_does_not_have(store_backend, tmp_path):
    """Planned and committed by no one: removed (planned again). Committed by Spark but not by
    the store: refused, naming the file (where the pipeline stands is unknown)."""
    store = store_backend.create()
    checkpointed(tmp_path, 0, {0: 5, 1: 5})
    stored(store, 0, {0: 5, 1: 5})
    (tmp_path / "cp" / "offsets" / "1").write_text("")
    check_checkpoint(stand_in(tmp_path, store, {0: 9, 1: 9}))
    assert not (tmp_path / "cp" / "offsets" / "1").exists()
    checkpointed(tmp_path, 1, {0: 9, 1: 9})
    (tmp_path / "cp" / "offsets" / "1").write_text("")
    with pytest.raises(CheckpointDisagrees, match=f"{tmp_path / 'cp' / 'offsets' / '1'}.*not in the store"):
        check_checkpoint(stand_in(tmp_path, store, {0: 9, 1: 9}))


def test_a_checkpoint_write_that_fails_names_the_file_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    def full(fd):  # no real way to fill a disk without a mount: the flush to it fails
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointSpaceError) as failed:
        write_whole(tmp_path / "offsets" / "3", "v1")
    assert str(failed.value) == f"cannot write checkpoint {tmp_path / 'offsets' / '3'}: No space left on device"
    assert list((tmp_path / "offsets").iterdir()) == []  # neither the file nor its .tmp
    monkeypatch.undo()
    (tmp_path / "blocker").write_text("")
    with pytest.raises(CheckpointWriteError, match="cannot write checkpoint .*blocker/offsets/3") as failed:
        write_whole(tmp_path / "blocker" / "offsets" / "3", "v1")
    assert not isinstance(failed.value, CheckpointSpaceError)  # not waited out: it will not pass


def test_a_checkpoint_file_is_flushed_before_it_takes_its_name(tmp_path, monkeypatch):
    """Else a power loss can leave the name on a 0-byte file: a committed batch's entry unreadable."""
    done = []
    fsync, replace = os.fsync, Path.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (done.append("fsync"), fsync(fd))[1])
    monkeypatch.setattr(Path, "replace", lambda self, target: (done.append("rename"), replace(self, target))[1])
    write_whole(tmp_path / "offsets" / "3", "v1")
    assert done == ["fsync", "rename", "fsync"]  # the file, then the folder's entry
    assert (tmp_path / "offsets" / "3").read_text() == "v1"


def test_a_full_disk_for_checkpoint_files_is_waited_out_and_reported_as_a_store_error(tmp_path, caplog):
    reports = []
    health = SimpleNamespace(store_failing=lambda name, message, at: reports.append(("failing", message)),
                             store_recovered=lambda name, at: reports.append(("recovered", None)))
    committer = StoreCommitter(None, "main", BatchGate(), log=logging.getLogger("test"), backoff=Backoff(0.001))
    committer.health = health
    tries = []

    def write():
        tries.append(1)
        if len(tries) < 3:
            raise CheckpointSpaceError(tmp_path / "offsets" / "3", OSError(errno.ENOSPC, "No space left on device"))

    committer.write_checkpoint(3, write)
    assert len(tries) == 3
    assert reports == [("failing", f"CheckpointSpaceError: cannot write checkpoint {tmp_path / 'offsets' / '3'}:"
                                   " No space left on device")] * 2 + [("recovered", None)]
