"""The patterns in the pipeline's status (`patterns` of GET /api/v1/pipeline) and in /metrics:
per pattern, its state size (keys held, partial matches, events buffered until the watermark
passes them, events kept in pattern_history for replays of late events), its watermark and its counters (matches, events late for it)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from api.context import ApiContext
from store.patterns import PatternSizes


def pattern_status(ctx: ApiContext) -> dict[str, dict]:
    if not ctx.catalog.patterns:
        return {}
    sizes = ctx.store.pattern_sizes()
    out = {}
    for pattern in ctx.catalog.patterns:
        s = sizes.get(pattern.name, PatternSizes())
        out[pattern.name] = {
            "streams": list(pattern.streams), "key": pattern.key, "watermark_ms": s.watermark_ms,
            "keys_held": s.keys_held, "partial_matches": s.partial_matches, "buffered_events": s.buffered_events,
            "matches": s.matches, "late_events": s.late_events, "history_rows": s.history_rows,
            "dropped_partial_matches": s.dropped_runs,
        }
    return out


def pattern_metrics(patterns: dict[str, dict]):
    """Prometheus families of pattern_status's answer."""
    state = GaugeMetricFamily("sketchboard_pattern_state", "What a pattern holds: keys, partial matches,"
                              " events buffered until the watermark passes them, events kept for replays of"
                              " late events (history_rows)", labels=["pattern", "kind"])
    matches = CounterMetricFamily("sketchboard_pattern_matches", "Matches a pattern emitted", labels=["pattern"])
    late = CounterMetricFamily("sketchboard_pattern_late_events", "Events that came behind a pattern's watermark"
                               " (recorded, not matched)", labels=["pattern"])
    dropped = CounterMetricFamily("sketchboard_pattern_dropped_partial_matches", "Partial matches a pattern did"
                                  " not start or dropped because their key held the most it keeps (1000 runs, 50000"
                                  " events in them)",
                                  labels=["pattern"])
    for name, p in patterns.items():
        state.add_metric([name, "keys"], p["keys_held"])
        state.add_metric([name, "partial_matches"], p["partial_matches"])
        state.add_metric([name, "buffered_events"], p["buffered_events"])
        state.add_metric([name, "history_rows"], p["history_rows"])
        matches.add_metric([name], p["matches"])
        late.add_metric([name], p["late_events"])
        dropped.add_metric([name], p["dropped_partial_matches"])
    return [state, matches, late, dropped]
