"""Build the parts from settings: the one place that knows every backend."""

from __future__ import annotations

import logging
import os

from catalog import Catalog, ConfigError, load_catalog
from ingest.log import EventLog, SqliteEventLog
from sketchboard.settings import Settings
from store import PaneStore, SqlitePaneStore
from store.namespace import ROOT, check_pipeline_name, namespace_of, sqlite_store_path

logger = logging.getLogger("sketchboard.wiring")


def open_catalog(settings: Settings) -> Catalog:
    catalog = load_catalog(settings.streams_config)
    if settings.demo_postgres_dsn:  # the demo's tables come from PostgreSQL (demo/pg_tables.py)
        from demo.pg_tables import fed_catalog

        try:
            catalog = fed_catalog(catalog, settings.demo_postgres_dsn)
        except ValueError as exc:
            raise ConfigError(f"demo_postgres_dsn: {exc}") from exc
    return catalog


def open_log(settings: Settings, catalog: Catalog) -> EventLog:
    """The log, its topics made where missing (Kafka's read committed records only, as Spark's
    Kafka source reads them: ingest/log/kafka.py)."""
    if settings.log_backend == "kafka":
        from ingest.log.kafka import KafkaEventLog

        log: EventLog = KafkaEventLog(
            settings.kafka_bootstrap_servers, topic_prefix=settings.kafka_topic_prefix,
            replication_factor=settings.kafka_replication_factor, options=settings.kafka_options,
            produce_timeout_ms=settings.kafka_produce_timeout,
            request_timeout_s=settings.kafka_request_timeout / 1000, json_limits=json_limits(settings))
    else:
        log = SqliteEventLog(settings.log_path, synchronous=settings.log_sync)
    for stream in catalog.streams.values():
        log.ensure_topic(stream)
    return log


def store_namespace(settings: Settings, pipeline: str | None = None) -> str:
    """Where a pipeline's output lives (store/namespace.py): the root for the serving pipeline."""
    return namespace_of(pipeline or settings.pipeline_name, settings.pipeline_name)


def open_store(settings: Settings, namespace: str = ROOT) -> PaneStore:
    """The store's root (the serving pipeline's output, what the API serves) or a named
    pipeline's namespace: its own SQLite file, or its own PostgreSQL schema."""
    if settings.store_backend == "postgres":
        from store.postgres import PostgresPaneStore
        from store.postgres.schema import drop_schema_if_empty, namespace_dsn

        if namespace == ROOT:
            return PostgresPaneStore(settings.postgres_dsn, pool_size=settings.postgres_pool_size)
        made = namespace_dsn(settings.postgres_dsn, namespace)
        try:
            return PostgresPaneStore(made.dsn, pool_size=2)
        except Exception:
            if made.created:  # no empty schema left behind, listed as a namespace that never opened
                drop_schema_if_empty(settings.postgres_dsn, made.schema)
            raise
    return SqlitePaneStore(sqlite_store_path(settings.data_dir, namespace), synchronous=settings.log_sync)


def open_consumer_registry(settings: Settings, root_store: PaneStore):
    from store.consumers import ConsumerRegistry

    # In the root, beside the serving pipeline's tables, with a connection of its own.
    return ConsumerRegistry(root_store.side_db())


def open_lag_store(settings: Settings, store: PaneStore):
    from store.lag import LagStore

    # Beside the panes, with tables and a connection of its own (store/lag.py).
    return LagStore(store.side_db(), retention_ms=settings.lag_retention)


def open_point_cache(catalog: Catalog, store: PaneStore):
    from store.final_points import FinalPoints
    from store.point_cache import PointCache
    from store.tiers import catalog_layouts

    # Final points also kept in the store (store/final_points.py), as long as the longest-kept rows.
    keep = max((max([layout.retention_ms, *(k for _, k in layout.granules)])
                for layout in catalog_layouts(catalog).values()), default=None)
    return PointCache(backing=FinalPoints(store.side_db(), writer=store.side_db(), retention_ms=keep))


