"""One query path: a query resolved from the catalog and its parameters (query.model) and
computed against the store (query.compute), for REST, the websocket hub and alert rules."""

from query.compute import StatSeries, answer_json, answer_text, compute, point_json, series_json
from query.model import Query, QueryError, Target, check_stat, over, parse_filters, resolve, resolve_target

__all__ = [
    "Query", "QueryError", "StatSeries", "Target", "answer_json", "answer_text", "check_stat", "compute",
    "over", "parse_filters", "point_json", "resolve", "resolve_target", "series_json",
]
