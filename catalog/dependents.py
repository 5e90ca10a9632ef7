"""What else a stream's records feed, besides the stream's own output (issue 16, the switch).

A switch replaces the rows keyed by the stream's name (store/switch.py) and moves the serving
pipeline's offsets of the stream back to where the run stopped. State keyed by another name,
built from the same records by the live pipeline, must follow or the switch is refused:

- rebuilt by the run and switched with the stream (`rebuilt_patterns`): a pattern whose steps
  and absence all read the stream. The run reads nothing else, so its state as of the run's end
  is exact, and the serving pipeline going on from the run's end offsets feeds it each record once.
- rebuilt by the run reading the join's other stream too, and switched in step with the serving
  pipeline (`aligned_joins`): a window join. The run reads the other stream
  only as far as the serving pipeline has; a synchronized switch holds the serving pipeline's
  commits, lets the run read the other stream exactly as far, and moves the join's state and
  derived stream with the stream (aggregates/reprocess.py), so every record of the other stream
  reaches the rebuilt state once: before the switch in the run, after it in the serving pipeline.
- a pattern over the stream and other streams (`aligned_patterns`): the same
  as a join (its state, like the join's, is keyed by its name and built from every stream it
  reads): the run reads the other streams as far as the serving pipeline has, and the
  synchronized switch moves its state and matches with the stream.
- a table-table join view (`aligned_views`): the same as a join (its rows,
  keyed by its name, are built from both tables): the run reads the other table as far as the
  serving pipeline has, and the synchronized switch moves the view's rows with the table and
  appends the difference to the view's changelog (store/switch.py move_view).
- the streams enriched from a table (`enriched_streams`, on both logs; directly or
  through a view): the table's row versions they look up are built by their pipeline while it
  reads the table, and their output holds what those versions gave. So a run of the table
  rebuilds each such stream whole with the table's new definition, and the switch moves the
  stream's output, its offsets and the table's versions with the table (aggregates/reprocess.py).
  A stream that needs nothing else is read to the log's end: a switch of several streams read
  from the log, no hold needed. One the run reads only as far as the serving pipeline has
  (`aligned_enrichments`, switched in step like a join's other stream, its offsets where the
  serving pipeline's are): one also enriched from a table the run reads capped (through a view:
  its lookups need that table's changes as far as its own records), and one that feeds a join
  or a pattern itself, the table's own included (`enrichment_feeds`: their state, rebuilt by the
  run reading their other streams capped too, gets the stream's records after the switch once,
  from the serving pipeline).
- refused (`refused_dependents`): a pattern over two streams, a window join or a view where the
  run cannot stop the other stream at chosen offsets (no log now: the embedded source takes caps,
  on Kafka a run drives batches with chosen ends, aggregates/bounded_batches.py). The serving
  pipeline is past the run's end in that other stream; its records since would have to be fed
  again to the rebuilt state but not to that stream's own output (nor to its other dependents),
  which one pipeline reading the log once cannot do.
Pure: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from catalog.enrichment import enrichment_tables

if TYPE_CHECKING:
    from catalog.joins import JoinDef
    from catalog.model import Catalog, StreamDef
    from catalog.patterns import PatternDef
    from catalog.views import ViewDef


def stream_dependents(catalog: Catalog, stream: str) -> list[str]:
    """Human-readable names of what `stream`'s records feed under another name, sorted."""
    out = []
    for join in catalog.joins:
        if stream in join_streams(join):
            out.append(f"join {join.name!r}")
    for pattern in catalog.patterns:
        if stream in pattern_streams(pattern):
            out.append(f"pattern {pattern.name!r}")
    for name, view in catalog.views.items():
        if stream in (view.left, view.right):
            out.append(f"view {name!r}")
    for name, other in catalog.streams.items():
        if any(stream in enrichment_tables(catalog, decl, name) for decl in other.enrich):
            out.append(f"enrichment of {name!r}")
    return sorted(out)


def pattern_streams(pattern: PatternDef) -> set[str]:
    """The streams a pattern reads: its steps' and its absence's."""
    out = {step.stream for step in pattern.steps}
    if pattern.not_followed_by is not None:
        out.add(pattern.not_followed_by.stream)
    return out


def join_streams(join: JoinDef) -> set[str]:
    return {join.left.stream, join.right.stream}


def rebuilt_patterns(catalog: Catalog, stream: str) -> list[PatternDef]:
    """The patterns that read `stream` alone: a run of the stream builds them in its own output
    (sketchboard/reprocess.py stream_catalog) and a switch moves them with it."""
    return [p for p in catalog.patterns if pattern_streams(p) == {stream}]


