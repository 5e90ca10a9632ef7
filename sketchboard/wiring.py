"""Build the parts from settings: the one place that knows every backend."""

from __future__ import annotations

from catalog import Catalog, load_catalog
from ingest.log import SqliteEventLog
from sketchboard.settings import Settings
from store import SqlitePaneStore


def open_catalog(settings: Settings) -> Catalog:
    return load_catalog(settings.streams_config)


def open_log(settings: Settings, catalog: Catalog) -> SqliteEventLog:
    log = SqliteEventLog(settings.log_path, synchronous=settings.log_sync)
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    return log


def open_store(settings: Settings) -> SqlitePaneStore:
    return SqlitePaneStore(settings.store_path, synchronous=settings.log_sync)


def build_api(settings: Settings):
    from api.app import create_app
    from api.context import ApiContext

    catalog = open_catalog(settings)
    ctx = ApiContext(
        catalog=catalog,
        log=open_log(settings, catalog),
        store=open_store(settings),
        pipeline_name=settings.pipeline_name,
        max_body_bytes=settings.max_body_bytes,
        max_events_per_request=settings.max_events_per_request,
        query_max_points=settings.query_max_points,
    )
    return create_app(ctx), ctx


def build_pipeline(settings: Settings, spark=None):
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.spark import build_spark

    catalog = open_catalog(settings)
    open_log(settings, catalog).close()  # topics exist before the source asks for offsets
    spark = spark or build_spark(settings.spark_master, driver_memory=settings.spark_driver_memory)
    config = PipelineConfig(
        name=settings.pipeline_name,
        log_path=settings.log_path,
        checkpoint_dir=settings.checkpoint_dir,
        max_records_per_batch=settings.max_records_per_batch,
        max_records_per_task=settings.max_records_per_task,
        trigger_interval=settings.trigger_interval,
    )
    return Pipeline(spark, catalog, open_store(settings), config)


def build_session_pipelines(settings: Settings, pipeline) -> list:
    """The session-window queries (one per stream declaring `sessions`), on the main pipeline's Spark."""
    from aggregates.sessions import session_pipelines

    return session_pipelines(pipeline.spark, pipeline.catalog, lambda: open_store(settings), pipeline.config)