def snapshot_workers(settings: Settings):
    from functools import partial

    from api.ws_workers import SnapshotWorkers

    if not settings.ws_snapshot_workers:
        return None
    return SnapshotWorkers(partial(_snapshot_worker, settings), settings.ws_snapshot_workers)


def point_warmer(settings: Settings, ctx):
    """The dashboards' panels computed ahead of their first query (api/point_warmer.py), by the
    leader replica, in a snapshot worker where there is one; None when point_warm_interval is 0."""
    from api.point_warmer import PointWarmer
    from dashboard.views import declared_queries
    from query.standard_views import StandardViews

    if not settings.point_warm_interval or (ctx.dashboards is None and not settings.point_warm_standard):
        return None

    def views(now_ms: int):
        if ctx.dashboards is None:
            return []
        # Resolved as the queries they warm for are (api/served_catalog.py): a panel the served output
        # cannot answer until a switch is skipped, not warmed with points read another way.
        # Checked against the configuration, as the dashboards are (dashboard/service.py).
        return declared_queries([d.definition for d in ctx.dashboards.dashboards()], ctx.served_catalog(),
                                now_ms=now_ms, max_points=ctx.query_max_points, checked_against=ctx.catalog)

    # Of the served catalog too: a stream computed as stored until a switch is warmed as it is read.
    standard = StandardViews(ctx.served_catalog, max_points=ctx.query_max_points) if settings.point_warm_standard else None
    return PointWarmer(ctx.store, views, interval_s=settings.point_warm_interval, max_points=ctx.query_max_points,
                       cache=ctx.point_cache, workers=ctx.snapshot_workers, clock=ctx.clock,
                       active=ctx.leadership.leading, standard=standard)


def _snapshot_worker(settings: Settings):
    import os

    from sketchboard import parent_death

    parent_death.watch_parent(os.getppid())  # stop with the API process, even if it is SIGKILLed
    return snapshot_worker_state(settings)


def snapshot_worker_state(settings: Settings):
    """What a websocket snapshot worker process opens (api/ws_workers.py): a store connection of
    its own and a point cache keeping its final points in the store, where REST reads them."""
    store = open_store(settings)
    return store, open_point_cache(open_catalog(settings), store)


def open_health_store(settings: Settings, store: PaneStore):
    from store.health import HealthStore

    return HealthStore(store.side_db(), retention_ms=settings.lag_retention)


def build_lag_monitor(settings: Settings, catalog: Catalog, log, store, *, clock=None):
    """The lag sampler (not started: the API process starts it) and the monitor reading it."""
    import time

    from lag.report import LagMonitor
    from lag.sampler import LagSampler
    from lag.sources import EventLogLagSource, ReadCommitted, StoreCommitted, registry_committed

    from aggregates.reprocess import streams_read
    from store.definitions import DefinitionStore

    clock = clock or time.time
    source = EventLogLagSource(log)
    lag_store = open_lag_store(settings, store)
    interval_s = settings.lag_sample_interval / 1000
    registry = open_consumer_registry(settings, store)
    definitions = DefinitionStore(store.side_db())  # the runs: what each reads

    def reads(pipeline: str):
        # A run is sampled and judged on the streams it reads only: on the others its lag would
        # be their whole log, never read, and its status STOP.
        return streams_read(definitions, registry, pipeline)

    def others():
        # Fan-out: every other named pipeline of the log, from the copies of its offsets (all read
        # at once, when the sampler asks at the start of its round).
        return {name: ReadCommitted(committed) for name, committed in registry_committed(registry).items()
                if name != settings.pipeline_name}

    sampler = LagSampler(source, StoreCommitted(store, settings.pipeline_name, registry), lag_store,
                         pipeline=settings.pipeline_name, streams=list(catalog.streams), interval_s=interval_s,
                         clock=clock, others=others, reads=reads)

    def partitions():
        return [(name, p) for name in catalog.streams for p in source.end_offsets(name)]

    return LagMonitor(lag_store, settings.pipeline_name, partitions, window=settings.lag_window,
                      interval_s=interval_s, clock=clock, sampler=sampler, registry=registry, reads=reads,
                      pane_store=store)


