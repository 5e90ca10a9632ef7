"""Build the parts from settings: the one place that knows every backend."""

from __future__ import annotations

from catalog import Catalog, ConfigError, load_catalog
from ingest.log import EventLog, SqliteEventLog
from sketchboard.settings import Settings
from store import PaneStore, SqlitePaneStore


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


def open_store(settings: Settings) -> PaneStore:
    if settings.store_backend == "postgres":
        from store.postgres import PostgresPaneStore

        return PostgresPaneStore(settings.postgres_dsn, pool_size=settings.postgres_pool_size)
    return SqlitePaneStore(settings.store_path, synchronous=settings.log_sync)


def open_lag_store(settings: Settings, store: PaneStore):
    from store.lag import LagStore

    # Beside the panes, with tables and a connection of its own (store/lag.py).
    return LagStore(store.side_db(), retention_ms=settings.lag_retention)


def open_health_store(settings: Settings, store: PaneStore):
    from store.health import HealthStore

    return HealthStore(store.side_db(), retention_ms=settings.lag_retention)


def build_lag_monitor(settings: Settings, catalog: Catalog, log, store, *, clock=None):
    """The lag sampler (not started: the API process starts it) and the monitor reading it."""
    import time

    from lag.report import LagMonitor
    from lag.sampler import LagSampler
    from lag.sources import EventLogLagSource, StoreCommitted

    clock = clock or time.time
    source = EventLogLagSource(log)
    lag_store = open_lag_store(settings, store)
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
    from store.alerts import AlertStore

    alert_store = AlertStore(store.side_db(), history_retention_ms=settings.alert_history_retention)
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


def open_audit_store(settings: Settings, store: PaneStore):
    from store.audit import AuditStore

    # Beside the panes, on the store's backend, with a table and a connection of its own (store/audit.py).
    return AuditStore(store.side_db(), retention_ms=settings.audit_retention)


def build_security(settings: Settings, *, reload_every_s: float = 1.0):
    """Tokens (file and settings), allowed websocket origins, CORS. Beyond loopback a token is
    always required, even after the last one is revoked."""
    from api.security.config import SecurityConfig, normalize_origins
    from api.security.exposure import is_loopback
    from api.security.token_file import TokenRegistry
    from api.security.tokens import TokenRecord

    from api.security.ratelimit import RateLimiter

    registry = TokenRegistry([TokenRecord.from_dict(entry) for entry in settings.tokens], settings.tokens_path,
                             force=not is_loopback(settings.host), reload_every_s=reload_every_s)
    requests, events = settings.rate_limit_requests, settings.rate_limit_events
    return SecurityConfig(tokens=registry,
                          allowed_origins=normalize_origins(settings.allowed_origins, "allowed_origins"),
                          cors_origins=tuple(settings.cors_origins),
                          loopback_host_when_open=True,
                          public_paths=frozenset({"/metrics"}) if settings.metrics_public else frozenset(),
                          request_limit=RateLimiter(requests, 2 * requests) if requests else None,
                          # A burst of at least one request's worth of events: max_events_per_request
                          # must stay postable (RateLimiter lets one oversized request through anyway).
                          event_limit=RateLimiter(events, max(events, settings.max_events_per_request)) if events else None,
                          json_limits=json_limits(settings))


def json_limits(settings: Settings):
    """The bounds on an event's JSON, the same for the ingest API and the Kafka source."""
    from ingest.json_limits import JsonLimits

    return JsonLimits(settings.max_json_depth, settings.max_json_string_chars, settings.max_json_int_digits)


def check_exposure(settings: Settings, security=None) -> None:
    """ConfigError when the API would listen beyond loopback with no token at all."""
    from api.security.exposure import exposure_error

    security = security or build_security(settings)
    problem = exposure_error(settings.host, security.tokens.count())
    if problem:
        raise ConfigError(problem)


def build_api(settings: Settings):
    from api.app import create_app
    from api.context import ApiContext
    from api.ws_hub import HubConfig

    security = build_security(settings)
    check_exposure(settings, security)  # before opening anything
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
        health=open_health_store(settings, store),
        alerts=build_alert_service(settings, catalog, store, lag),
        security=security,
        audit=open_audit_store(settings, store),
    )
    hub_config = HubConfig(
        poll_interval_s=settings.ws_poll_interval,
        heartbeat_interval_s=settings.ws_heartbeat_interval,
        queue_size=settings.ws_queue_size,
        max_subscriptions=settings.ws_max_subscriptions,
        message_rate=settings.ws_message_rate,
        message_burst=settings.ws_message_burst,
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
            fail_on_data_loss=settings.kafka_fail_on_data_loss, json_limits=json_limits(settings))
        extra_conf = kafka_connector_conf(settings.spark_kafka_jars, settings.spark_jars_packages)
    # Topics exist before the source asks for offsets; the driver keeps this handle to read the
    # log's end offsets at each commit (per-partition watermarks).
    log = open_log(settings, catalog)
    spark = spark or build_spark(settings.spark_master, driver_memory=settings.spark_driver_memory,
                                 extra_conf={**extra_conf, **settings.spark_conf})
    config = PipelineConfig(
        name=settings.pipeline_name,
        log_path=settings.log_path,
        checkpoint_dir=settings.checkpoint_dir,
        max_records_per_batch=settings.max_records_per_batch,
        max_records_per_task=settings.max_records_per_task,
        trigger_interval=settings.trigger_interval,
        kafka=kafka,
    )
    store = open_store(settings)
    pipeline = Pipeline(spark, catalog, store, config, log=log)
    from aggregates.progress import register

    # Spark's progress events go to the store for the API process (the name Pipeline.start gives the query).
    pipeline.progress_recorder = register(spark, open_health_store(settings, store), settings.pipeline_name,
                                          f"sketchboard-{settings.pipeline_name}")
    return pipeline


def build_session_pipelines(settings: Settings, pipeline) -> list:
    """The session-window queries (one per stream declaring `sessions`), on the main pipeline's Spark."""
    from aggregates.sessions import session_pipelines

    return session_pipelines(pipeline.spark, pipeline.catalog, lambda: open_store(settings), pipeline.config)
