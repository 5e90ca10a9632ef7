"""Definition versions: a stable content hash of what shapes a stream's panes (issue 16, reprocessing).

Two definitions with the same version compute the same panes from the same log; a different
version means the stored output was built another way and only a reprocessing run over the log
brings it in line (docs/reprocessing.md).

What counts (the *shaping* part), with the values as the pipeline uses them (defaults filled in):

- time_field, dimensions, values, distinct fields (the key when none are declared), pane,
  allowed_lateness (which panes are final, which merges are corrections), retention and
  max_future_skew (which events are dead-lettered), first_seen / membership / sessions,
  event_id_field with its dedup_window, the device clock fields (sent_time_field, the device
  field, clock_tolerance, clock_window), the enrichments (`enrich`: table, by, columns; the key is
  only present when a stream declares one, so streams without enrichment keep their versions);
  for an enrichment through a view, the view's declaration (left, right, foreign_key, kind: what
  the lookup joins), when the catalog is given (`catalog_versions` always gives it).

What does not count:

- description; key_field itself (it only partitions the log; its part in distinct and the device
  clock is counted through those); partitions (the log's layout, not the panes);
  partition_idle_timeout (when panes become final in processing time: not reproducible anyway);
  tiers and rollup_group_bys (rebuilt from the panes whenever they change: aggregates/pipeline.py
  configure_tiers; from the first stored pane on, older rows of a tier kept before stay, a new
  tier has none before the panes); metrics (named views over the panes: adding one needs no reprocessing);
  derived streams (generated from their parent's `sessions`, which is in the parent's version).

Dimensions, values and distinct fields are sets for the panes (stored by name), so their order
does not change the version. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from catalog.model import Catalog, StreamDef
    from catalog.views import ViewDef

# Bumped when the meaning of a field here changes, so every stored version differs from the new ones.
VERSION_SCHEME = 1
SHORT_VERSION_CHARS = 8


def shaping_definition(stream: StreamDef, catalog: Catalog | None = None) -> dict:
    """The part of `stream` that shapes its panes, as plain JSON values (see the module doc).
    `catalog` resolves the views an enrichment looks up through (their declaration counts)."""
    def feature(decl) -> dict | None:
        return None if decl is None else decl.model_dump(mode="json")

    from catalog.enrichment import enrichment_definition

    out = {
        "scheme": VERSION_SCHEME,
        "time_field": stream.time_field,
        "dimensions": sorted(stream.dimensions),
        "values": sorted(stream.values),
        "distinct": sorted(stream.distinct_fields),
        "pane_ms": stream.pane,
        "allowed_lateness_ms": stream.allowed_lateness,
        "retention_ms": stream.retention,
        "max_future_skew_ms": stream.max_future_skew,
        "first_seen": feature(stream.first_seen),
        "membership": feature(stream.membership),
        "sessions": feature(stream.sessions),
        "event_id_field": stream.event_id_field,
        "dedup_window_ms": stream.dedup_window_ms,
        "clock": None if stream.sent_time_field is None else {
            "sent_time_field": stream.sent_time_field, "device_field": stream.device_key_field,
            "tolerance_ms": stream.clock_tolerance, "window_ms": stream.clock_window},
    }
    if stream.enrich:
        views = None if catalog is None else {**catalog.views, **catalog.pinned_views.get(stream.name, {})}
        out["enrich"] = enrichment_definition(stream, views)
    return out


def definition_version(stream: StreamDef, catalog: Catalog | None = None) -> str:
    """The stream's definition version: sha256 (hex) of its shaping definition as canonical JSON
    (`catalog`: where the views it is enriched through are declared)."""
    text = json.dumps(shaping_definition(stream, catalog), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def short_version(version: str) -> str:
    return version[:SHORT_VERSION_CHARS]


def versioned_streams(catalog: Catalog) -> dict[str, StreamDef]:
    """The streams that carry a version of their own: those read from the log (not derived)."""
    return {name: s for name, s in catalog.streams.items() if not s.derived_from}


def catalog_versions(catalog: Catalog) -> dict[str, str]:
    """Each stream's version; a stream pinned as stored (`pinned_catalog`) keeps its stored version:
    it is computed as stored, and a view it is enriched through is the configured one (a pipeline
    has one declaration of a view), which alone must not make its commits look switched."""
    return {name: catalog.pinned_versions.get(name) or definition_version(s, catalog)
            for name, s in versioned_streams(catalog).items()}


# The key of a stored declaration that holds the views its enrichments looked up through.
ENRICH_VIEWS = "enrich_views"


def stream_document(stream: StreamDef, catalog: Catalog | None = None) -> dict:
    """The whole declaration of a stream as JSON (what the store keeps beside the version, so the
    live pipeline can go on computing it the old way): the fields as declared, defaults left out.
    With `catalog`, the declarations of the views it is enriched through ride along under
    `enrich_views` (they count in its version: a pipeline pinning it looks up through them)."""
    doc = stream.model_dump(mode="json", exclude_defaults=True)
    if catalog is not None:
        views = {d.table: catalog.views[d.table] for d in stream.enrich if d.table in catalog.views}
        if views:
            doc[ENRICH_VIEWS] = {name: view.model_dump(mode="json", exclude={"name", "description"})
                                 for name, view in sorted(views.items())}
    return doc


def stored_stream(doc: dict) -> StreamDef:
    """The stream a stored declaration (`stream_document`) declares."""
    from catalog.model import StreamDef

    return StreamDef(**{k: v for k, v in doc.items() if k != ENRICH_VIEWS})


def stored_views(doc: dict) -> dict[str, ViewDef]:
    """The views a stored declaration was enriched through, as they were declared then (none for a
    declaration stored before they were kept: the configured ones stand in)."""
    from catalog.views import ViewDef

    return {name: ViewDef(name=name, **view) for name, view in (doc.get(ENRICH_VIEWS) or {}).items()}


def changed_streams(catalog: Catalog, stored_versions: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{stream: (stored version, configured version)} for each stream whose stored output was built
    with another definition than the configuration's (streams with nothing stored are new, not changed)."""
    current = catalog_versions(catalog)
    return {name: (stored_versions[name], version) for name, version in current.items()
            if name in stored_versions and stored_versions[name] != version}