def aligned_joins(catalog: Catalog, stream: str) -> list[JoinDef]:
    """The window joins that read `stream` (and always one other stream): a run of the stream
    rebuilds them reading the other stream too, and a synchronized switch moves them with it."""
    return [j for j in catalog.joins if stream in join_streams(j)]


def aligned_patterns(catalog: Catalog, stream: str) -> list[PatternDef]:
    """The patterns that read `stream` and another stream: a run of the stream rebuilds them reading
    the other streams too, and a synchronized switch moves them with it, as it does a join."""
    return [p for p in catalog.patterns if stream in pattern_streams(p) and pattern_streams(p) != {stream}]


def aligned_views(catalog: Catalog, stream: str) -> list[ViewDef]:
    """The views that read the table `stream` (and always one other table): a run of the table
    rebuilds them reading the other table too, and a synchronized switch moves them with it."""
    return [v for v in catalog.views.values() if stream in (v.left, v.right)]


def other_streams(catalog: Catalog, stream: str) -> list[str]:
    """The other streams of the joins, the patterns over two streams and the views that `stream`
    feeds, sorted: what a run reads beside it, only as far as the serving pipeline has."""
    read = {s for j in aligned_joins(catalog, stream) for s in join_streams(j)}
    read |= {s for p in aligned_patterns(catalog, stream) for s in pattern_streams(p)}
    read |= {s for v in aligned_views(catalog, stream) for s in (v.left, v.right)}
    return sorted(read - {stream})


def enriched_streams(catalog: Catalog, table: str) -> list[str]:
    """The streams enriched from `table`, directly or through a view, sorted."""
    return sorted(name for name, other in catalog.streams.items()
                  if any(table in enrichment_tables(catalog, decl, name) for decl in other.enrich))


def enrichment_feeds(catalog: Catalog, table: str) -> tuple[list[JoinDef], list[PatternDef]]:
    """The window joins and patterns that the streams a run of `table` rebuilds feed: rebuilt by
    the run too (reading their other streams as far as the serving pipeline has) and moved by its
    synchronized switch, as a run of the enriched stream itself would."""
    rebuilt = set(enriched_streams(catalog, table))
    return ([j for j in catalog.joins if join_streams(j) & rebuilt],
            [p for p in catalog.patterns if pattern_streams(p) & rebuilt])


def aligned_enrichments(catalog: Catalog, table: str) -> list[str]:
    """The streams a run of `table` rebuilds but reads only as far as the serving pipeline has,
    aligned by a synchronized switch (their offsets stay the serving pipeline's): those also
    enriched from a table the run reads so (a view's other table: an event must not be looked up
    before the table's changes appended ahead of it are read), and those that feed a join or a
    pattern (`enrichment_feeds`, the table's own among them: the rebuilt state must get their
    records after the switch once)."""
    capped = set(other_streams(catalog, table))
    joins, patterns = enrichment_feeds(catalog, table)
    feeding = {s for j in joins for s in join_streams(j)} | {s for p in patterns for s in pattern_streams(p)}
    return [s for s in enriched_streams(catalog, table)
            if s in feeding or any(t in capped for decl in catalog.streams[s].enrich
                                   for t in enrichment_tables(catalog, decl, s))]


def capped_streams(catalog: Catalog, table: str) -> list[str]:
    """Every stream a run of `table` reads only as far as the serving pipeline has, sorted (a
    synchronized switch aligns them all): the other streams of its own joins, patterns and views
    (`other_streams`), the `aligned_enrichments` and the other streams of their joins and
    patterns. Never `table` itself, read to the log's end."""
    joins, patterns = enrichment_feeds(catalog, table)
    read = set(other_streams(catalog, table)) | set(aligned_enrichments(catalog, table))
    read |= {s for j in joins for s in join_streams(j)} | {s for p in patterns for s in pattern_streams(p)}
    return sorted(read - {table})


def refused_dependents(catalog: Catalog, stream: str, *, joins_rebuilt: bool = False) -> list[str]:
    """What `stream` feeds that a run does not rebuild (see the module doc), sorted: a switch of
    the stream is refused while there is any. `joins_rebuilt`: the run rebuilt the window joins,
    the patterns over two streams, the views and the streams enriched from the table (a
    synchronized switch can move them)."""
    rebuilt = {f"pattern {p.name!r}" for p in rebuilt_patterns(catalog, stream)}
    if joins_rebuilt:
        rebuilt |= {f"enrichment of {s!r}" for s in enriched_streams(catalog, stream)}
        rebuilt |= {f"view {v.name!r}" for v in aligned_views(catalog, stream)}
        rebuilt |= {f"join {j.name!r}" for j in aligned_joins(catalog, stream)}
        rebuilt |= {f"pattern {p.name!r}" for p in aligned_patterns(catalog, stream)}
    return [d for d in stream_dependents(catalog, stream) if d not in rebuilt]


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