def build_alert_service(settings: Settings, catalog: Catalog, store, lag_monitor=None, *, clock=None,
                        active=None, served=None):
    """The alert evaluator (not started: the API process starts it) with the file's rules loaded
    and the webhook notifier when a URL is set; `active()` says whether this replica may notify
    (it holds the leader lease: sketchboard/leader.py), None: always. `served(catalog)`: the
    catalog rules read the root's output by (api/served_catalog.py); None: `catalog`."""
    import time

    from alerts.loader import load_rules_file
    from alerts.service import AlertService
    from alerts.source import StoreAlertData
    from store.alerts import AlertStore

    alert_store = AlertStore(store.side_db(), history_retention_ms=settings.alert_history_retention)
    notifiers = []
    if settings.alert_webhook_url:
        from alerts.webhook import WebhookNotifier

        notifiers.append(WebhookNotifier(
            settings.alert_webhook_url, timeout_s=settings.alert_webhook_timeout / 1000,
            max_attempts=settings.alert_webhook_max_attempts, backoff_s=settings.alert_webhook_backoff / 1000,
            repeat_interval_s=settings.alert_repeat_interval / 1000, external_url=settings.base_url + "/",
            memory_store=alert_store, active=active,
            close_timeout_s=settings.alert_webhook_shutdown_timeout / 1000))
    service = AlertService(catalog, alert_store, StoreAlertData(catalog, store, lag_monitor, served=served),
                           default_interval_ms=settings.alert_eval_interval, notifiers=notifiers,
                           clock=clock or time.time, served=served)
    path = alerts_file(settings)
    if path is not None:
        service.sync_file(load_rules_file(path, catalog))
    return service


def alerts_file(settings: Settings):
    """The alert rules file to load (the API and check-config alike): the one named (alerts_config),
    else alerts.yaml beside the streams file when there is one; None: no file rules. A file named
    on purpose that is missing or not a file is a ConfigError, not a start without its rules."""
    path = settings.alerts_config
    if path is None:
        return None
    if not settings.alerts_config_named:
        return path if path.is_file() else None
    if not path.exists():
        raise ConfigError(f"alerts_config: {path}: no such file")
    if not path.is_file():
        raise ConfigError(f"alerts_config: {path}: not a file")
    return path


def dashboards_folder(settings: Settings):
    """The provisioned dashboards' folder: the one named, else `dashboards/` beside the streams
    file (the demo's config/dashboards), None when that does not exist."""
    if settings.dashboards_config is not None:
        return settings.dashboards_config  # named on purpose: a missing folder is an error
    beside = settings.streams_config.parent / "dashboards"
    return beside if beside.is_dir() else None


def build_dashboard_service(settings: Settings, catalog: Catalog, store, *, clock=None):
    """The dashboards: the folder's loaded (a bad file stops the start, naming it), the saved ones
    in the store beside the panes."""
    import time

    from dashboard.provisioning import load_dashboards_dir
    from dashboard.service import DashboardService
    from store.dashboards import DashboardStore

    service = DashboardService(catalog, DashboardStore(store.side_db()), clock=clock or time.time,
                               max_points=settings.query_max_points)
    folder = dashboards_folder(settings)
    service.sync_files(load_dashboards_dir(folder, catalog, max_points=settings.query_max_points)
                       if folder is not None else {})
    return service


def open_audit_store(settings: Settings, store: PaneStore):
    from store.audit import AuditStore

    # Beside the panes, on the store's backend, with a table and a connection of its own (store/audit.py).
    return AuditStore(store.side_db(), retention_ms=settings.audit_retention)


