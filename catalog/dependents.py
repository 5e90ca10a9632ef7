"""What else a stream's records feed, besides the stream's own output (issue 16, the switch).

A switch replaces the rows keyed by the stream's name (store/switch.py) and moves the serving
pipeline's offsets of the stream back to where the run stopped. State keyed by another name,
built from the same records by the live pipeline, would not follow: a window join's state and
output (keyed by the join), a pattern's state and matches (keyed by the pattern), a view's rows
(keyed by the view), the row versions other streams are enriched from (built only while an
enriching stream reads the table). Until runs rebuild those with the stream, a switch of such a
stream is refused with the list this module gives. Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.enrichment import enrichment_tables

if TYPE_CHECKING:
    from catalog.model import Catalog, StreamDef


def stream_dependents(catalog: Catalog, stream: str) -> list[str]:
    """Human-readable names of what `stream`'s records feed under another name, sorted."""
    out = []
    for join in catalog.joins:
        if stream in (join.left.stream, join.right.stream):
            out.append(f"join {join.name!r}")
    for pattern in catalog.patterns:
        steps = [s.stream for s in pattern.steps]
        if pattern.not_followed_by is not None:
            steps.append(pattern.not_followed_by.stream)
        if stream in steps:
            out.append(f"pattern {pattern.name!r}")
    for name, view in catalog.views.items():
        if stream in (view.left, view.right):
            out.append(f"view {name!r}")
    for name, other in catalog.streams.items():
        if any(stream in enrichment_tables(catalog, decl) for decl in other.enrich):
            out.append(f"enrichment of {name!r}")
    return sorted(out)


def moved_with(stream: str, *definitions: StreamDef) -> list[str]:
    """The derived streams a switch of `stream` moves with it: those its own declaration generates
    (`<stream>_sessions` for `sessions`, `<stream>_clocks` for a sent time), which a run builds in
    its own batches. Given the served and the run's declarations, the names either of them has:
    an output one of them lacks is moved out (kept with the old output) or in all the same."""
    from catalog.clocks import clocks_stream_name
    from catalog.features import sessions_stream_name

    out = set()
    for definition in definitions:
        if definition.sessions is not None:
            out.add(sessions_stream_name(stream))
        if definition.sent_time_field is not None:
            out.add(clocks_stream_name(stream))
    return sorted(out)
