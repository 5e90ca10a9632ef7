"""Build the parts from settings: the one place that knows every backend."""

from __future__ import annotations

from catalog import Catalog, load_catalog
from ingest.log import EventLog, SqliteEventLog
from sketchboard.settings import Settings
from store import SqlitePaneStore


def open_catalog(settings: Settings) -> Catalog:
    return load_catalog(settings.streams_config)


def open_log(settings: Settings, catalog: Catalog) -> EventLog:
    if settings.log_backend == "kafka":
        from ingest.log.kafka import KafkaEventLog

        log: EventLog = KafkaEventLog(
            settings.kafka_bootstrap_servers, topic_prefix=settings.kafka_topic_prefix,
            replication_factor=settings.kafka_replication_factor, options=settings.kafka_options,
            produce_timeout_ms=settings.kafka_produce_timeout,
            request_timeout_s=settings.kafka_request_timeout / 1000)
    else:
        log = SqliteEventLog(settings.log_path, synchronous=settings.log_sync)
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    return log


def open_store(settings: Settings) -> SqlitePaneStore:
    return SqlitePaneStore(settings.store_path, synchronous=settings.log_sync)


def open_lag_store(settings: Settings):
    from store.lag import SqliteLagStore

    # Same file as the pane store, own connection and tables (store/lag.py).
    return SqliteLagStore(settings.store_path, retention_ms=settings.lag_retention, synchronous=settings.log_sync)


def open_health_store(settings: Settings):
    from store.health import SqliteHealthStore

    return SqliteHealthStore(settings.store_path, retention_ms=settings.lag_retention, synchronous=settings.log_sync)


def build_lag_monitor(settings: Settings, catalog: Catalog, log, store, *, clock=None):
    """The lag sampler (not started: the API process starts it) and the monitor reading it."""
    import time

    from lag.report import LagMonitor
    from lag.sampler import LagSampler
    from lag.sources import EventLogLagSource, StoreCommitted

    clock = clock or time.time
    source = EventLogLagSource(log)
    lag_store = open_lag_store(settings)
    interval_s = settings.lag_sample_interval / 1000
    sampler = LagSampler(source, StoreCommitted(store, settings.pipeline_name), lag_store,
                         pipeline=settings.pipeline_name, streams=list(catalog.streams), interval_s=interval_s,
                         clock=clock)

    def partitions():
        return [(name, p) for name in catalog.streams for p in source.end_offsets(name)]

    return LagMonitor(lag_store, settings.pipeline_name, partitions, window=settings.lag_window,
                      interval_s=interval_s, clock=clock, sampler=sampler)


def build_alert_service(settings: Settings, catalog: Catalog, store, lag_monitor=None, *, clock=None):
    """The alert evaluator (not started: the API process starts it) with the file's rules loaded
    and the webhook notifier when a URL is set."""
    import time

    from alerts.loader import load_rules_file
    from alerts.service import AlertService
    from alerts.source import StoreAlertData
    from sketchboard.settings import DEFAULT_ALERTS
    from store.alerts import SqliteAlertStore

    alert_store = SqliteAlertStore(settings.store_path, history_retention_ms=settings.alert_history_retention,
                                   synchronous=settings.log_sync)
    notifiers = []
    if settings.alert_webhook_url:
        from alerts.webhook import WebhookNotifier

        notifiers.append(WebhookNotifier(
            settings.alert_webhook_url, timeout_s=settings.alert_webhook_timeout / 1000,
            max_attempts=settings.alert_webhook_max_attempts, backoff_s=settings.alert_webhook_backoff / 1000,
            repeat_interval_s=settings.alert_repeat_interval / 1000, external_url=settings.base_url + "/",
            memory_store=alert_store))
    service = AlertService(catalog, alert_store, StoreAlertData(catalog, store, lag_monitor),
                           default_interval_ms=settings.alert_eval_interval, notifiers=notifiers,
                           clock=clock or time.time)
    path = settings.alerts_config
    if path is not None and (path.is_file() or path != DEFAULT_ALERTS):
        service.sync_file(load_rules_file(path, catalog))  # a missing file named on purpose is an error
    return service


def build_api(settings: Settings):
    from api.app import create_app
    from api.context import ApiContext
    from api.ws_hub import HubConfig

    catalog = open_catalog(settings)
    log, store = open_log(settings, catalog), open_store(settings)
    lag = build_lag_monitor(settings, catalog, log, store)
    ctx = ApiContext(
        catalog=catalog,
        log=log,
        store=store,
        pipeline_name=settings.pipeline_name,
        max_body_bytes=settings.max_body_bytes,
        max_events_per_request=settings.max_events_per_request,
        query_max_points=settings.query_max_points,
        lag=lag,
        health=open_health_store(settings),
        alerts=build_alert_service(settings, catalog, store, lag),
    )
    hub_config = HubConfig(
        poll_interval_s=settings.ws_poll_interval,
        heartbeat_interval_s=settings.ws_heartbeat_interval,
        queue_size=settings.ws_queue_size,
        max_subscriptions=settings.ws_max_subscriptions,
        max_points=settings.query_max_points,
    )
    return create_app(ctx, hub_config=hub_config), ctx


def build_pipeline(settings: Settings, spark=None):
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.spark import build_spark, kafka_connector_conf

    catalog = open_catalog(settings)
    kafka = None
    extra_conf: dict[str, str] = {}
    if settings.log_backend == "kafka":
        from ingest.kafka_source import KafkaSourceConfig

        kafka = KafkaSourceConfig(
            bootstrap_servers=settings.kafka_bootstrap_servers, topic_prefix=settings.kafka_topic_prefix,
            kafka_options=settings.kafka_options, source_options=settings.kafka_source_options,
            fail_on_data_loss=settings.kafka_fail_on_data_loss)
        extra_conf = kafka_connector_conf(settings.spark_kafka_jars, settings.spark_jars_packages)
    open_log(settings, catalog).close()  # topics exist before the source asks for offsets
    spark = spark or build_spark(settings.spark_master, driver_memory=settings.spark_driver_memory,
                                 extra_conf=extra_conf)
    config = PipelineConfig(
        name=settings.pipeline_name,
        log_path=settings.log_path,
        checkpoint_dir=settings.checkpoint_dir,
        max_records_per_batch=settings.max_records_per_batch,
        max_records_per_task=settings.max_records_per_task,
        trigger_interval=settings.trigger_interval,
        kafka=kafka,
    )
    pipeline = Pipeline(spark, catalog, open_store(settings), config)
    from aggregates.progress import register

    # Spark's progress events go to the store for the API process (the name Pipeline.start gives the query).
    pipeline.progress_recorder = register(spark, open_health_store(settings), settings.pipeline_name,
                                          f"sketchboard-{settings.pipeline_name}")
    return pipeline


def build_session_pipelines(settings: Settings, pipeline) -> list:
    """The session-window queries (one per stream declaring `sessions`), on the main pipeline's Spark."""
    from aggregates.sessions import session_pipelines

    return session_pipelines(pipeline.spark, pipeline.catalog, lambda: open_store(settings), pipeline.config)
