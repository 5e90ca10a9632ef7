"""`/api/v1/alerts`: rules (create, list, get, update, delete, silence) and alert instances
(active now, history); and the websocket's `alerts` feed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, Field, TypeAdapter
from starlette.concurrency import run_in_threadpool

from alerts.rules import Rule
from alerts.service import AlertService, RuleConflict, RuleError
from alerts.states import AlertState
from api.bodies import body_schema, inline_defs, read_json_object
from api.errors import MAX_ID, answered, bad_request, errors
from api.responses import AlertsOut, RuleOut, RulesOut
from catalog import parse_duration_ms
from catalog.model import DurationMs
from store.alerts import StoredRule

# A rule is a few hundred bytes; 64 KiB leaves room for long annotations and refuses a
# body that is only there to fill memory (413).
MAX_RULE_BODY_BYTES = 64 * 1024
MAX_SILENCE_MS = 366 * 86_400_000


class SilenceIn(BaseModel):
    duration: DurationMs = Field(description="how long to silence, e.g. '1h'; more than 0 and at most 366d")


RULE_SCHEMA = inline_defs(TypeAdapter(Rule).json_schema(by_alias=True))
SILENCE_SCHEMA = inline_defs(SilenceIn.model_json_schema())

_SEVERITY = [AlertState.ERROR, AlertState.FIRING, AlertState.NODATA, AlertState.PENDING, AlertState.RESOLVED,
             AlertState.NORMAL]


def rule_out(stored: StoredRule, instances: list[dict]) -> dict:
    states = {AlertState(i["state"]) for i in instances}
    worst = next((s for s in _SEVERITY if s in states), AlertState.NORMAL)
    return {**stored.definition, "source": stored.source, "silenced_until_ms": stored.silenced_until_ms,
            "created_ms": stored.created_ms, "updated_ms": stored.updated_ms, "state": worst.value}


def event_out(entry, *, with_input: bool = False) -> dict:
    """A history entry as the API and the feed show it: without `input` (what the decision read,
    alerts/service.py), unless asked for, as with_corrections_since is, which takes it out."""
    return {"id": entry.id, **{k: v for k, v in entry.data.items() if with_input or k != "input"}}


def router(service: AlertService) -> APIRouter:
    r = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])

    def by_rule(name: str | None = None) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for inst in service.store.instances(name):
            out.setdefault(inst["rule"], []).append(inst)
        return out

    def found(stored: StoredRule | None, name: str) -> dict:
        if stored is None:
            raise HTTPException(404, f"no alert rule named {name!r}")
        return rule_out(stored, by_rule(name).get(name, []))

    async def body(request: Request) -> dict[str, Any]:
        return await read_json_object(request, MAX_RULE_BODY_BYTES)

    def guarded(call, *args):
        return answered(call, *args, invalid=RuleError, conflict=RuleConflict)

    @r.get("/rules", summary="Alert rules, each with its current worst state", response_model=None,
           responses={200: {"model": RulesOut, "description": "the rules"}})
    def list_rules() -> dict:
        instances = by_rule()
        return {"rules": [rule_out(loaded.stored, instances.get(loaded.stored.name, [])) for loaded in service.rules()]}

    @r.get("/rules/{name}", summary="One alert rule", response_model=None,
           responses={200: {"model": RuleOut, "description": "the rule"}, **errors(404, e404="no such rule")})
    def get_rule(name: str) -> dict:
        return found(service.store.rule(name), name)

    @r.post("/rules", status_code=201, summary="Create a rule (see docs/alerts.md for the kinds and fields)",
            response_model=None,
            responses={201: {"model": RuleOut, "description": "the rule, created"},
                       **errors(400, 409, 413, e400="invalid rule", e409="name taken")},
            openapi_extra=body_schema(RULE_SCHEMA, "the rule; `kind` picks its fields"))
    async def create_rule(request: Request) -> dict:
        data = await body(request)
        stored = await run_in_threadpool(guarded, service.create, data)
        return rule_out(stored, [])

    @r.put("/rules/{name}", summary="Replace a rule's definition (rules from the alerts file are read-only)",
           response_model=None,
           responses={200: {"model": RuleOut, "description": "the rule, replaced"},
                      **errors(400, 404, 409, 413, e400="invalid rule", e404="no such rule",
                               e409="declared in the alerts file")},
           openapi_extra=body_schema(RULE_SCHEMA, "the rule's new definition; its name must be the path's"))
    async def replace_rule(name: str, request: Request) -> dict:
        data = await body(request)
        stored = await run_in_threadpool(guarded, service.replace, name, data)
        return found(stored, name)

    @r.delete("/rules/{name}", status_code=204, summary="Delete a rule (rules from the alerts file are read-only)",
              responses=errors(404, 409, e404="no such rule", e409="declared in the alerts file"))
    async def delete_rule(name: str) -> Response:
        if not await run_in_threadpool(guarded, service.delete, name):
            raise HTTPException(404, f"no alert rule named {name!r}")
        return Response(status_code=204)

    @r.post("/rules/{name}/silence", summary="Silence a rule's notifications for a duration ({\"duration\": \"1h\"})",
            response_model=None,
            responses={200: {"model": RuleOut, "description": "the rule, silenced"},
                       **errors(400, 404, 413, e400="bad duration", e404="no such rule")},
            openapi_extra=body_schema(SILENCE_SCHEMA, "how long"))
    async def silence(name: str, request: Request) -> dict:
        data = await body(request)
        try:
            duration = parse_duration_ms(data.get("duration"))
        except (TypeError, ValueError) as exc:
            raise bad_request("duration", f"duration: {exc}") from None
        if not 0 < duration <= MAX_SILENCE_MS:
            raise bad_request("duration", "duration: must be more than 0 and at most a year (366d)")
        return found(service.silence(name, duration), name)

    @r.delete("/rules/{name}/silence", summary="End a rule's silence", response_model=None,
              responses={200: {"model": RuleOut, "description": "the rule, no longer silenced"},
                         **errors(404, e404="no such rule")})
    def unsilence(name: str) -> dict:
        return found(service.silence(name, None), name)

    @r.get("", summary="Active alert instances and the history of state changes (newest first)",
           response_model=None, responses={200: {"model": AlertsOut, "description": "alerts now and their history"}})
    def alerts(rule: str | None = Query(None, description="only this rule"),
               limit: int = Query(100, ge=1, le=10_000, description="history entries"),
               after_id: int = Query(0, ge=0, le=MAX_ID, description="history entries after this id")) -> dict:
        now = service.now_ms()
        silenced = {loaded.stored.name: (loaded.stored.silenced_until_ms or 0) > now for loaded in service.rules()}
        active = [{**inst, "silenced": silenced.get(inst["rule"], False)}
                  for inst in service.store.instances(rule) if AlertState(inst["state"]).active]
        history = [event_out(e, with_input=True) for e in service.store.history(rule=rule, after_id=after_id,
                                                                               limit=limit)]
        service.with_corrections_since(history)  # see docs/alerts.md, "Alerts and corrections"
        return {"active": active, "history": history}

    return r


# The webhook notifier's counters (alerts/webhook.py WebhookNotifier.stats); `standby` counts
# evaluations handed to a replica that did not lead, so a follower shows it is alive.
NOTIFICATION_OUTCOMES = ("sent", "failed", "retried", "dropped", "deduplicated", "standby")


def alert_metrics(service: AlertService):
    """For /metrics: active instances per rule and state (Prometheus' ALERTS, counted), and the
    notifiers' delivery counters."""
    active = GaugeMetricFamily("sketchboard_alerts", "Alert instances per rule and state (pending, firing,"
                               " nodata, error)", labels=["alertname", "alertstate"])
    counts: dict[tuple[str, str], int] = {}
    for loaded in service.rules():
        for state in ("pending", "firing", "nodata", "error"):
            counts[(loaded.stored.name, state)] = 0
    for inst in service.store.instances():
        key = (inst["rule"], inst["state"])
        if key in counts:
            counts[key] += 1
    for (rule, state), n in sorted(counts.items()):
        active.add_metric([rule, state], n)
    yield active
    delivered = CounterMetricFamily("sketchboard_alert_notifications", "Webhook notifications by outcome",
                                    labels=["outcome"])
    # Summed over the notifiers: one sample per outcome (two notifiers adding the same labels
    # would be a duplicate series, which Prometheus rejects).
    totals: dict[str, int] = {}
    for notifier in service.notifiers:
        stats = notifier.stats() if callable(getattr(notifier, "stats", None)) else {}
        for outcome in NOTIFICATION_OUTCOMES:
            if isinstance(stats.get(outcome), int):
                totals[outcome] = totals.get(outcome, 0) + stats[outcome]
    for outcome, n in totals.items():
        delivered.add_metric([outcome], n)
    yield delivered


class AlertsFeed:
    """Websocket topic `alerts`: one `alert` message per new history entry."""

    topic = "alerts"

    def __init__(self, store, batch: int = 500):
        self.store = store
        self.batch = batch
        newest = store.history(limit=1)
        self._after = newest[0].id if newest else 0

    def poll(self) -> list[dict]:
        entries = self.store.history(after_id=self._after, limit=self.batch, newest_first=False)
        if entries:
            self._after = entries[-1].id
        return [{"type": "alert", "event": event_out(e)} for e in entries]
