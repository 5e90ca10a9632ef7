"""The success bodies of the routes that build them as dicts, as models for the OpenAPI
document (`responses={200: {"model": ...}}`, no response_model: the dicts go out as they are
and are not filtered). The fuzz test's response_schema_conformance check holds the two
together. Objects keep `extra="allow"` where a body carries a definition's own fields (a
stream, a metric, a rule of some kind) that the catalog or the rule's kind decides."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class HealthOut(BaseModel):
    status: str = Field(description="'ok'")


class OffsetsOut(BaseModel):
    start: int
    end: int


class PendingDefinitionOut(BaseModel):
    """A configured definition the served output is not built with yet (docs/reprocessing.md)."""

    serving_version: str = Field(description="the definition version the served output is built with")
    configured_version: str | None = Field(description="the configured definition's version")
    changes: dict[str, dict] = Field(description="per definition field that differs (catalog/versions.py):"
                                     " {served, configured}, e.g. pane_ms, dimensions, values, membership")
    note: str


class StreamOut(_Open):
    """The stream's definition (see the configuration) plus its log."""

    name: str
    distinct: list[str]
    definition_pending: PendingDefinitionOut | None = Field(
        None, description="null: served as configured; else the configured definition waiting for a"
                          " reprocessing switch (this listing is the served one, as queries answer)")
    partitions_offsets: dict[str, OffsetsOut] = Field(description="partition -> retained offsets [start, end)")
    events_in_log: int = Field(description="the partitions' retained offsets, end - start summed: the records"
                               " held, except for a compacted table, where it also counts the offsets compaction"
                               " emptied (the keys' older versions)")


class PendingOut(_Open):
    """Configured, not served until a switch: queries answer 404 for it meanwhile."""

    name: str
    definition_pending: PendingDefinitionOut | None


class StreamsOut(BaseModel):
    streams: list[StreamOut]
    pending_streams: list[PendingOut] = Field(
        description="configured streams the served output has not (a derived stream, sessions, turned on"
                    " since): listed once its stream's definition is switched")


class MetricOut(_Open):
    """The metric's definition (see the configuration) plus what it answers."""

    name: str
    stream: str
    stats: list[str]
    dimensions: list[str]
    pane: str
    definition_pending: PendingDefinitionOut | None = Field(
        None, description="null: its stream is served as configured; else the configured definition"
                          " waiting for a reprocessing switch (this listing is the served one, as queries answer)")


class MetricsOut(BaseModel):
    metrics: list[MetricOut]
    pending_metrics: list[PendingOut] = Field(
        description="configured metrics the served output cannot answer yet (over a field, feature or"
                    " stream only the configured definition has): 404 until the switch")


class PartitionProgressOut(BaseModel):
    log_start: int
    log_end: int
    committed: int
    lag_events: int
    max_event_ms: int | None = Field(description="the newest event time merged from this partition")
    watermark_ms: int | None = Field(description="this partition's watermark: max_event_ms - allowed lateness")
    watermark_state: str | None = Field(
        description="at the last commit: 'active' (unread records: holds the stream's watermark at its own),"
                    " 'caught_up' (nothing unread) or 'idle' (nothing read for partition_idle_timeout: left out)")


class StreamProgressOut(BaseModel):
    watermark_ms: int | None = Field(description="the minimum of the active partitions' watermarks, never"
                                     " going back (docs/event-time.md: Watermark)")
    watermark_held_by_partition: int | None = Field(
        description="the partition whose unread records hold the watermark back, null when none does")
    max_event_ms: int | None
    events_in_log: int = Field(description="the partitions' retained offsets, end - start summed (a compacted"
                               " table's count the offsets compaction emptied too)")
    events_aggregated: int
    events_read: int = Field(description="events_aggregated + events_dead_lettered + duplicates_dropped, always")
    events_dead_lettered: int
    dead_lettered_by_reason: dict[str, int]
    duplicates_dropped: int | None = Field(
        description="events dropped as copies of an event id counted within the stream's dedup_window;"
                    " null when the stream declares no event_id_field")
    enrich_misses: dict[str, int] | None = Field(
        default=None, description="per table: events enriched with \"\" because their key had no row at their"
                                  " time (docs/tables.md, Enrichment); null when the stream declares no enrich")
    open_sessions: int | None = Field(
        default=None, description="sessions held open (their last event + gap not yet behind the watermark;"
                                  " docs/first-seen-membership-sessions.md); null when the stream declares no sessions")
    corrections: int
    panes: int
    lag_events: int
    partitions: dict[str, PartitionProgressOut]


