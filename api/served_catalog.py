"""The catalog the served output was built with: what queries read the root's rows by.

After a configuration change, the pipeline goes on computing a changed stream with the
declaration the root stored for it, until a reprocessing switch (sketchboard/definitions.py,
docs/reprocessing.md). The API's configured catalog is right for ingest (new events are checked
against the configuration) but wrong for reading: a pane, a dimension, membership or first_seen
the configuration has and the stored output does not would be answered from rows built another
way. So queries, membership, websocket subscriptions, alerts and dashboards read through the
catalog pinned as the pipeline pins it (catalog/versions.py pinned_catalog) from the root's
stored definitions; only read here, never recorded (that is the pipeline's part).

The stored definitions change on a switch: the reprocessing service tells this API's replica at
once (`refresh`); another replica's switch is seen within `refresh_s`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from catalog import Catalog
from catalog.versions import changed_streams, pinned_catalog

logger = logging.getLogger("api.served_catalog")

# stream -> (stored version, stored declaration)
StoredDefinitions = Mapping[str, tuple[str, dict]]
# Before any definition was read: one object, so `of` knows it has built for it already (a new {}
# each time made every query hash every stream's definition again).
_NONE: StoredDefinitions = {}


class ServedCatalog:
    def __init__(self, load: Callable[[], StoredDefinitions], *, refresh_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic):
        self._load = load
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._stored: StoredDefinitions | None = None
        self._loaded_at = float("-inf")
        self._loading = False
        self._first = threading.Event()  # the first read is done (failed or not)
        # (configured catalog, the stored definitions read, the pinned ones, the served catalog)
        self._built: tuple[Catalog, StoredDefinitions, dict, Catalog] | None = None

    def refresh(self) -> None:
        """A switch changed the stored definitions: read them again on next use."""
        with self._lock:
            self._loaded_at = float("-inf")

    def of(self, configured: Catalog) -> Catalog:
        """`configured` with each stream whose stored definition differs from it declared as stored."""
        return self.with_pending(configured)[0]

    def with_pending(self, configured: Catalog) -> tuple[Catalog, StoredDefinitions]:
        """The served catalog (`of`), and the streams declared as stored in it: {stream: (stored
        version, stored declaration)}, whose configured definition waits for a switch."""
        stored = self._stored_definitions()
        built = self._built
        if built is not None and built[0] is configured and built[1] is stored:  # per query: no hashing
            return built[3], built[2]
        pinned = {name: stored[name] for name in changed_streams(configured, {n: v for n, (v, _) in stored.items()})}
        if built is not None and built[0] is configured and built[2] == pinned:
            served = built[3]
        else:
            served = with_added_dimensions(pinned_catalog(configured, {n: doc for n, (_, doc) in pinned.items()},
                                                          {n: v for n, (v, _) in pinned.items()}), configured)
        self._built = (configured, stored, pinned, served)
        return served, pinned

    def _stored_definitions(self) -> StoredDefinitions:
        """Read again every `refresh_s` by one caller at a time, outside the lock: the others go on
        with what was read before (a store that is away would otherwise hold every query behind
        one read waiting out its connection timeout). A read that fails is not tried again for
        `refresh_s` either; until one succeeds, the configured catalog is served as it is."""
        with self._lock:
            now = self._clock()
            if now - self._loaded_at < self.refresh_s:  # read (or failed) lately
                return self._stored if self._stored is not None else _NONE
            if self._loading and self._stored is not None:  # another caller reads it again
                return self._stored
            waits = self._loading  # the first read, under way in another caller
            self._loading = True
        if waits:
            self._first.wait(self.refresh_s + 30)
            with self._lock:
                return self._stored if self._stored is not None else _NONE
        loaded = None
        try:
            loaded = dict(self._load())
        except Exception as exc:  # the store away: answer with what was read before (or none)
            logger.warning("could not read the stored stream definitions: %s", exc)
        with self._lock:
            self._loading = False
            self._loaded_at = now
            if loaded is not None:
                self._stored = loaded
            self._first.set()
            return self._stored if self._stored is not None else _NONE


def with_added_dimensions(served: Catalog, configured: Catalog) -> Catalog:
    """`served` with the dimensions each pinned stream's configuration added since: grouped or
    filtered by, the stored output answers one group "" (its rows have no value for it) until the
    switch, as a dimension added to a stream always reads for rows made before it
    (docs/reprocessing.md); the dashboards and rules written for it keep working meanwhile. A
    removed dimension stays (the stored output has it), a changed pane or feature goes by the stored."""
    streams = {}
    for name, stream in served.streams.items():
        wanted = configured.streams.get(name)
        added = () if wanted is None or wanted is stream else tuple(
            d for d in wanted.dimensions if d not in stream.dimensions and d not in wanted.enriched_dimensions)
        streams[name] = stream.model_copy(update={"dimensions": (*stream.dimensions, *added)}) if added else stream
    if all(streams[n] is s for n, s in served.streams.items()):
        return served
    return served.model_copy(update={"streams": streams})


def stored_definitions(definitions) -> Callable[[], StoredDefinitions]:
    """The loader over a store.definitions.DefinitionStore (the root's)."""
    return lambda: {name: (d.version, d.definition) for name, d in definitions.definitions().items()}


# Where a pending definition is explained (every listing that names one points there).
PENDING_NOTE = ("the configuration changed this stream's definition: until a reprocessing switch"
                " (docs/reprocessing.md) it is listed, queried and alerted on as the served output is built")


def pending_definitions(configured: Catalog, served: Catalog,
                        pinned: StoredDefinitions) -> dict[str, dict]:
    """{stream: what its configuration changed that the served output does not have yet} for each
    stream declared as stored in `served` and each stream derived from one: the version served and
    the configured one, and per field of the definition (catalog/versions.py shaping_definition)
    that differs, its `served` and `configured` value. A stream not listed is served as configured."""
    from catalog.versions import catalog_versions, shaping_definition, stored_stream

    versions = catalog_versions(configured)
    out = {}
    for name, (version, doc) in pinned.items():
        if name not in configured.streams:
            continue
        was = shaping_definition(stored_stream(doc), served)
        now = shaping_definition(configured.streams[name], configured)
        out[name] = {
            "serving_version": version,
            "configured_version": versions.get(name),
            "changes": {field: {"served": was.get(field), "configured": now.get(field)}
                        for field in sorted(was.keys() | now.keys()) if was.get(field) != now.get(field)},
            "note": PENDING_NOTE,
        }
    for catalog in (configured, served):  # derived streams (sessions): pending with the stream they come from
        for name, stream in catalog.streams.items():
            if stream.derived_from in out and name not in out:
                out[name] = out[stream.derived_from]
    return out
