"""Evaluating every alert rule at once, due or not: a test's "now" (the service evaluates
rules when their interval comes, alerts.service.AlertService.evaluate_due)."""

from __future__ import annotations

from alerts.evaluator import Evaluation
from alerts.service import AlertService


def evaluate_every_rule(service: AlertService, now_ms: int | None = None) -> list[Evaluation]:
    now = service.now_ms() if now_ms is None else now_ms
    return [service.evaluate_rule(loaded, now) for loaded in service.rules()]
