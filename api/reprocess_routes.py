"""/api/v1/reprocess: reprocessing runs (issue 16; docs/reprocessing.md) — list, one run's
progress, and start one (admin scope, audited: api/security/policy.py, api/audit/)."""

from __future__ import annotations

from fastapi import APIRouter, Body, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from aggregates.reprocess import DefinitionUnchanged, NeedsAlignment, ReprocessService, SwitchRefused
from api.errors import ParamHTTPError, errors
from store.definitions import RunGoing


class ReprocessIn(BaseModel):
    stream: str = Field(description="the stream to reprocess with its configured definition")


class PartitionProgressOut(BaseModel):
    partition: int
    done: int = Field(description="offsets read and committed since the run started")
    to_do: int = Field(description="offsets from the run's start to the log's end when it started")
    stream: str | None = Field(None, description="the stream of the partition, when the run reads more than its"
                               " own to the log's end (a table's run: the streams enriched from it)")


class ProgressOut(BaseModel):
    done: int
    to_do: int
    fraction: float
    events_per_s: float | None = Field(description="offsets done per second since the run started")
    eta_s: float | None = Field(description="seconds left at that rate (0 when done, null before the first commit)")
    partitions: list[PartitionProgressOut]


class ReprocessRunOut(BaseModel):
    id: str = Field(description="reprocess-<stream>-<version8>: also its pipeline's name and store namespace")
    stream: str
    version: str = Field(description="the definition version the run computes (catalog/versions.py)")
    state: str = Field(description="starting | running | caught_up | failed | stopped")
    error: str | None
    started_at_ms: int
    updated_at_ms: int
    complete_from_ms: int = Field(description="the new output holds every event from this time on: older records"
                                  " are gone from the log (its retention) or older than the stream's retention")
    namespace: str
    serving: bool = Field(description="the served output (the store's root) is built with this run's version")
    progress: ProgressOut


class VersionOut(BaseModel):
    version: str
    namespace: str = Field(description="where that output is: '' the store's root (served), else a run's or a"
                           " previous output's namespace")
    serving: bool


class ReprocessListOut(BaseModel):
    runs: list[ReprocessRunOut]
    versions: dict[str, list[VersionOut]] = Field(description="per stream, the outputs GET /api/v1/query?version="
                                                  " can answer from: the served one first")
    changed: dict[str, dict] = Field(description="streams whose configured definition differs from the one their"
                                     " served output is built with: {stream: {serving_version, configured_version}}")


class SwitchOut(BaseModel):
    stream: str
    serving_version: str
    from_run: str = Field(description="the run (or previous output) whose rows are served now")
    previous: str = Field(description="where the replaced output is kept: switch to it to switch back")
    offsets: dict[str, int] = Field(description="per partition, where the serving pipeline reads the stream from"
                                    " next (the run's end offsets), with the new definition")
    at_ms: int
    enriched: list[str] = Field([], description="a table's switch: the streams enriched from it that moved with it"
                                " (rebuilt by its run; their replaced outputs kept in `previous` too)")


class SwitchStartedOut(BaseModel):
    switching: bool = Field(description="true: a synchronized switch runs in a child process")
    run: ReprocessRunOut
    message: str


class DropOut(BaseModel):
    dropped: str


def changed_json(service: ReprocessService) -> dict[str, dict]:
    return {stream: {"serving_version": old, "configured_version": new}
            for stream, (old, new) in sorted(service.changes().items())}