class PipelineOut(BaseModel):
    pipeline: str
    last_batch_id: int | None
    last_commit_ms: int | None
    seconds_since_last_commit: float | None
    batches: int
    events_read: int
    lag_events: int
    streams: dict[str, StreamProgressOut]
    joins: dict[str, dict] = Field(default_factory=dict, description="per window join (configuration `joins:`):"
                                   " `left_stream`, `right_stream`, `within_ms`, `late_horizon_ms`, `clock_ms` (the"
                                   " lower of its two streams' watermarks as the join saw it), `left_rows` and `right_rows` kept in"
                                   " its state, `pending_right` (right events no left matched yet), `pairs`,"
                                   " `unmatched_right` (right events that left the state without a match)")
    patterns: dict[str, dict] = Field(default_factory=dict, description="per pattern (configuration `patterns:`):"
                                      " `streams`, `key`, `watermark_ms` (the pattern's: events up to it were fed in"
                                      " order), `keys_held`, `partial_matches`, `buffered_events` (waiting for the"
                                      " watermark), `matches`, `late_events` (behind its watermark: recorded, not matched),"
                                      " `history_rows` (events kept in pattern_history for replays of late events),"
                                      " `dropped_partial_matches` (partial matches not started or dropped: their key"
                                      " held the most a key keeps: 1000 partial matches, 50000 events in them)")
    health: dict = Field(description="`query`: Spark's view of the query (null when not wired);"
                         " `lag`: the lag status (null when not wired); `store`: the pipeline's store commits"
                         " (`failing` while they fail and are retried, the newest `message`, `since_ms`, `retries`,"
                         " `total`; null before the pipeline first started)")
    leader: dict | None = Field(None, description="the API replica holding the leader lease (it runs the alert"
                                " evaluator, webhook notifier and lag sampler): `holder` (its replica id),"
                                " `holder_process` (`<replica id>/<nonce>`: the process), `epoch` (+1 at each change"
                                " of holder), `renewed_at_ms`, `ttl_ms`, `this_replica`, `leading` (this one);"
                                " null when not wired")
    definitions: dict | None = Field(None, description="per stream: `configured_version`, `serving_version` (the"
                                     " definition its served output is built with; null before the pipeline first"
                                     " ran) and `changed` (then the output keeps the stored meaning until a"
                                     " reprocessing run is switched to: docs/reprocessing.md); null when not wired")


class PartitionLagOut(BaseModel):
    log_end: int | None
    committed: int | None
    lag_events: int
    lag_seconds: float | None
    status: str
    reason: str


class StreamLagOut(BaseModel):
    status: str
    reason: str
    lag_events: int
    lag_seconds: float | None
    partitions: dict[str, PartitionLagOut]


class LagPointOut(BaseModel):
    t: int
    lag_events: int
    lag_seconds: float | None


class LagSeriesOut(BaseModel):
    from_ms: int
    to_ms: int
    truncated: bool
    pipeline: list[LagPointOut]
    streams: dict[str, list[LagPointOut]]
    partitions: dict[str, dict[str, list[dict]]] = Field(
        description="stream -> partition -> samples {t, log_end, committed, lag_events, lag_seconds}")


class ConsumerLagOut(BaseModel):
    name: str = Field(description="the pipeline's name")
    serving: bool = Field(description="true for the pipeline whose output the API serves (setting pipeline_name)")
    namespace: str | None = Field(description="where its output lives (null: the store's root)")
    started_from: str | None = Field(description="earliest or latest: where its first run began reading")
    registered_at_ms: int | None = Field(description="when it first started")
    last_batch_id: int | None
    last_commit_ms: int | None
    group_commits_failed: int = Field(description="failed copies of its offsets to a Kafka consumer group")
    group_commit_error: str | None = Field(description="the last such failure (null after a success)")
    status: str = Field(description="OK, WARN, STALL, STOP, REWIND or ERR (Burrow's rules)")
    reason: str
    lag_events: int
    lag_seconds: float | None
    streams: dict[str, StreamLagOut] = Field(description="per stream and partition: committed offset, lag, status")


class LagOut(BaseModel):
    at_ms: int
    pipeline: str
    status: str = Field(description="OK, WARN, STALL, STOP, REWIND or ERR (Burrow's rules)")
    reason: str
    lag_events: int
    lag_seconds: float | None
    streams: dict[str, StreamLagOut]
    window: dict = Field(description="the evaluation window: samples, interval_seconds, seconds")
    sampler_error: str | None
    series: LagSeriesOut
    consumers: list[ConsumerLagOut] = Field(description="every consumer of the log (fan-out: the serving pipeline"
                                            " first, then every other named pipeline) with its lag; the fields"
                                            " above are the serving pipeline's")


class ValueStatsOut(BaseModel):
    n: int
    sum: float
    min: float | None
    max: float | None


class PaneStatsOut(BaseModel):
    count: int
    values: dict[str, ValueStatsOut] = Field(description="per value field")
    distinct: dict[str, float] = Field(description="per distinct field: the HLL estimate")


class CorrectionOut(BaseModel):
    type: str = Field(description="'correction'")
    id: int
    stream: str
    pane_start_ms: int
    pane_end_ms: int
    dims: dict[str, str]
    revision_from: int
    revision_to: int
    batch_id: int
    events_added: int
    at_ms: int
    old: PaneStatsOut
    new: PaneStatsOut


class CorrectionsOut(BaseModel):
    corrections: list[CorrectionOut]
    count: int


class DeadLetterOut(BaseModel):
    id: int
    stream: str
    partition: int
    offset: int
    reason: str
    error: str | None
    event_time_ms: int | None
    ingest_time_ms: int | None
    dims: dict | None
    batch_id: int
    at_ms: int
    clock_correction_ms: int | None = Field(None, description="added to event_time_ms (the device's own stamp) by"
                                            " its clock offset before the rules judged it; null: not shifted")


class DeadLettersOut(BaseModel):
    dead_letters: list[DeadLetterOut]
    count: int
    totals_by_reason: dict[str, dict[str, int]] = Field(description="stream -> reason -> dead letters")


class RuleOut(_Open):
    """The rule's definition (its kind's fields, durations as text) and its state."""

    name: str
    kind: str
    source: str = Field(description="'api' or 'file' (read-only through the API)")
    silenced_until_ms: int | None
    created_ms: int
    updated_ms: int
    state: str = Field(description="the worst state of its instances: error, firing, nodata, pending, resolved, normal")


class RulesOut(BaseModel):
    rules: list[RuleOut]


class AlertInstanceOut(_Open):
    rule: str
    state: str
    silenced: bool


class AlertEventOut(_Open):
    id: int


class AlertsOut(BaseModel):
    active: list[AlertInstanceOut]
    history: list[AlertEventOut] = Field(description="state changes, newest first (oldest first after after_id)")