def open_idempotency_store(settings: Settings, store: PaneStore):
    from store.idempotency import IdempotencyStore

    # Beside the panes, as the audit log: kept across restarts, shared by API replicas.
    return IdempotencyStore(store.side_db(), ttl_ms=settings.idempotency_key_ttl,
                            in_flight_timeout_ms=settings.idempotency_in_flight_timeout,
                            store_clock=True)  # replicas' clocks may disagree; the store's is one


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


def available_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's limit), not
    the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def ingest_slots(settings: Settings) -> int | None:
    """How many request bodies the API parses, checks and appends at once: `ingest_threads`; by
    default one per core this process may run on, and no bound on Kafka, where a request's thread
    mostly waits for the brokers' acknowledgements and a bound would only queue requests."""
    if settings.ingest_threads:
        return settings.ingest_threads
    if settings.log_backend == "kafka":
        return None
    return available_cores()


# `ingest_processes: auto`'s ceiling. The API process's event loop takes ~1.2-1.5 ms of each 1 000-event
# request (HTTP, tokens, the body down a socket) against a worker's ~3.5-4.5, so past ~4 workers it is
# the one that waits, whatever the cores (docs/benchmarks.md, sessions 84-85).
AUTO_INGEST_PROCESSES_MAX = 4


def ingest_process_count(settings: Settings) -> int:
    """How many ingest worker processes the API starts: `ingest_processes`, or for `auto` one more
    than the cores this process may run on, at most AUTO_INGEST_PROCESSES_MAX, on the embedded log
    (the extra one takes the body that would wait while the others' answers cross the API process:
    3 workers beat 2 on 2 cores, docs/benchmarks.md session 84), and none on Kafka, where an append
    waits for the brokers and the API's threads do that wait."""
    if settings.ingest_processes != "auto":
        return settings.ingest_processes
    if settings.log_backend != "embedded":
        return 0
    return min(available_cores() + 1, AUTO_INGEST_PROCESSES_MAX)


def ingest_workers(settings: Settings, limits):
    """The API's ingest worker processes (api/ingest_workers.py), or None: ingest_process_count.
    `limits`: the JSON bounds of the API's security settings, which the workers check too."""
    processes = ingest_process_count(settings)
    if not processes:
        return None
    from api.ingest_workers import IngestWorkers
    from sketchboard.allocators import child_environment

    # A 10 000-event body's work in a worker whose allocators give freed memory back at once ran
    # 10-20 % slower than in the API process's threads (docs/benchmarks.md, session 82).
    return IngestWorkers(settings.log_path, settings.log_sync, limits, processes,
                         environment=child_environment())


