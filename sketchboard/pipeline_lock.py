"""One process per pipeline name and data directory: `sketchboard pipeline` holds an exclusive
lock on `<data_dir>/checkpoints/<name>.lock` while it runs.

Two processes of one name would drive one Spark checkpoint: one dies on the other's checkpoint
files (`.tmp` renames) after both have started Spark, and until then both commit batches. The
lock is the kernel's (flock): it goes with the process, even SIGKILLed, so a crash never
leaves a stale lock to clear by hand. It guards one machine's data directory, as the checkpoint
it protects is one machine's folder; the file holds the holder's process id for the message."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


class PipelineRunning(RuntimeError):
    """Another process runs this pipeline on this data directory."""


def lock_path(checkpoint_dir: Path) -> Path:
    # Beside the checkpoint, not in it: a checkpoint folder with anything in it is not a first start
    # (sketchboard/wiring.py `starts_over`). Names have no dots, so no pipeline's folder is this file.
    return checkpoint_dir.with_name(f"{checkpoint_dir.name}.lock")


@contextlib.contextmanager
def hold_pipeline(name: str, checkpoint_dir: Path) -> Iterator[None]:
    path = lock_path(checkpoint_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise PipelineRunning(
                f"pipeline {name!r} is already running on this data directory (process {holder}; lock {path}):"
                " two processes of one pipeline would drive one checkpoint. Stop it first, or run another"
                " pipeline with `sketchboard pipeline --name`") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a starting process)
