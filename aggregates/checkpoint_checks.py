"""Before a pipeline reads anything: do its checkpoint, its store and its log agree on where it stands?

The checkpoint (Spark's offset and commit logs, `offsets/<n>` and `commits/<n>`) says where the
next batch starts; the store records each batch's id and end offsets in the batch's transaction
(`PaneStore.progress(name)`: its last batch id and, per partition, the newest end offset it
committed). Three ways they can disagree, each of which used to be silent:

- the last batch's offset log entry is unreadable (a crash that left it 0 bytes, a failed disk):
  read as "no offsets", the next batch started at the log's start and counted everything again.
  Where the store committed that batch, its end offsets are the store's: the entry is written
  again from them (and Spark's own query, which would fail on the entry, resumes from it too). An
  entry of a batch that was planned and neither committed by Spark nor by the store is removed (it
  is planned again, as `settle_last_batch` does). Anything else is refused: where it stands is unknown.
- the store is behind the checkpoint (replaced by an empty file, restored from a backup): the
  batches it lacks would never be read again. Refused.
- the log is behind the checkpoint (its write-ahead file lost after a crash, a topic recreated):
  records appended at the offsets it lost would never be read. Refused, as Spark's Kafka source
  refuses with failOnDataLoss.

A refusal is `CheckpointDisagrees`, whose message names what disagrees and what to do."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from aggregates.checkpoint_moves import logged_batches, write_whole
from aggregates.commit import UnreadableOffsets
from ingest.log import LogUnavailable

log = logging.getLogger("sketchboard.pipeline")

Offsets = dict[str, dict[int, int]]

START_OVER = ("to rebuild the store from what the log holds, stop the pipeline and start it over: delete its"
              " checkpoint folder {checkpoint}{and_store} (docs/robustness.md, \"Checkpoint, store and log disagree\")")


class CheckpointDisagrees(RuntimeError):
    """The pipeline's checkpoint, store and log disagree on where it stands: it does not start."""


def check_checkpoint(pipeline) -> None:
    """Repair or refuse (the module doc) before the pipeline's first batch, on every path (the
    driver's batches and Spark's query alike: `sketchboard/wiring.py build_pipeline`)."""
    from aggregates.pipeline import batch_end_offsets

    config, catalog, store = pipeline.config, pipeline.catalog, pipeline.store
    checkpoint = Path(config.checkpoint_dir)
    offsets_dir, commits_dir = checkpoint / "offsets", checkpoint / "commits"
    progress = store.progress(config.name, row_counts=False)
    stored_last, stored = progress.last_batch_id, progress.end_offsets
    empty_store = stored_last is None
    how = START_OVER.format(checkpoint=checkpoint,
                            and_store="" if empty_store else " and the store's data of this pipeline")

    committed = set(logged_batches(commits_dir))
    last: Offsets | None = None  # the end offsets of the last batch Spark committed
    for batch in reversed(logged_batches(offsets_dir)):
        try:
            offsets = batch_end_offsets(config, catalog, checkpoint, batch)
        except UnreadableOffsets as exc:
            if stored_last is not None and stored_last >= batch:
                _rewrite(pipeline, batch, {s: p for s, p in stored.items() if s in catalog.streams}, offsets_dir)
                log.warning("%s; the store committed batch %d: written again from the end offsets the store"
                            " recorded with it", exc, batch)
                offsets = {s: dict(p) for s, p in stored.items()}
            elif batch not in committed:
                (offsets_dir / str(batch)).unlink(missing_ok=True)
                (offsets_dir / f".{batch}.crc").unlink(missing_ok=True)
                log.warning("%s; batch %d was neither committed by Spark nor by the store: removed, it is planned"
                            " again", exc, batch)
                continue
            else:
                raise CheckpointDisagrees(
                    f"{exc}; batch {batch} is committed in the checkpoint but not in the store (its last batch:"
                    f" {stored_last}), so where the pipeline stands is unknown; {how}") from exc
        if batch in committed or (stored_last is not None and stored_last >= batch):
            last = offsets
            break
        # Planned, not committed: the batch before tells where the pipeline stands.

    if last is not None:
        behind = _ahead(last, stored)
        if behind and (stored_last is None or stored_last < max(committed, default=-1)):
            stream, partition, at = behind[0]
            raise CheckpointDisagrees(
                f"the store is behind the checkpoint of pipeline {config.name!r}: the checkpoint {checkpoint}"
                f" committed batch {max(committed)} (stream {stream!r} partition {partition} read to offset {at}),"
                f" the store has {'no batch' if empty_store else f'batches up to {stored_last}'}"
                f" ({'nothing' if stream not in stored or partition not in stored[stream] else f'offset {stored[stream][partition]}'}"
                f" there): the store lost batches (replaced or restored from an older copy), and what they"
                f" counted would never be counted again; {how}")
    committed_offsets = _newest(last or {}, stored)
    if not committed_offsets:
        return
    try:
        ends = pipeline.log.offsets_of([s for s in catalog.streams if s in committed_offsets])
    except LogUnavailable as exc:  # the broker away: the batches wait for it anyway
        log.warning("cannot check the log's end offsets against the checkpoint (%s)", exc)
        return
    for stream, parts in sorted(ends.items()):
        for partition, offsets in sorted(parts.items()):
            at = committed_offsets.get(stream, {}).get(partition)
            if at is not None and offsets.end < at:
                raise CheckpointDisagrees(
                    f"the log lost records: stream {stream!r} partition {partition} ends at offset {offsets.end},"
                    f" below offset {at} that pipeline {config.name!r} has read to (its checkpoint {checkpoint} and"
                    f" its store): the log was replaced, or lost its latest writes (a write-ahead file removed"
                    f" after a crash); records appended at offsets {offsets.end}..{at - 1} from now on would never be"
                    f" read. Nothing was read; {how}")


def _ahead(checkpointed: Mapping[str, Mapping[int, int]], stored: Mapping[str, Mapping[int, int]]) -> list:
    """(stream, partition, offset) where the checkpoint has read further than the store committed
    (a partition the store has no offset of: from 0)."""
    return [(s, p, at) for s, parts in sorted(checkpointed.items()) for p, at in sorted(parts.items())
            if at > stored.get(s, {}).get(p, 0)]


def _newest(a: Mapping[str, Mapping[int, int]], b: Mapping[str, Mapping[int, int]]) -> Offsets:
    out: Offsets = {s: dict(p) for s, p in a.items()}
    for stream, parts in b.items():
        for partition, at in parts.items():
            out.setdefault(stream, {})[partition] = max(at, out.get(stream, {}).get(partition, at))
    return out


def _rewrite(pipeline, batch: int, offsets: Mapping[str, Mapping[int, int]], offsets_dir: Path) -> None:
    """The offset log entry of `batch` written again with `offsets`, in the text its source logs
    (aggregates/bounded_batches.py `own_batches`), with the metadata line of a batch logged before
    it where one is readable."""
    from aggregates.bounded_batches import offset_log_text
    from ingest.spark_source import offsets_text

    metadata = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}},
                          separators=(",", ":"))
    for before in reversed([b for b in logged_batches(offsets_dir) if b < batch]):
        try:
            lines = (offsets_dir / str(before)).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        if len(lines) >= 2 and lines[1].startswith("{"):
            metadata = lines[1]
            break
    config = pipeline.config
    if config.kafka is not None:
        text = offset_log_text(offsets, config.kafka.topic_prefix, metadata)
    else:
        text = "\n".join(["v1", metadata, offsets_text(offsets)])
    write_whole(offsets_dir / str(batch), text)
    (offsets_dir / f".{batch}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the old file