def router(service: ReprocessService) -> APIRouter:
    r = APIRouter(prefix="/api/v1/reprocess", tags=["reprocess"])

    @r.get("", summary="Reprocessing runs with their progress, and the streams whose definition changed",
           response_model=ReprocessListOut)
    async def runs() -> dict:
        def answer() -> dict:
            from catalog.versions import versioned_streams

            return {"runs": [service.to_json(run) for run in service.runs()], "changed": changed_json(service),
                    "versions": {name: service.versions(name) for name in sorted(versioned_streams(service.catalog))}}

        return await run_in_threadpool(answer)

    @r.get("/{run_id}", summary="One reprocessing run: offsets done / to do per partition, events/s, ETA",
           response_model=ReprocessRunOut, responses=errors(404, e404="no such run"))
    async def run(run_id: str) -> dict:
        def answer() -> dict:
            found = service.run(run_id)
            if found is None:
                raise HTTPException(404, f"no reprocessing run {run_id!r}")
            return service.to_json(found)

        return await run_in_threadpool(answer)

    @r.post("", status_code=202, response_model=ReprocessRunOut,
            summary="Start reprocessing a stream whose definition changed (admin): a second pipeline reads the log"
                    " from its earliest retained offset into a versioned output beside the served one",
            responses=errors(400, 404, 409, e404="unknown stream",
                             e409="the stream's definition is unchanged, or a run of it is going"))
    async def start(body: ReprocessIn = Body(...)) -> dict:
        def answer() -> dict:
            try:
                return service.to_json(service.start(body.stream))
            except KeyError as exc:
                raise ParamHTTPError(404, "stream", exc.args[0]) from None
            except (DefinitionUnchanged, RunGoing) as exc:
                raise ParamHTTPError(409, "stream", str(exc)) from None

        return await run_in_threadpool(answer)

    @r.post("/{run_id}/switch", response_model=SwitchOut,
            summary="Serve the run's output (admin): in one transaction the stream's served rows are replaced by"
                    " the run's, the old ones kept as previous-<stream>-<version8> (switch to it to switch back)",
            responses={202: {"model": SwitchStartedOut,
                             "description": "the run has read less of the stream than the serving pipeline (it"
                                            " reads on to the log's end first), or the stream feeds a window join,"
                                            " a pattern over two streams or a view (a synchronized switch): the"
                                            " switch was started in a child process"},
                       **errors(404, 409, e404="no such run", e409="the run has not caught up, is served already, its"
                                " output is gone, a state the stream feeds would be left built the old way, or a"
                                " switch in a child process could not be started or aligned")})
    async def switch(run_id: str) -> dict:
        def answer() -> dict:
            try:
                try:
                    return service.switch(run_id)
                except NeedsAlignment as needs:  # the run reads on first (a join's: in step), in a child process
                    run = service.start_switch(run_id)
                    return JSONResponse(status_code=202, content={
                        "switching": True, "run": service.to_json(run),
                        "message": f"{needs}: a switch that reads on first was started in a child process;"
                                   f" GET /api/v1/reprocess/{run.id} shows it caught up, and serving, when done"})
            except KeyError as exc:
                raise ParamHTTPError(404, "run_id", exc.args[0]) from None
            except SwitchRefused as exc:
                raise ParamHTTPError(409, "run_id", str(exc)) from None

        return await run_in_threadpool(answer)

    @r.post("/{run_id}/drop", response_model=DropOut,
            summary="Delete a run's or previous output (admin): its namespace, checkpoint, registry entry and run",
            responses=errors(404, 409, e404="no such run", e409="the run is going, or its version is the served one"))
    async def drop(run_id: str) -> dict:
        def answer() -> dict:
            try:
                service.drop(run_id)
            except KeyError as exc:
                raise ParamHTTPError(404, "run_id", exc.args[0]) from None
            except SwitchRefused as exc:
                raise ParamHTTPError(409, "run_id", str(exc)) from None
            return {"dropped": run_id}

        return await run_in_threadpool(answer)

    return r


def definitions_status(service: ReprocessService) -> dict[str, dict]:
    """The `definitions` section of GET /api/v1/pipeline: per stream, the version of the configured
    definition, the one the served output is built with (null before the pipeline first ran), and
    whether they differ (then the served output keeps the stored meaning until a switch)."""
    from catalog.versions import catalog_versions

    stored = {name: d.version for name, d in service.definitions.definitions().items()}
    return {name: {"configured_version": version, "serving_version": stored.get(name),
                   "changed": name in stored and stored[name] != version}
            for name, version in sorted(catalog_versions(service.catalog).items())}


def reprocess_metrics(service: ReprocessService):
    """Gauges for /metrics: a changed definition per stream, and each run's progress."""
    from prometheus_client.core import GaugeMetricFamily

    changed = GaugeMetricFamily("sketchboard_definition_changed", "1 while the stream's configured definition differs"
                                " from the one its served output is built with (reprocess to apply it)",
                                labels=["stream"])
    for name, status in definitions_status(service).items():
        changed.add_metric([name], 1 if status["changed"] else 0)
    done = GaugeMetricFamily("sketchboard_reprocess_offsets_done", "Offsets a reprocessing run has committed",
                             labels=["run", "stream", "state"])
    to_do = GaugeMetricFamily("sketchboard_reprocess_offsets_to_do", "Offsets a reprocessing run has to read (to the"
                              " log's end when it started)", labels=["run", "stream", "state"])
    for run in service.runs():
        progress = service.progress(run)
        done.add_metric([run.id, run.stream, run.state], progress.done)
        to_do.add_metric([run.id, run.stream, run.state], progress.to_do)
    yield from (changed, done, to_do)
