"""Change data capture status: GET /api/v1/cdc (each CDC-fed table's snapshot, position, lag and
errors: ingest/cdc/follower.py) and its gauges on /metrics."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, Field

from api.context import ApiContext


class CdcSchemaOut(BaseModel):
    missing: list[str] = Field(description="declared columns the source table lacks")
    ignored: list[str] = Field(description="source columns that are not the key, a dimension or a value")
    added: list[str] = Field(description="columns added to the source table since the snapshot")
    removed: list[str] = Field(description="columns dropped from the source table since the snapshot")


class CdcSourceOut(BaseModel):
    stream: str
    table: str = Field(description="the PostgreSQL table followed")
    dsn: str = Field(description="postgres_dsn as configured (${NAME} references, never their values)")
    slot: str
    publication: str
    state: str = Field(description="stopped (another replica leads), snapshotting, streaming or error")
    error: str | None = Field(description="why the last attempt failed (it is retried with back-off)")
    warning: str | None = Field(description="a setup problem found at the snapshot (deletes without the key)")
    applied_lsn: str | None = Field(description="every change of the table before it is in the log")
    logged_lsn: str | None = Field(description="the position recorded with the last append")
    server_lsn: str | None
    slot_confirmed_lsn: str | None
    lag_bytes: int | None = Field(description="server LSN minus applied LSN")
    lag_seconds: float | None = Field(description="since the follower last found no change waiting")
    retained_wal_bytes: int | None = Field(description="WAL the slot makes the database keep")
    snapshot_rows: int | None
    snapshot_lsn: str | None
    snapshot_at_ms: int | None
    snapshot_done: bool | None = Field(description="false while the snapshot's chunks are being appended")
    snapshot_rows_done: int | None = Field(description="while snapshotting: the rows appended so far")
    snapshot_rows_estimate: int | None = Field(description="while snapshotting: PostgreSQL's estimate of the"
                                               " table's rows (pg_class.reltuples; 0 before an ANALYZE)")
    snapshot_rows_unchanged: int = Field(description="rows a snapshot taken again (after a crash while snapshotting"
                                         " or a lost slot) found as the stream held them: not appended again")
    upserts: int
    deletes: int
    transactions: int
    truncates: int
    resyncs: int = Field(description="new snapshots taken because the slot was gone")
    rejected: int = Field(description="source changes the table refused")
    last_rejection: str | None
    schema_: CdcSchemaOut | None = Field(alias="schema", description="the source table's columns against the stream's")


class CdcOut(BaseModel):
    sources: list[CdcSourceOut]


def router(ctx: ApiContext) -> APIRouter:
    r = APIRouter()

    @r.get("/api/v1/cdc", tags=["status"], response_model=CdcOut, response_model_by_alias=True,
           summary="Change data capture: per CDC-fed table its slot, applied LSN, lag, snapshot and errors")
    def cdc() -> CdcOut:
        return CdcOut(sources=[CdcSourceOut.model_validate(f.status()) for f in ctx.cdc or ()])

    return r


def cdc_metrics(followers) -> list:
    """Gauges and counters of every CDC follower (labels: stream)."""
    lag_bytes = GaugeMetricFamily("sketchboard_cdc_lag_bytes", "WAL bytes between the source database's current"
                                  " LSN and the one applied to the log", labels=["stream"])
    lag_seconds = GaugeMetricFamily("sketchboard_cdc_lag_seconds", "Seconds since the follower last found no"
                                    " change waiting in its slot", labels=["stream"])
    retained = GaugeMetricFamily("sketchboard_cdc_retained_wal_bytes", "WAL bytes the replication slot makes the"
                                 " source database keep (its restart_lsn to the current LSN)", labels=["stream"])
    failing = GaugeMetricFamily("sketchboard_cdc_error", "1 while the follower's last attempt failed (see"
                                " GET /api/v1/cdc)", labels=["stream"])
    schema = GaugeMetricFamily("sketchboard_cdc_schema_changed", "1 when the source table's columns differ from"
                               " those at the snapshot, or lack a declared column", labels=["stream"])
    snapshot = GaugeMetricFamily("sketchboard_cdc_snapshot_rows", "Rows of the source table's snapshot",
                                 labels=["stream"])
    changes = CounterMetricFamily("sketchboard_cdc_changes", "Changes appended to the log since the start,"
                                  " by op", labels=["stream", "op"])
    rejected = CounterMetricFamily("sketchboard_cdc_rejected", "Source changes the table refused (reason: GET"
                                   " /api/v1/cdc)", labels=["stream"])
    for follower in followers or ():
        s = follower.status()
        name = [s["stream"]]
        for family, value in ((lag_bytes, s["lag_bytes"]), (lag_seconds, s["lag_seconds"]),
                              (retained, s["retained_wal_bytes"]), (snapshot, s["snapshot_rows"])):
            if value is not None:
                family.add_metric(name, value)
        failing.add_metric(name, 1 if s["state"] == "error" else 0)
        report = s["schema"]
        schema.add_metric(name, 1 if report and (report["added"] or report["removed"] or report["missing"]) else 0)
        changes.add_metric([*name, "upsert"], s["upserts"])
        changes.add_metric([*name, "delete"], s["deletes"])
        rejected.add_metric(name, s["rejected"])
    return [lag_bytes, lag_seconds, retained, failing, schema, snapshot, changes, rejected]
