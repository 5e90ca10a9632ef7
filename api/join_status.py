"""The window joins in the pipeline's status (`joins` of GET /api/v1/pipeline) and in /metrics:
per join, its state size (left events kept, right events kept and those still waiting for a
left), its clock and its counters (pairs, right events that matched no left)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from api.context import ApiContext
from store.joins import JoinSizes


def join_status(ctx: ApiContext) -> dict[str, dict]:
    if not ctx.catalog.joins:
        return {}
    sizes = ctx.store.join_sizes()
    out = {}
    for join in ctx.catalog.joins:
        s = sizes.get(join.name, JoinSizes())
        out[join.name] = {
            "left_stream": join.left.stream, "right_stream": join.right.stream,
            "within_ms": join.within, "late_horizon_ms": join.late_horizon, "clock_ms": s.clock_ms,
            "left_rows": s.left_rows, "right_rows": s.right_rows, "pending_right": s.pending_right,
            "pairs": s.pairs, "unmatched_right": s.unmatched_right,
        }
    return out


def join_metrics(joins: dict[str, dict]):
    """Prometheus families of join_status's answer."""
    state = GaugeMetricFamily("sketchboard_join_state_rows", "Events kept in a window join's state",
                              labels=["join", "side"])
    pairs = CounterMetricFamily("sketchboard_join_pairs", "Matched pairs a window join counted", labels=["join"])
    unmatched = CounterMetricFamily("sketchboard_join_unmatched_right",
                                    "Right events that left a window join's state without a match", labels=["join"])
    for name, j in joins.items():
        state.add_metric([name, "left"], j["left_rows"])
        state.add_metric([name, "right"], j["right_rows"])
        state.add_metric([name, "pending_right"], j["pending_right"])
        pairs.add_metric([name], j["pairs"])
        unmatched.add_metric([name], j["unmatched_right"])
    return [state, pairs, unmatched]