def build_api(settings: Settings):
    from api.app import create_app
    from api.context import ApiContext
    from api.served_catalog import ServedCatalog, stored_definitions
    from api.ws_hub import HubConfig
    from sketchboard.leader import build_leadership, lead
    from sketchboard.reprocess import build_reprocess_service, child_launcher

    security = build_security(settings)
    check_exposure(settings, security)  # before opening anything
    catalog = open_catalog(settings)
    log, store = open_log(settings, catalog), open_store(settings)
    lag = build_lag_monitor(settings, catalog, log, store)
    patterns = build_pattern_definitions(catalog, store)  # the configured patterns and those defined through the API
    # One replica at a time evaluates alerts, notifies and samples lag (sketchboard/leader.py).
    leadership = build_leadership(settings, store)
    reprocess = build_reprocess_service(settings, catalog, store, log, launch=child_launcher(settings))
    # Reads of the root go by the definitions its output was built with (api/served_catalog.py).
    served = ServedCatalog(stored_definitions(reprocess.definitions))
    reprocess.switch_listeners.append(lambda stream: served.refresh())
    alerts = build_alert_service(settings, patterns.catalog, store, lag, active=leadership.leading, served=served.of)
    lead(leadership, alerts=alerts, sampler=lag.sampler)
    cdc = follow_cdc_sources(settings, catalog, log, leadership)  # change data capture (docs/tables.md)
    ctx = ApiContext(
        catalog=catalog,
        log=log,
        store=store,
        pipeline_name=settings.pipeline_name,
        max_body_bytes=settings.max_body_bytes,
        max_events_per_request=settings.max_events_per_request,
        columnar_ingest=settings.columnar_ingest,
        ingest_slots=ingest_slots(settings),
        ingest_workers=ingest_workers(settings, security.json_limits),
        query_max_points=settings.query_max_points,
        lag=lag,
        health=open_health_store(settings, store),
        alerts=alerts,
        dashboards=build_dashboard_service(settings, catalog, store),
        security=security,
        audit=open_audit_store(settings, store),
        idempotency=open_idempotency_store(settings, store),
        leadership=leadership,
        reprocess=reprocess,
        served=served,
        cdc=cdc,
        pattern_definitions=patterns,
        point_cache=open_point_cache(catalog, store),
        snapshot_workers=snapshot_workers(settings),
    )
    ctx.reprocess.switch_listeners.append(lambda stream: ctx.point_cache.clear())  # its points were the old rows
    ctx.point_warmer = point_warmer(settings, ctx)
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


def build_pattern_definitions(catalog: Catalog, store):
    """Patterns defined through the API (api/pattern_definitions.py), stored beside the root's tables."""
    from api.pattern_definitions import PatternDefinitions
    from store.pattern_definitions import PatternDefinitionStore

    return PatternDefinitions(catalog, PatternDefinitionStore(store.side_db()))


def follow_cdc_sources(settings: Settings, catalog: Catalog, log, leadership) -> list:
    """A CDC follower per table stream with a `source` (ingest/cdc/), run by the leader replica
    only (two followers of one slot would each append the changes)."""
    from ingest.cdc.follower import followers_for

    followers = followers_for(catalog.streams.values(), log)
    if followers:
        gain, lose = leadership.on_gain, leadership.on_lose

        def on_gain() -> None:
            gain()
            for follower in followers:
                follower.start()

        def on_lose() -> None:
            for follower in followers:
                follower.stop()
            lose()

        leadership.on_gain, leadership.on_lose = on_gain, on_lose
    return followers


def executor_allocators(master: str) -> dict[str, str]:
    """On a cluster master, the allocators' settings of this process (sketchboard/allocators.py)
    for Spark's executors, which inherit nothing from it: their Python workers compute the
    partials with Arrow as the driver does. A local master's executors are this process's JVM and
    its children, which inherit them. spark_conf, applied after, can set each otherwise."""
    from aggregates.cluster import is_local_master
    from aggregates.spark import EXECUTOR_ENV
    from sketchboard.allocators import remote_environment

    if is_local_master(master):
        return {}
    return {EXECUTOR_ENV + name: value for name, value in remote_environment().items()}