# The stream fields that do not count in the version (module doc): a pinned stream takes them from
# the configuration, not from its stored declaration. The stored declaration is recorded once and
# kept until a switch, so taking them from it would undo a tiers / rollup_group_bys / partitions
# change made since (applied at once: no reprocessing needed) as soon as another field changed.
LAYOUT_FIELDS = ("description", "partitions", "partition_idle_timeout", "tiers", "rollup_group_bys")


def with_layout(configured: StreamDef, stored_doc: dict) -> dict:
    """`stored_doc` with the configured stream's LAYOUT_FIELDS. One that does not fit the stored
    declaration (tiers not a multiple of the stored pane, a group-by over a dimension only the
    configuration has) keeps its stored value; a group-by that fits is kept on its own."""
    from catalog.model import StreamDef

    layout = configured.model_dump(mode="json", include=set(LAYOUT_FIELDS))
    dimensions = set(StreamDef(**stored_doc).dimensions)
    layout["rollup_group_bys"] = [g for g in layout["rollup_group_bys"] if set(g) <= dimensions]
    trial = {**stored_doc, **layout}
    try:
        StreamDef(**trial)
        return trial
    except ValueError:
        pass
    doc = dict(stored_doc)
    for name, value in layout.items():  # field by field: what fits goes in
        try:
            StreamDef(**{**doc, name: value})
        except ValueError:
            continue
        doc[name] = value
    return doc


def pinned_catalog(catalog: Catalog, stored_docs: dict[str, dict], stored_versions: dict[str, str] | None = None) -> Catalog:
    """`catalog` with each stream named in `stored_docs` declared as stored there: what a pipeline
    computes an existing output with until a switch. Metrics are kept where the stored
    declaration still has their fields (metrics do not shape panes; the pipeline only needs them
    to be valid); derived streams and their metrics are generated again from the stored ones,
    with the joins, views and patterns that still fit the pinned streams. `stored_versions`: the
    pinned streams' stored versions, which `catalog_versions` then gives for them."""
    from catalog.model import Catalog as CatalogModel, StreamDef

    if not stored_docs:
        return catalog
    streams = {name: with_layout(s, {k: v for k, v in stored_docs[name].items() if k != ENRICH_VIEWS})
               if name in stored_docs else stream_document(s) for name, s in versioned_streams(catalog).items()}
    pinned = {name: StreamDef(**doc) for name, doc in streams.items()}
    # The views a pinned stream's stored definition looked up through, where declared otherwise now
    # (and still over two tables of the catalog): it keeps enriching through them until its switch.
    views: dict[str, dict[str, ViewDef]] = {}
    for name, doc in stored_docs.items():
        for view_name, view in stored_views(doc).items():
            configured = catalog.views.get(view_name)
            if configured is not None and configured.model_copy(update={"description": ""}) == view:
                continue
            if all(pinned.get(t) is not None and pinned[t].kind == "table" for t in (view.left, view.right)):
                views.setdefault(name, {})[view_name] = view
    metrics = {}
    for name, metric in catalog.metrics.items():
        stream = pinned.get(metric.stream)
        if stream is None:
            continue  # a derived stream's metric: generated again
        if ((metric.value and metric.value not in stream.values)
                or (metric.distinct and metric.distinct not in stream.distinct_fields)
                or (metric.first_seen and stream.first_seen is None)):
            continue
        metrics[name] = metric.model_dump(mode="json", exclude_defaults=True)
    # The joins, views and patterns go along (they read the pinned streams as stored), each one
    # that still fits them: one that needs a field only the new declaration has waits for the
    # switch, as the metrics above do.
    # A section is tried whole first: streams enriched through two views need both at once.
    kept: dict = {"joins": [], "views": {}, "patterns": []}
    for section, items in (("views", catalog.views.values()), ("joins", catalog.joins), ("patterns", catalog.patterns)):
        docs = [(item.name, item.model_dump(mode="json", exclude_defaults=True)) for item in items]
        for group in ([docs] if docs else []) + [[d] for d in docs]:
            trial = {**kept, section: ({**kept["views"], **dict(group)} if section == "views"
                                       else [*kept[section], *(doc for _, doc in group)])}
            try:
                CatalogModel(streams=streams, metrics=metrics, pinned_views=views, **trial)
            except ValueError:
                continue
            kept = trial
            if len(group) == len(docs):
                break
    pinned_catalog_ = CatalogModel(streams=streams, metrics=metrics, pinned_views=views, **kept)
    defined = {p.name for p in pinned_catalog_.patterns}
    return pinned_catalog_.model_copy(update={
        "defined_patterns": {n: v for n, v in catalog.defined_patterns.items() if n in defined},
        "pinned_versions": {n: v for n, v in (stored_versions or {}).items() if n in stored_docs}})
