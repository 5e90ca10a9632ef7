"""`/api/v1/dashboards`: dashboards of panels, provisioned from the dashboards folder
(read-only here, like the alerts file's rules) or saved through the API (create, replace,
duplicate, delete). Changes need the admin scope and are audited (api/security/policy.py,
api/audit/), as every write is."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from api.bodies import body_schema, inline_defs, read_json_object
from api.errors import answered, bad_request, errors
from dashboard.model import NAME_PATTERN, Dashboard, DashboardError
from dashboard.service import DashboardService
from store.dashboards import DashboardConflict, StoredDashboard

# 24 panels of a few hundred bytes each: 64 KiB is plenty and refuses a body sent to fill memory.
MAX_DASHBOARD_BODY_BYTES = 64 * 1024


class DashboardOut(Dashboard):
    """The dashboard's definition (defaults spelled out, durations as text) and where it comes from."""

    source: str = Field(description="'file' (the dashboards folder: read-only here), 'api' (saved), or"
                        " 'generated' (made from the catalog while no dashboard exists; not stored)")
    created_ms: int
    updated_ms: int


class DashboardsOut(BaseModel):
    dashboards: list[DashboardOut]


class DuplicateIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description="the copy's name")
    title: str | None = Field(None, max_length=200, description="the copy's title; none: the original's")


DASHBOARD_SCHEMA = inline_defs(Dashboard.model_json_schema(by_alias=True))
DUPLICATE_SCHEMA = inline_defs(DuplicateIn.model_json_schema())


# PUT's body: the definition, and optionally the version edited (what GET showed), so a client
# may send back what it loaded.
VERSIONED_SCHEMA = {**DASHBOARD_SCHEMA, "properties": {**DASHBOARD_SCHEMA.get("properties", {}), "updated_ms": {
    "type": "integer", "minimum": 0, "description": "the version edited (GET's updated_ms): a stale one is refused"
    " with 409; none: the body overwrites whatever is stored"}}}


def version(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise bad_request(param, f"{param}: the version edited, as GET showed it (an integer), not {value!r}")
    return value


def dashboard_out(stored: StoredDashboard) -> dict:
    return {**stored.definition, "source": stored.source, "created_ms": stored.created_ms,
            "updated_ms": stored.updated_ms}


def router(service: DashboardService) -> APIRouter:
    r = APIRouter(prefix="/api/v1/dashboards", tags=["dashboards"])

    async def body(request: Request) -> dict[str, Any]:
        return await read_json_object(request, MAX_DASHBOARD_BODY_BYTES)

    def guarded(call, *args):
        return answered(call, *args, invalid=DashboardError, conflict=DashboardConflict)

    def found(stored: StoredDashboard | None, name: str, versioned: bool = False) -> dict:
        if stored is None:
            raise HTTPException(404, f"no dashboard named {name!r}"
                                     + (" (it was deleted since you loaded it)" if versioned else ""))
        return dashboard_out(stored)

    @r.get("", summary="Every dashboard (provisioned, saved; the generated one while there is none)",
           response_model=None, responses={200: {"model": DashboardsOut, "description": "the dashboards, by name"}})
    def list_dashboards() -> dict:
        return {"dashboards": [dashboard_out(d) for d in service.dashboards()]}

    @r.get("/{name}", summary="One dashboard", response_model=None,
           responses={200: {"model": DashboardOut, "description": "the dashboard"},
                      **errors(404, e404="no such dashboard")})
    def get_dashboard(name: str) -> dict:
        return found(service.dashboard(name), name)

    @r.post("", status_code=201, summary="Save a new dashboard", response_model=None,
            responses={201: {"model": DashboardOut, "description": "the dashboard, saved"},
                       **errors(400, 409, 413, e400="invalid dashboard", e409="name taken")},
            openapi_extra=body_schema(DASHBOARD_SCHEMA, "the dashboard and its panels"))
    async def create_dashboard(request: Request) -> dict:
        data = await body(request)
        return dashboard_out(await run_in_threadpool(guarded, service.create, data))

    @r.put("/{name}", summary="Replace a saved dashboard (provisioned ones are read-only)", response_model=None,
           description="With `updated_ms` (the version GET showed, sent back in the body) the change is refused"
                       " with 409 when someone else changed the dashboard since (nothing is written); without it"
                       " the body overwrites whatever is stored (automation that owns the dashboard).",
           responses={200: {"model": DashboardOut, "description": "the dashboard, replaced"},
                      **errors(400, 404, 409, 413, e400="invalid dashboard", e404="no such dashboard",
                               e409="provisioned from the dashboards folder, or changed since the `updated_ms` sent")},
           openapi_extra=body_schema(VERSIONED_SCHEMA, "the dashboard's new definition; its name must be the path's;"
                                     " `updated_ms`: the version edited (optional)"))
    async def replace_dashboard(name: str, request: Request) -> dict:
        data = await body(request)
        expected = version(data.pop("updated_ms", None), "updated_ms")
        return found(await run_in_threadpool(guarded, service.replace, name, data, expected), name, expected is not None)

    @r.post("/{name}/duplicate", status_code=201, summary="Save a copy of a dashboard under a new name",
            response_model=None,
            responses={201: {"model": DashboardOut, "description": "the copy, saved (editable)"},
                       **errors(400, 404, 409, 413, e400="invalid name", e404="no such dashboard",
                                e409="the new name is taken")},
            openapi_extra=body_schema(DUPLICATE_SCHEMA, "the copy's name and title"))
    async def duplicate_dashboard(name: str, request: Request) -> dict:
        data = await body(request)
        unknown = sorted(set(data) - {"name", "title"})
        if unknown:
            raise bad_request(unknown[0], f"{unknown[0]}: unknown field; a copy takes a name and a title")
        new_name, title = data.get("name"), data.get("title")
        if not isinstance(new_name, str):
            raise bad_request("name", "name: the copy's name is required (letters, digits, _ . -)")
        if title is not None and not isinstance(title, str):
            raise bad_request("title", "title: must be text")
        return found(await run_in_threadpool(guarded, service.duplicate, name, new_name, title), name)

    @r.delete("/{name}", status_code=204, summary="Delete a saved dashboard (provisioned ones are read-only)",
              responses=errors(404, 409, e404="no such dashboard",
                               e409="provisioned or generated, or changed since the `updated_ms` sent"))
    async def delete_dashboard(name: str, updated_ms: int | None = Query(
            None, ge=0, description="the version (as GET showed it) the caller means to delete: refused with 409"
                                    " when the dashboard changed since; none: deletes whatever is stored")) -> Response:
        if not await run_in_threadpool(guarded, service.delete, name, updated_ms):
            raise HTTPException(404, f"no dashboard named {name!r}")
        return Response(status_code=204)

    return r