def build_pipeline(settings: Settings, spark=None, *, name: str | None = None, starting_offsets: str | None = None,
                   catalog: Catalog | None = None, end_offsets: dict[str, dict[int, int]] | None = None):
    """The pipeline `name` (default: the serving pipeline, settings.pipeline_name), reading from
    `starting_offsets` (default settings.pipeline_start) if it has no checkpoint yet; `catalog`:
    the streams it reads (default: the configuration's; a reprocessing run's: one stream)."""
    import time

    from aggregates.consumers import GroupCopy, RegistryCopy
    from aggregates.pipeline import Pipeline, PipelineConfig
    from aggregates.bounded_batches import kafka_needs_spark
    from aggregates.cluster import is_local_master
    from aggregates.spark import LazySpark, build_spark, kafka_connector_conf

    name = check_pipeline_name(name or settings.pipeline_name)
    starting = starting_offsets or settings.pipeline_start
    checkpoint_dir = settings.checkpoint_dir_of(name)
    if not starts_over(checkpoint_dir) and starting_offsets is not None:
        # A checkpoint with batches, or only the start its first run pinned (a `latest` pipeline
        # stopped before its first batch still reads from the log's end as it was then).
        logger.info("pipeline %r resumes from its checkpoint (%s): --from %s applies to a first run only",
                    name, checkpoint_dir, starting_offsets)
    namespace = store_namespace(settings, name)
    catalog = catalog or open_catalog(settings)
    root_store = open_store(settings)
    registry = open_consumer_registry(settings, root_store)
    if starts_over(checkpoint_dir) and any(c.pipeline == name for c in registry.consumers()):
        # Its checkpoint was deleted (docs/scale-out.md, starting a name over): the old record's
        # offsets and batch id never move back, so they would overstate where it is (its lag shown
        # caught up while it replays; the log's compaction let a delete go before it read it).
        logger.warning("pipeline %r has no checkpoint in %s: it starts over, and its record in the consumer"
                       " registry with it", name, checkpoint_dir)
        registry.forget(name)
    registry.register(name, namespace, starting, int(time.time() * 1000))  # refuses a taken namespace
    kafka = None
    extra_conf: dict[str, str] = {}
    if settings.log_backend == "kafka":
        from ingest.kafka_source import KafkaSourceConfig

        kafka = KafkaSourceConfig(
            bootstrap_servers=settings.kafka_bootstrap_servers, topic_prefix=settings.kafka_topic_prefix,
            kafka_options=settings.kafka_options, source_options=settings.kafka_source_options,
            fail_on_data_loss=settings.kafka_fail_on_data_loss, json_limits=json_limits(settings),
            fast_path=settings.kafka_jvm_validation)
        extra_conf = kafka_connector_conf(settings.spark_kafka_jars, settings.spark_jars_packages)
    # Topics exist before the source asks for offsets; the driver keeps this handle to read the
    # log's end offsets at each commit (per-partition watermarks).
    event_log = open_log(settings, catalog)
    if spark is None:
        conf = {**extra_conf, **executor_allocators(settings.spark_master), **settings.spark_conf}

        def start_spark():
            return build_spark(settings.spark_master, driver_memory=settings.spark_driver_memory, extra_conf=conf)

        # With a local master no Spark query runs unless something needs one (aggregates/driver_serving.py):
        # the JVM starts then, not here. Elsewhere at once: a cluster's executors are probed at the
        # start, and Kafka read through the JVM's fast path or with Spark source options is read by
        # Spark's query (aggregates/bounded_batches.py `reads_kafka_on_driver`).
        lazy = is_local_master(settings.spark_master) and (kafka is None or not kafka_needs_spark(kafka))
        spark = LazySpark(settings.spark_master, start_spark, conf) if lazy else start_spark()
    config = PipelineConfig(
        name=name,
        log_path=settings.log_path,
        checkpoint_dir=checkpoint_dir,
        starting_offsets=starting,
        max_records_per_batch=settings.max_records_per_batch,
        max_records_per_task=settings.max_records_per_task,
        driver_batch_rows=settings.driver_batch_rows,
        partials=settings.partials,
        trigger_interval=settings.trigger_interval,
        kafka=kafka,
        end_offsets=end_offsets,  # a reprocessing run: a join's other stream as far as the serving pipeline read it
    )
    store = root_store if namespace == ROOT else open_store(settings, namespace)
    from sketchboard.definitions import pin_definitions

    catalog = pin_definitions(store, catalog, name)  # a changed stream: computed as stored until a switch
    if namespace == ROOT:
        from sketchboard.definitions import apply_offset_moves

        apply_offset_moves(store, name, checkpoint_dir, kafka_prefix=None if kafka is None else kafka.topic_prefix)
    pipeline = Pipeline(spark, catalog, store, config, log=event_log)
    from sketches.hll_build import warm as warm_hll_replay

    warm_hll_replay(config.lg_k)  # its kernel loaded now, not in the first large batch's time
    from aggregates.checkpoint_checks import check_checkpoint

    # Before anything is read: an unreadable last offset log entry, a store or a log behind the
    # checkpoint is repaired from the store or refused (CheckpointDisagrees), never read past.
    check_checkpoint(pipeline)
    from catalog.versions import catalog_versions

    pipeline.definition_versions = catalog_versions(catalog)  # a switch fences its commits (store/switch.py)
    if namespace == ROOT:  # the serving pipeline runs the patterns defined through the API too
        from aggregates.pattern_definitions import PatternFollower
        from store.pattern_definitions import PatternDefinitionStore

        pipeline.pattern_definitions = PatternFollower(catalog, PatternDefinitionStore(store.side_db()))
    if namespace != ROOT:  # the serving pipeline's offsets are read from the root store itself
        pipeline.commit_listeners.append(RegistryCopy(registry, name))
    group = consumer_group_of(settings, name)
    if group is not None:
        from ingest.log.kafka_groups import GroupOffsetCommitter

        committer = GroupOffsetCommitter(settings.kafka_bootstrap_servers, group,
                                         topic_prefix=settings.kafka_topic_prefix, options=settings.kafka_options,
                                         timeout_s=settings.kafka_request_timeout / 1000)
        pipeline.commit_listeners.append(GroupCopy(committer, registry, name))
    # Where its first run started, once pinned: its position for lag until it commits (a pipeline
    # started from the log's end that finds nothing new commits no batch on the driver's own path).
    pipeline.start_listeners.append(lambda start: registry.record_start(name, start))
    pipeline.notify_start(pipeline.pinned_start())  # pinned by an earlier run (or by Spark's source)
    # A crash between the store's commit and the copies: make them now (the batch is skipped on replay).
    progress = store.progress(name, row_counts=False)
    if progress.last_batch_id is not None:
        pipeline.notify_listeners(progress.last_batch_id, progress.end_offsets,
                                  progress.last_commit_ms or int(time.time() * 1000))
    from aggregates.progress import register

    # Spark's progress events go to the store for the API process (the name Pipeline.start gives the query).
    health = open_health_store(settings, store)
    pipeline.progress_recorder = register(spark, health, name, f"sketchboard-{name}",
                                          input_rows=pipeline.rows_read_on_driver.get)  # batches Spark never ran
    # Failed store commits are retried and reported there (aggregates/commit_retry.py).
    health.reserve_store_errors(name)
    pipeline.health = health
    # Last, once nothing above can raise: its batches' commits leave SQLite's log checkpoints to a
    # thread of their own (store/wal_checkpoints.py), stopped when the store closes.
    store.checkpoint_apart()
    return pipeline


def consumer_group_of(settings: Settings, name: str) -> str | None:
    """The Kafka consumer group pipeline `name` copies its offsets to (kafka_commit_offsets), if any."""
    if not settings.kafka_commit_offsets:
        return None
    if "{pipeline}" not in settings.kafka_group_id and name != settings.pipeline_name:
        # One group for every pipeline: each would overwrite the others' offsets in it, and lag
        # tools would see one consumer jumping back and forth. The group is the serving pipeline's.
        logger.warning("pipeline %r does not copy its offsets to the Kafka consumer group %r: kafka_group_id has"
                       " no {pipeline}, so that group holds the serving pipeline's (%r)", name,
                       settings.kafka_group_id, settings.pipeline_name)
        return None
    from ingest.log.kafka_groups import group_id_for

    return group_id_for(settings.kafka_group_id, name)


def starts_over(checkpoint_dir) -> bool:
    """Nothing of a checkpoint there: no batch logged, no start pinned (a first start, or one whose
    checkpoint was deleted)."""
    return not checkpoint_dir.is_dir() or not any(checkpoint_dir.iterdir())
