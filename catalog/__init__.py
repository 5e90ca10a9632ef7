"""Stream and metric definitions loaded from configuration (the lowest layer: no I/O but reading the file)."""

from catalog.durations import MAX_DURATION_MS, MAX_DURATION_TEXT, format_duration_ms, parse_duration_ms
from catalog.loader import ConfigError, load_catalog, parse_catalog
from catalog.model import Catalog, MetricDef, StreamDef

__all__ = [
    "MAX_DURATION_MS", "MAX_DURATION_TEXT", "Catalog", "ConfigError", "MetricDef", "StreamDef",
    "format_duration_ms", "load_catalog", "parse_catalog", "parse_duration_ms",
]
