"""Moving a stream's offsets in a query's Spark checkpoint (issue 16: after a switch).

A switch makes another output the served one (store/switch.py); the serving pipeline must then
read that stream from where the new output's pipeline stopped, with the new definition, while
its other streams go on where they were. Spark keeps one offset log per query (its sources'
offsets per batch: `offsets/<batch>`, 'v1' / metadata / one JSON line per source, and
`commits/<batch>` for the batches done), so the move is written there, before the query starts:

- the last planned batch N is settled first: committed by the store (its batch id is there) but
  not by Spark, it gets its Spark commit; not committed by the store, its plan is removed (Spark
  plans it again: nothing of it was stored, so nothing is lost or counted twice);
- then batch N + 1 is logged as planned and done, with N's offsets but the moved stream's
  replaced: Spark plans N + 2 from there. The store never sees N + 1 (batch ids may have gaps).

Works for both sources: the embedded log's offsets are keyed by stream, Kafka's by topic (the
caller says which key the stream has). Plain files: no Spark needed."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Mapping
from pathlib import Path

_COMMIT = 'v1\n{"nextBatchWatermarkMs":0}'


def logged_batches(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def move_offsets(checkpoint_dir: Path, moves: Mapping[str, Mapping[int, int]], store_last_batch: int | None) -> int | None:
    """Log a batch whose offsets are the last batch's with `moves` ({source key: {partition:
    offset}}) applied; returns its id, None when the query has no batch logged yet (its first
    batch then starts where the source starts: the caller must not need a move)."""
    offsets_dir, commits_dir = Path(checkpoint_dir) / "offsets", Path(checkpoint_dir) / "commits"
    last = settle_last_batch(checkpoint_dir, store_last_batch)
    if last is None:
        return None
    lines = (offsets_dir / str(last)).read_text(encoding="utf-8").splitlines()
    # One source here (the pipeline reads one): its offsets are the third line.
    offsets = json.loads(lines[2])
    for key, partitions in moves.items():
        moved = dict(offsets.get(key, {}))
        moved.update({str(p): int(o) for p, o in partitions.items()})
        offsets[key] = moved
    lines[2] = json.dumps(offsets, separators=(",", ":"), sort_keys=True)
    batch = last + 1
    write_whole(offsets_dir / str(batch), "\n".join(lines))
    existing = sorted(p for p in commits_dir.iterdir() if p.name.isdigit()) if commits_dir.is_dir() else []
    template = existing[-1].read_text(encoding="utf-8") if existing else _COMMIT
    write_whole(commits_dir / str(batch), template)
    return batch


def settle_last_batch(checkpoint_dir: Path, store_last_batch: int | None, *, commit: bool = True) -> int | None:
    """Settle the last batch the query logged and Spark did not commit: committed by the store (its
    batch id is there), it gets its Spark commit (`commit`; else Spark runs it again, and the
    pipeline skips it); not, its plan is removed, so the next batch is planned again from the batch
    before (nothing of it was stored: nothing is lost or counted twice). Returns the last logged
    batch after that, None when there is none."""
    offsets_dir, commits_dir = Path(checkpoint_dir) / "offsets", Path(checkpoint_dir) / "commits"
    committed = set(logged_batches(commits_dir))
    for last in reversed(logged_batches(offsets_dir)):
        if last in committed:
            return last
        if store_last_batch is not None and store_last_batch >= last:
            if commit:
                write_whole(commits_dir / str(last), _COMMIT)
            return last
        (offsets_dir / str(last)).unlink()
        (offsets_dir / f".{last}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the removed file
    return None


def purge_before(checkpoint_dir: Path, threshold: int) -> None:
    """Remove the offset log's and commit log's entries of batches before `threshold`, as Spark's
    own query does after each batch (`spark.sql.streaming.minBatchesToRetain` kept): batches of
    our own (aggregates/bounded_batches.py) would otherwise leave two files per batch for ever."""
    for folder in (Path(checkpoint_dir) / "offsets", Path(checkpoint_dir) / "commits"):
        for batch in logged_batches(folder):
            if batch >= threshold:
                break
            (folder / str(batch)).unlink(missing_ok=True)
            (folder / f".{batch}.crc").unlink(missing_ok=True)  # Hadoop's checksum, where Spark wrote the file


class CheckpointWriteError(OSError):
    """A checkpoint file that could not be written (nothing of it is left: no half file, no .tmp)."""

    def __init__(self, path: Path, error: OSError):
        super().__init__(error.errno, f"cannot write checkpoint {path}: {error.strerror or error}")
        self.path = path

    def __str__(self) -> str:
        return self.strerror


class CheckpointSpaceError(CheckpointWriteError):
    """A checkpoint write that failed for a reason that passes (the disk full, an I/O error): the
    driver's batches retry it with back-off, as a store commit (aggregates/bounded_batches.py)."""


# Errors of the disk, not of the checkpoint: the same write can succeed later.
PASSING_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT})


def write_whole(path: Path, text: str) -> None:
    """Written whole or not at all: a crash leaves no half file for Spark to read. The file is
    flushed to the disk before it takes its name, and the folder after (else a power loss can leave
    the name on a 0-byte file: the offset log entry of a committed batch unreadable). A failure
    raises CheckpointWriteError (CheckpointSpaceError for a full disk or an I/O error) naming the
    file, with the temporary file removed."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        _fsync_folder(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):  # none made (no folder), or the same disk failing: the error is the news
            tmp.unlink(missing_ok=True)
        kind = CheckpointSpaceError if exc.errno in PASSING_ERRNOS else CheckpointWriteError
        raise kind(path, exc) from exc


def _fsync_folder(folder: Path) -> None:
    """The folder's entries to the disk (the rename above); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
