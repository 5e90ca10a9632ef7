"""The pipeline follows the patterns defined through the API between batches (issue 24;
docs/patterns.md, "Patterns defined through the API").

Once per batch the pipeline reads the store's change counter of the definitions (one row:
store/pattern_definitions.py); only when it moved does it read them and run the new set of
patterns from that batch on (aggregates/pipeline.py Pipeline.follow_patterns). What the change
does to the patterns' state is decided in the batch itself and written in its own transaction
(aggregates/patterns.py PatternRunner): a pattern whose stored state another definition built
starts from nothing (the state is dropped, its matches stay), a deleted one's state is
dropped. A batch replayed after a crash decides the same from the store again, so a change is
applied once, wholly, or not at all.
"""

from __future__ import annotations

import logging

from catalog import Catalog
from catalog.defined_patterns import catalog_with_patterns
from store.pattern_definitions import PatternDefinitionStore

log = logging.getLogger("sketchboard.pipeline")


class PatternFollower:
    """The configured catalog with the stored patterns, read again when the counter moves."""

    def __init__(self, configured: Catalog, store: PatternDefinitionStore):
        self.configured, self.store = configured, store
        self._version: int | None = None

    def poll(self) -> Catalog | None:
        """The catalog to run from now on when the definitions changed since the last poll (the
        first poll always answers), else None."""
        if self.store.version() == self._version:
            return None
        version, stored = self.store.patterns()
        catalog, skipped = catalog_with_patterns(self.configured, [p.definition for p in stored],
                                                 {p.name: p.version for p in stored})
        for s in skipped:
            log.warning("pattern %r defined through the API is not run: the configuration no longer accepts it: %s",
                        s.name, s.reason)
        if self._version is not None:
            log.info("patterns defined through the API changed (version %d -> %d): running %s", self._version,
                     version, ", ".join(p.name for p in catalog.patterns) or "none")
        self._version = version
        return catalog
