"""Which definition a pipeline computes a stream with (issue 16; docs/reprocessing.md).

Each store namespace remembers the definitions its output was built with (store/definitions.py).
A pipeline records the ones its namespace lacks and, for a stream whose configured definition
differs from the stored one, goes on with the stored one and says so: the output keeps one
meaning until a reprocessing run has built the new one beside it and a switch changes the
stored definition."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from catalog import Catalog
from catalog.versions import changed_streams, definition_version, pinned_catalog, short_version, stream_document, \
    versioned_streams
from store import PaneStore
from store.definitions import DefinitionStore

logger = logging.getLogger("sketchboard.definitions")


def pin_definitions(store: PaneStore, catalog: Catalog, pipeline: str,
                    clock: Callable[[], float] = time.time) -> Catalog:
    """The catalog `pipeline` computes its namespace (`store`) with: the configured one, with each
    changed stream as stored. Records the definitions of streams new to the namespace."""
    definitions = DefinitionStore(store.side_db())
    try:
        current = {name: (definition_version(s, catalog), stream_document(s, catalog)) for name, s in versioned_streams(catalog).items()}
        stored = definitions.record_missing(current, int(clock() * 1000))
    finally:
        definitions.close()
    changes = changed_streams(catalog, {name: d.version for name, d in stored.items()})
    for stream, (old, new) in sorted(changes.items()):
        logger.warning(
            "stream %r: its definition changed (version %s -> %s); pipeline %r keeps computing it with the stored"
            " definition %s so its output keeps one meaning: `sketchboard reprocess %s` builds the new output from"
            " the log beside it", stream, short_version(old), short_version(new), pipeline, short_version(old), stream)
    return pinned_catalog(catalog, {name: stored[name].definition for name in changes},
                          {name: stored[name].version for name in changes})


def apply_offset_moves(store: PaneStore, pipeline: str, checkpoint_dir, *, kafka_prefix: str | None) -> None:
    """Before the serving pipeline starts: the offsets a switch moved (store/switch.py) go into
    its Spark checkpoint (aggregates/checkpoint_moves.py), so it reads each switched stream from
    where the new output's pipeline stopped, with the new definition."""
    from aggregates.checkpoint_moves import move_offsets

    definitions = DefinitionStore(store.side_db())
    try:
        moves = definitions.offset_moves(pipeline)
        if not moves:
            return
        if kafka_prefix is None:
            keyed = moves
        else:
            from ingest.log.kafka import topic_name

            keyed = {topic_name(kafka_prefix, stream): offsets for stream, offsets in moves.items()}
        batch = move_offsets(checkpoint_dir, keyed, store.last_batch_id(pipeline))
        for stream, offsets in sorted(moves.items()):
            if batch is not None:
                logger.info("stream %r was switched: pipeline %r reads it from %s on (checkpoint batch %d)", stream,
                            pipeline, dict(sorted(offsets.items())), batch)
            definitions.moved(pipeline, stream)
    finally:
        definitions.close()


def switched(error: BaseException | object) -> bool:
    """Whether a query failed because a switch fenced its batch (store.switch.DefinitionSwitched):
    Spark hands the Python error back as text inside its own exception."""
    return "DefinitionSwitched" in str(error) or "was switched to another definition" in str(error)
