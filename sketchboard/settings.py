"""Service settings: defaults that work on a laptop, overridden by a YAML settings file and
then by SKETCHBOARD_* environment variables (highest priority)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from catalog import ConfigError, parse_duration_ms
from catalog.durations import trigger_ms
from catalog.loader import YamlDocument, read_yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_STREAMS = REPO_ROOT / "config" / "streams.yaml"
# The demo's rules, beside the demo's streams file: what alerts_config comes to when neither is set.
DEFAULT_ALERTS = REPO_ROOT / "config" / "alerts.yaml"
ALERTS_BESIDE = "alerts.yaml"
# How long a store or log write waits for SQLite's write lock (store/connection.py open_connection's default).
STORE_BUSY_TIMEOUT_MS = 30_000
SETTINGS_FILE_ENV = "SKETCHBOARD_SETTINGS_FILE"
ENV_PREFIX = "SKETCHBOARD_"
# SKETCHBOARD_* variables that are not settings, read elsewhere: any other that names no setting
# is refused (a misspelt one would otherwise be ignored without a word).
OTHER_VARIABLES = frozenset({
    SETTINGS_FILE_ENV,
    "SKETCHBOARD_PARENT_PID",  # sketchboard/parent_death.py: `up` to its children
    "SKETCHBOARD_REPROCESS_LAUNCH",  # sketchboard/reprocess.py: the API to the run's child, the run's claim
    "SKETCHBOARD_SOAK_SECONDS", "SKETCHBOARD_FUZZ_EXAMPLES", "SKETCHBOARD_CHROMIUM",  # the tests'
    "SKETCHBOARD_PORT_1", "SKETCHBOARD_PORT_2",  # docker-compose.yml's published ports
})

# The least heap Spark runs with: UnifiedMemoryManager refuses a driver JVM, or an executor memory
# setting, under 1.5 x the 300 MiB it reserves (INVALID_DRIVER_MEMORY / INVALID_EXECUTOR_MEMORY,
# at the session's start, on any master).
SPARK_MIN_MEMORY_BYTES = 450 * 1024 * 1024
_JVM_MEMORY = re.compile(r"([1-9][0-9]*)(b|k|kb|m|mb|g|gb|t|tb)?", re.IGNORECASE)
_PLAIN_NUMBER = re.compile(r"^\s*\d+(\.\d+)?\s*$", re.ASCII)


def _setting_duration(value: Any) -> int:
    """A duration setting: as parse_duration_ms takes it, and a plain number as text ('0', '3600':
    an environment variable's value is always text) as seconds, as the same number in the settings
    file is. Only here: the streams file and the API's parameters keep refusing a number as text."""
    if isinstance(value, str) and _PLAIN_NUMBER.match(value):
        value = int(value) if "." not in value else float(value)
    return parse_duration_ms(value)


DurationMs = Annotated[int, BeforeValidator(_setting_duration)]

INGEST_PROCESSES_MAX = 64


def processes_or_auto(value: Any) -> int | str:
    """`ingest_processes`: a whole number of processes from 0 to INGEST_PROCESSES_MAX (as text too, from
    the environment), or "auto"; anything else refused with one reason rather than one per union branch."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    number = value.strip() if isinstance(value, str) else value
    if isinstance(number, str) and re.fullmatch(r"\d+", number, re.ASCII):
        number = int(number)
    if isinstance(number, int) and not isinstance(number, bool) and 0 <= number <= INGEST_PROCESSES_MAX:
        return number
    raise ValueError(f"a number of worker processes from 0 to {INGEST_PROCESSES_MAX}, or auto; got {value!r}")


ProcessesOrAuto = Annotated[int | Literal["auto"], BeforeValidator(processes_or_auto)]


def _spark_memory(value: str) -> int:
    """Bytes of a Spark/JVM memory size (no unit: bytes, as -Xmx and Spark's memory check read it);
    ValueError for text that is none, or a size under Spark's least (SPARK_MIN_MEMORY_BYTES)."""
    matched = _JVM_MEMORY.fullmatch(str(value).strip())
    if not matched:
        raise ValueError(f"{value!r} is no JVM memory size: a number and a unit, e.g. 512m or 2g")
    unit = (matched[2] or "b").lower()[0]
    size = int(matched[1]) * 1024 ** "bkmgt".index(unit)
    if size < SPARK_MIN_MEMORY_BYTES:
        raise ValueError(f"{value!r} is less than Spark runs with: at least 450m (1.5 x the 300 MiB Spark reserves;"
                         " a number without a unit is bytes)")
    return size


class Settings(BaseSettings):
    # allow_inf_nan: a rate, interval or mean of inf (or nan) is no setting: each float is finite.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True,
                                      allow_inf_nan=False)

    # Where things live
    data_dir: Path = Field(Path("data"), description="log, store and checkpoints go here")
    streams_config: Path = Field(DEFAULT_STREAMS, description="the YAML file declaring streams and metrics")

    # API
    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean to expose it")
    port: int = Field(8000, ge=1, le=65535)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024, description="larger POST bodies get 413")
    max_events_per_request: int = Field(100_000, ge=1)
    # Bodies whose events are all valid and plain are parsed and checked as Arrow columns
    # (ingest/columnar.py); off: every body takes the per-event validator (same answers, slower).
    columnar_ingest: bool = True
    ingest_threads: int = Field(0, ge=0, description="request bodies parsed, checked and appended at once; more"
                                " wait their turn (0: one per core on the embedded log, no bound on Kafka, where"
                                " an append waits for the brokers' acknowledgements)")
    ingest_processes: ProcessesOrAuto = Field(
        "auto", description="worker processes that parse, check and append request bodies to the embedded log off"
        " the API process's GIL (0: threads of the API process; auto: one more than the cores, at most 4, on the"
        " embedded log, 0 on Kafka; docs/ingest-and-api.md)")
    query_max_points: int = Field(11_000, ge=10, description="points per series a query may return")

    # Security (docs/security.md)
    tokens_file: Path | None = Field(None, description="API tokens as hashes (`sketchboard token create`);"
                                     " default <data_dir>/tokens.json")
    tokens: list[dict[str, Any]] = Field(default_factory=list, description="more tokens, as {name, sha256, scopes}"
                                         " (for deployments configured by environment: SKETCHBOARD_TOKENS)")
    allowed_origins: list[str] = Field(default_factory=list, description="websocket handshakes from these origins"
                                       " are accepted besides the service's own")
    cors_origins: list[str] = Field(default_factory=list, description="origins that get CORS headers; none by default")
    metrics_public: bool = Field(False, description="GET /metrics without a token (for a scraper that cannot"
                                 " send one); otherwise it needs the read scope")
    rate_limit_requests: float = Field(1000, ge=0, description="requests per second per token (per client address"
                                       " when open) to every route but the probes and the dashboard's files;"
                                       " bursts of twice that; 0: no limit")
    rate_limit_events: float = Field(500_000, ge=0, description="events per second per token (or address) posted to"
                                     " /api/v1/events; bursts of one second's worth; 0: no limit")
    max_json_depth: int = Field(16, ge=2, le=200, description="an ingested event nested deeper is rejected")
    max_json_string_chars: int = Field(64 * 1024, ge=1024, description="longer strings (keys too) reject the event")
    max_json_int_digits: int = Field(40, ge=20, le=4000, description="integers with more digits reject the event")
    audit_retention: DurationMs = Field("365d", ge=86_400_000, description="audit log entries kept")
    idempotency_key_ttl: DurationMs = Field("24h", ge=60_000, le=30 * 86_400_000,
                                            description="how long the answer to a POST /api/v1/events with an"
                                            " Idempotency-Key is kept for its retries")
    idempotency_in_flight_timeout: DurationMs = Field(
        "60s", ge=1000, le=86_400_000, description="a key claimed this long ago whose answer was never recorded is"
        " taken for abandoned (its process died) and a retry does the work again; must exceed"
        " kafka_produce_timeout plus the store's 30 s busy timeout, so a first try still appending is never"
        " taken over")
    token: SecretStr | None = Field(None, description="the token Sketchboard's own clients send (the demo producer"
                                    " of `sketchboard up`/`demo`, bench/ingest_api.py): SKETCHBOARD_TOKEN")

    # Log
    log_retention: DurationMs = Field("7d", description="records older than this are dropped, read by the pipeline"
                                      " or not; at least 1m")
    log_retention_bytes: int = Field(1 << 30, ge=1 << 20, description="per partition")
    log_sync: Literal["NORMAL", "FULL"] = Field("NORMAL", description="FULL also survives power loss")
    log_backend: Literal["embedded", "kafka"] = Field(
        "embedded", description="embedded: a SQLite file under data_dir; kafka: one topic per stream on a Kafka cluster")
    kafka_bootstrap_servers: str | None = Field(None, description="host:port[,host:port...]; needed for kafka")
    kafka_topic_prefix: str = Field("sketchboard.", pattern=r"^[A-Za-z0-9._-]{0,200}$",
                                    description="a stream's topic is <prefix><stream>")
    kafka_replication_factor: int | None = Field(None, ge=1, description="for topics Sketchboard creates;"
                                                 " none: the brokers' default.replication.factor")
    kafka_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="librdkafka settings for every Kafka client Sketchboard opens"
        " (security.protocol, sasl.mechanism, sasl.username, ssl.ca.location, ...); acks and"
        " enable.idempotence are always all/true")
    kafka_produce_timeout: DurationMs = Field("10s", ge=100, description="an append the brokers did not"
                                              " acknowledge by then fails (the API answers 503)")
    kafka_request_timeout: DurationMs = Field("10s", ge=100, description="topic metadata, offsets and topic"
                                              " creation; past it the request fails (503)")
    kafka_source_options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="extra options for the pipeline's Spark Kafka source: source options"
        " (minPartitions, ...) or Java client settings only the JVM knows (kafka.sasl.jaas.config, ...);"
        " kafka_options reach it too, as kafka.<key>")
    kafka_fail_on_data_loss: bool = Field(False, description="the Spark Kafka source's failOnDataLoss: false skips"
                                          " records the topic's retention deleted before the pipeline read them"
                                          " (with a warning); true stops the pipeline instead")
    kafka_jvm_validation: bool = Field(False, description="the Kafka source's JVM fast path (from_json plus Spark SQL"
                                       " checks vouch for clearly valid records; the rest go to the API's validator):"
                                       " off, it measured slower here (docs/scale-out.md: Kafka log)")
    kafka_commit_offsets: bool = Field(False, description="after each store commit, copy the pipeline's offsets"
                                       " to a Kafka consumer group (for Burrow, kafka-lag-exporter,"
                                       " kafka-consumer-groups.sh); never read back, a failure is logged and counted")
    kafka_group_id: str = Field("sketchboard-{pipeline}", min_length=1, description="that consumer group;"
                                " {pipeline} is replaced by the pipeline's name")
    spark_kafka_jars: Path = Field(REPO_ROOT / "jars" / "spark-kafka", description="Spark's Kafka connector jars"
                                   " (`make jars`), passed as spark.jars when log_backend is kafka")
    spark_jars_packages: str | None = Field(None, description="instead of spark_kafka_jars, Maven coordinates for"
                                            " spark.jars.packages (Spark downloads them: needs internet)")

    # Serving store
    store_backend: Literal["sqlite", "postgres"] = Field(
        "sqlite", description="sqlite: a file under data_dir (one machine); postgres: a PostgreSQL database the"
        " pipeline and every API process share")
    postgres_dsn: str | None = Field(None, description="libpq connection string or URI of the store's database,"
                                     " e.g. 'postgresql://sketchboard@db:5432/sketchboard'; needed for postgres")
    postgres_pool_size: int = Field(8, ge=1, le=200, description="connections each process keeps to PostgreSQL")

    # API replicas on one store (docs/scale-out.md)
    replica_id: str | None = Field(None, max_length=200, description="this API process's name in the leader"
                                   " lease; default <hostname>:<port>:<pid>")
    leader_lease_ttl: DurationMs = Field("4s", ge=200, le=600_000, description="the replica running the alert"
                                         " evaluator, notifier and lag sampler renews its lease 5 times per ttl;"
                                         " when it stops, another takes over within ~1.4 ttl")

    # Pipeline
    pipeline_name: str = Field("main", pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,47}$",
                               description="the serving pipeline: the API serves its output, kept in the store's"
                               " root (store.db / the DSN's schema); `sketchboard pipeline --name N` runs another"
                               " named pipeline of the same log into a namespace of its own (docs/scale-out.md: Fan-out)")
    pipeline_start: Literal["earliest", "latest"] = Field(
        "earliest", description="where a pipeline's first run starts reading: the earliest retained record"
        " (replay) or the log's end; a pipeline with a checkpoint resumes from it whatever this says"
        " (`sketchboard pipeline --from`)")
    reprocess_auto_switch: bool = Field(False, description="a reprocessing run that has caught up switches the"
                                        " served output to its own at once (docs/reprocessing.md); off: an admin"
                                        " switches with POST /api/v1/reprocess/{id}/switch after comparing (?version=)")
    reprocess_drop_after: DurationMs = Field(0, description="an output that is not served (a finished run's, or a"
                                         " previous one kept by a switch) is dropped this long after its last change"
                                         " of state (for a previous output: the switch); 0: never (drop by hand)")
    spark_master: str = Field("local[2]", description="local[N] (this machine), or a cluster's master: spark://host:7077"
                              " (needs log_backend kafka; docs/scale-out.md)")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="more Spark settings for the pipeline's"
                                       " session: spark.executor.memory, spark.executor.cores, spark.cores.max,"
                                       " spark.sql.shuffle.partitions, spark.driver.host, spark.pyspark.python, ...")
    spark_driver_memory: str = "2g"
    # Short: a batch starts as soon as records are there (an idle trigger is one read of the log's offsets).
    trigger_interval: str = "100 milliseconds"
    max_records_per_batch: int = Field(1_000_000, ge=1)
    max_records_per_task: int = Field(250_000, ge=1)
    driver_batch_rows: int | None = Field(None, ge=0, description="a micro-batch of at most this many records is held"
                                          " on the driver as Arrow and run in Python, with no Spark job"
                                          " (aggregates/driver_batch.py); 0: every batch through Spark; unset: every"
                                          " batch on a local master, at most 50 000 records on a cluster")
    partials: Literal["arrow", "spark"] = Field("spark", description="how a batch's partial aggregates are computed:"
                                                " an Arrow group-by on the executors, or Spark's groupBy")

    # Websocket hub (live dashboard)
    ws_poll_interval: float = Field(0.05, gt=0, le=10, description="seconds between reads of the store's change feed")
    ws_heartbeat_interval: float = Field(10.0, gt=0, description="seconds of silence before a heartbeat is sent")
    ws_queue_size: int = Field(256, ge=8, description="messages queued per client before coalescing/dropping")
    ws_max_subscriptions: int = Field(32, ge=1, description="subscriptions one websocket client may hold")
    ws_snapshot_workers: int = Field(1, ge=0, le=64, description="processes computing websocket snapshots off the"
                                     " API process's GIL (0: in the API process)")
    point_warm_interval: float = Field(10.0, ge=0, le=3600, description="seconds between runs computing the"
                                       " dashboards' panels ahead of their first query, so their sketch points"
                                       " are kept in the store (0: off)")
    point_warm_standard: bool = Field(True, description="warm the standard views with the dashboards' panels:"
                                      " each metric's p50/p95/p99 and distinct count at each tier's granule"
                                      " and over a 1 h sliding window (query/standard_views.py)")
    ws_max_message_bytes: int = Field(64 * 1024, ge=1024, description="larger websocket frames close the"
                                      " connection (1009)")
    ws_compression: bool = Field(False, description="offer permessage-deflate to websocket clients: less to send"
                                 " to a far browser, but every message deflated per connection in the API"
                                 " process (a 24 h view's snapshot is 0.3-1 MB of JSON)")
    ws_message_rate: float = Field(20.0, gt=0, description="messages per second a websocket client may send"
                                   " (bursts of ws_message_burst); past it the connection is closed (1008)")
    ws_message_burst: int = Field(50, ge=1)
    # Consumer lag and pipeline health
    lag_sample_interval: DurationMs = Field("2s", ge=10, description="how often the API samples consumer lag")
    lag_window: int = Field(10, ge=2, le=1000, description="samples per partition the lag status looks at (at least"
                                " two: a status compares the first and the last)")
    lag_retention: DurationMs = Field("24h", ge=60_000, description="lag samples and Spark progress kept")

    # Dashboards
    dashboards_config: Path | None = Field(None, description="the folder of provisioned dashboards, one YAML file"
                                           " each (read-only through the API); none: `dashboards/` beside the"
                                           " streams file, when there is one")

    # Alerts
    alerts_config: Path | None = Field(None, description="alert rules file (read-only through the API); unset:"
                                       " alerts.yaml beside the streams file, when there is one; none: rules come"
                                       " only from the API")
    alert_eval_interval: DurationMs = Field("10s", ge=1_000, description="default evaluation interval of a rule")
    alert_history_retention: DurationMs = Field("30d", ge=60_000, description="alert state changes kept")
    alert_webhook_url: str | None = Field(None, description="POST notifications here (Alertmanager webhook JSON)")
    alert_webhook_timeout: DurationMs = Field("5s", ge=100, description="per POST")
    alert_webhook_max_attempts: int = Field(4, ge=1, le=20, description="tries per notification (retries back off)")
    alert_webhook_backoff: DurationMs = Field("500ms", ge=10, description="first retry delay; doubles each retry")
    alert_repeat_interval: DurationMs = Field("4h", ge=1_000, description="re-send a still-firing group this often")
    alert_webhook_shutdown_timeout: DurationMs = Field(
        "5s", ge=0, le=600_000, description="at shutdown, how long the webhook may go on sending what is queued"
                                            " (the leader lease is renewed meanwhile); the rest is the next leader's")

    # Demo producer
    demo_rate: float = Field(200.0, ge=0, description="demo events per second before the daily shape")
    demo_users: int = Field(50_000, ge=1, le=1_000_000, description="the demo shop's users (the users table's rows)")
    # Demo stragglers (see demo.Stragglers): fractions of all demo events.
    demo_delayed_fraction: float = Field(0.05, ge=0, le=1, description="sent late by an exponential delay")
    demo_delay_mean: float = Field(5.0, ge=0, description="mean of that delay, seconds")
    demo_late_fraction: float = Field(0.005, ge=0, le=1, description="sent after the pane is final: corrections")
    demo_horizon_fraction: float = Field(0.0005, ge=0, le=1, description="older than retention: dead letters")
    demo_future_fraction: float = Field(0.0002, ge=0, le=1, description="from a clock in the future: dead letters")
    # The demo's tables (users, ...) from PostgreSQL: the producer writes their rows into the
    # schema sketchboard_demo of this database, and change data capture feeds the table streams.
    demo_postgres_dsn: str | None = Field(None, description="a PostgreSQL database (wal_level=logical) for the"
                                          " demo's tables; a password as ${NAME}; none: the rows are POSTed")

    @field_validator("tokens")
    @classmethod
    def _tokens_are_hashes(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from api.security.tokens import TokenRecord

        for entry in value:
            TokenRecord.from_dict(entry)  # ValueError names the entry and the field
        return value

    @field_validator("log_retention")
    @classmethod
    def _log_retention(cls, value: int) -> int:
        # The retention pass (every minute) drops records by age, whether the pipeline has read them
        # or not: 0s would empty the log each minute.
        if value < 60_000:
            raise ValueError(f"must be at least 1m (one minute), not {value} ms: records older than log_retention"
                             " are dropped whether the pipeline has read them or not")
        return value

    @field_validator("trigger_interval")
    @classmethod
    def _trigger_interval(cls, value: str) -> str:
        trigger_ms(value)  # ValueError naming the value: as Spark's trigger spells it, e.g. '1 second'
        return value

    @field_validator("alerts_config", "dashboards_config", "tokens_file", mode="before")
    @classmethod
    def _empty_path_is_none(cls, value):
        # SKETCHBOARD_ALERTS_CONFIG= (or `alerts_config: ""`) means none, as null does: not Path(""),
        # which is the working directory.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("data_dir", "streams_config", "spark_kafka_jars", mode="before")
    @classmethod
    def _path_is_given(cls, value):
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be empty: a path is needed (unset it for the default)")
        return value

    @field_validator("kafka_bootstrap_servers", "postgres_dsn", "demo_postgres_dsn", "alert_webhook_url",
                     "spark_jars_packages", mode="before")
    @classmethod
    def _optional_text(cls, value):
        # Empty means none, as for the optional paths; blanks only are a mistake, not servers or a DSN.
        if value == "":
            return None
        if isinstance(value, str) and not value.strip():
            raise ValueError("must not be blank (leave it unset or empty for none)")
        return value

    @field_validator("spark_master")
    @classmethod
    def _spark_master(cls, value: str) -> str:
        # Spark's own forms, as Spark reads them (aggregates/cluster.py master_kind): a typo such as
        # locall[2], SPARK://h:7077 or spark://h (no port) failed only when the pipeline started its
        # session, with Spark's "Could not parse Master URL" or "Invalid master URL".
        from aggregates.cluster import master_kind

        text = value.strip()
        try:
            master_kind(text)
        except ValueError as exc:
            raise ValueError(f"{value!r} is no Spark master URL: {exc}") from None
        return text

    @field_validator("spark_driver_memory")
    @classmethod
    def _jvm_memory(cls, value: str) -> str:
        _spark_memory(value)
        return value

    @field_validator("spark_conf")
    @classmethod
    def _spark_conf_memory(cls, value: dict[str, str]) -> dict[str, str]:
        for key in ("spark.driver.memory", "spark.executor.memory"):
            if key in value:
                try:
                    _spark_memory(value[key])
                except ValueError as exc:
                    raise ValueError(f"{key}: {exc}") from None
        return value

    @field_validator("alert_webhook_url")
    @classmethod
    def _webhook_url(cls, value: str | None) -> str | None:
        # The notifier's own check (a URL accepted here and refused there failed only when the API
        # started, with a traceback); the value is stripped, as a variable's stray blank is no part of it.
        if value is None:
            return None
        from alerts.webhook import url_problem

        value = value.strip()
        problem = url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty: an address to bind, e.g. 127.0.0.1 (loopback) or 0.0.0.0 (every"
                             " interface)")
        return value

    @field_validator("kafka_group_id")
    @classmethod
    def _group_template(cls, value: str) -> str:
        # `{pipline}` would be kept as written: every pipeline would then share one group.
        unknown = sorted(set(re.findall(r"\{[^}]*\}", value)) - {"{pipeline}"})
        if unknown:
            raise ValueError(f"unknown placeholder {unknown[0]}: the one placeholder is {{pipeline}}")
        return value

    @field_validator("pipeline_name")
    @classmethod
    def _pipeline_name(cls, value: str) -> str:
        # Imported here: the store package loads its backends (~0.9 s), which commands such as
        # `token list` never need; this runs only when pipeline_name is set.
        from store.namespace import check_user_pipeline_name

        return check_user_pipeline_name(value)

    @field_validator("replica_id")
    @classmethod
    def _replica_id(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty: unset it for the default <hostname>:<port>:<pid>")
        return value

    @field_validator("token", mode="before")
    @classmethod
    def _empty_token_is_none(cls, value):
        return None if value == "" else value  # SKETCHBOARD_TOKEN= unsets it

    @field_validator("allowed_origins", "cors_origins")
    @classmethod
    def _origins(cls, value: list[str], info) -> list[str]:
        from api.security.config import normalize_origins

        normalize_origins(value, info.field_name)
        return value

    @model_validator(mode="after")
    def _alerts_beside_streams(self) -> Settings:
        # Unset, the rules file follows the streams file, as the dashboards' folder does: a user's own
        # streams file never gets the demo's rules (they name the demo's metrics). Written to __dict__ so
        # that model_fields_set keeps saying it was not set (alerts_config_named).
        if "alerts_config" not in self.model_fields_set:
            self.__dict__["alerts_config"] = self.streams_config.parent / ALERTS_BESIDE
        return self

    @model_validator(mode="after")
    def _kafka_needs_servers(self) -> Settings:
        if self.log_backend == "kafka" and not self.kafka_bootstrap_servers:
            raise ValueError("log_backend is kafka: set kafka_bootstrap_servers (e.g. 'broker1:9092,broker2:9092')")
        return self

    @model_validator(mode="after")
    def _log_backend_specific_settings(self) -> Settings:
        if self.ingest_processes not in (0, "auto") and self.log_backend != "embedded":
            raise ValueError("ingest_processes append to the embedded log; on Kafka the API's threads wait for the"
                             " brokers' acknowledgements (set ingest_threads instead)")
        if self.kafka_commit_offsets and self.log_backend != "kafka":
            raise ValueError("kafka_commit_offsets copies offsets to a Kafka consumer group: it needs log_backend"
                             " kafka")
        return self

    @model_validator(mode="after")
    def _cluster_needs_kafka(self) -> Settings:
        from aggregates.cluster import check_log_fits_master

        check_log_fits_master(self.spark_master, self.log_backend)  # ClusterConfigError is a ValueError
        return self

    @model_validator(mode="after")
    def _in_flight_outlasts_an_append(self) -> Settings:
        # A first try may wait the produce timeout on the brokers (or the busy timeout on the log's
        # and the store's write lock): taken over before, its request would be appended twice.
        least = self.kafka_produce_timeout + STORE_BUSY_TIMEOUT_MS
        if self.idempotency_in_flight_timeout <= least:
            raise ValueError(f"idempotency_in_flight_timeout ({self.idempotency_in_flight_timeout} ms) must exceed"
                             f" kafka_produce_timeout ({self.kafka_produce_timeout} ms) plus the store's busy timeout"
                             f" ({STORE_BUSY_TIMEOUT_MS} ms): a retry would take over a first try still appending")
        return self

    @model_validator(mode="after")
    def _postgres_needs_dsn(self) -> Settings:
        if self.store_backend == "postgres" and not self.postgres_dsn:
            raise ValueError("store_backend is postgres: set postgres_dsn"
                             " (e.g. 'postgresql://sketchboard@db:5432/sketchboard')")
        return self

    @property
    def log_path(self) -> Path:
        return self.data_dir / "log.db"

    @property
    def store_path(self) -> Path:
        return self.data_dir / "store.db"

    @property
    def checkpoint_dir(self) -> Path:
        return self.checkpoint_dir_of(self.pipeline_name)

    def checkpoint_dir_of(self, pipeline: str) -> Path:
        """Each named pipeline's Spark checkpoint (its offsets) in a folder of its own."""
        return self.data_dir / "checkpoints" / pipeline

    @property
    def tokens_path(self) -> Path:
        return self.tokens_file or self.data_dir / "tokens.json"

    @property
    def alerts_config_named(self) -> bool:
        """Whether alerts_config was set (argument, environment, settings file), not the default
        beside the streams file: a named file must exist, the default may be missing."""
        return "alerts_config" in self.model_fields_set

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
        check_variables(settings_cls)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = settings_file()
        if path is not None:
            sources.append(InitSettingsSource(settings_cls, init_kwargs=read_settings_file(path).value))
        return tuple(sources)


def check_variables(settings_cls=None) -> None:
    """ConfigError, a line for each, for SKETCHBOARD_* variables that name no setting (nor one of
    OTHER_VARIABLES), with the closest setting's variable when there is one."""
    fields = (settings_cls or Settings).model_fields
    problems = []
    for name in sorted(os.environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in OTHER_VARIABLES or upper[len(ENV_PREFIX):].lower() in fields:
            continue
        problems.append(f"{name}: no such setting{did_you_mean(upper[len(ENV_PREFIX):].lower(), fields, ENV_PREFIX)}")
    if problems:
        raise ConfigError("\n".join(problems))


def did_you_mean(name: str, fields, prefix: str = "") -> str:
    import difflib

    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.75)
    if not close:
        return ""
    return f" (did you mean {prefix}{close[0].upper()}?)" if prefix else f" (did you mean {close[0]}?)"


def settings_file() -> Path | None:
    """The settings file in force: SKETCHBOARD_SETTINGS_FILE (which must exist), else
    ./sketchboard.yaml when there is one."""
    path = os.environ.get(SETTINGS_FILE_ENV, "sketchboard.yaml")
    if Path(path).is_file():
        return Path(path)
    if SETTINGS_FILE_ENV in os.environ:
        raise FileNotFoundError(f"{SETTINGS_FILE_ENV}={path}: no such settings file")
    return None


def read_settings_file(path: Path) -> YamlDocument:
    """The settings file, read as every YAML file of the service is (catalog/loader.py: a key
    written twice or a file that is not UTF-8 is a ConfigError naming the line); ConfigError too
    for anything but a mapping of settings. An empty file is no settings."""
    document = read_yaml(path, "the settings file")
    data = document.value
    if data is None:
        document.value = {}
    elif not isinstance(data, dict):
        raise ConfigError(f"{path}: line {document.line()}: the top level must be a mapping of settings"
                          f" (name: value), not a {type(data).__name__}")
    else:
        for key in data:
            if not isinstance(key, str):  # a setting's name (pydantic-settings would fail on it with a traceback)
                raise ConfigError(f"{path}: line {document.line((key,))}: {key!r} is no setting's name"
                                  " (names are text, e.g. port)")
    return document
