"""`sketchboard pipeline --name NAME --remove`: a named pipeline (fan-out, docs/scale-out.md)
gone for good, as `kafka-consumer-groups --delete` removes a consumer group.

Stopping a named pipeline left its record in the consumer registry: `GET /api/v1/lag` and
/metrics showed it STOP for ever, lag alerts on it fired for ever, and the embedded log's
compaction kept every tombstone it had not read (sketchboard/retention.py). Removing it takes
its record, its Spark checkpoint and its output (its store namespace) away together, so no part
of it is left to mislead: a name started again later starts over, from `--from`."""

from __future__ import annotations

import shutil

from sketchboard.settings import Settings


class RemoveRefused(ValueError):
    """Not a pipeline that can be removed (the serving one, an unknown name)."""


def remove_pipeline(settings: Settings, name: str) -> list[str]:
    """Remove named pipeline `name`: what was removed, in words. PipelineRunning while it runs
    on this data directory; RemoveRefused for the serving pipeline or a name nothing knows."""
    from sketchboard.pipeline_lock import hold_pipeline
    from sketchboard.reprocess import reprocess_outputs
    from sketchboard.wiring import open_consumer_registry, open_store, store_namespace
    from store.namespace import PREVIOUS_PREFIX, RUN_PREFIX, describe

    if name == settings.pipeline_name:
        raise RemoveRefused(f"{name!r} is the serving pipeline (setting pipeline_name): the API serves its output")
    checkpoint = settings.checkpoint_dir_of(name)
    with hold_pipeline(name, checkpoint):  # refused while it runs here; none starts meanwhile
        root = open_store(settings)
        try:
            registry = open_consumer_registry(settings, root)
            consumers = registry.consumers()
            known = any(c.pipeline == name for c in consumers)
            namespace = store_namespace(settings, name)
            storage = reprocess_outputs(settings).storage
            has_output = storage.exists(namespace)
            if not (known or has_output or checkpoint.exists()):
                others = ", ".join(repr(c.pipeline) for c in consumers if c.pipeline != settings.pipeline_name
                                   and not c.pipeline.startswith((RUN_PREFIX, PREVIOUS_PREFIX)))
                raise RemoveRefused(f"no pipeline named {name!r} here (named pipelines: {others or 'none'})")
            removed = []
            if has_output:
                storage.drop(namespace)
                removed.append(f"its output ({describe(namespace)})")
            if checkpoint.exists():
                shutil.rmtree(checkpoint)
                removed.append(f"its checkpoint ({checkpoint})")
            if known:
                registry.forget(name)
                removed.append("its record in the consumer registry (its lag)")
            return removed
        finally:
            root.close()
