"""api/served_catalog.py: the catalog the API reads the root by follows the root's stored
definitions (the pipeline's pinned catalog, never recording), and a switch made elsewhere."""

from __future__ import annotations

from api.served_catalog import ServedCatalog, stored_definitions
from catalog import Catalog
from catalog.versions import definition_version, stream_document
from sketchboard.definitions import pin_definitions
from store.definitions import DefinitionStore

OLD = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"]},
                   "orders": {"key_field": "customer", "values": ["amount"]}}}
NEW = {"streams": {**OLD["streams"], "http": {"key_field": "user", "dimensions": ["region"], "pane": "5s",
                                              "membership": {"field": "user", "bucket": "1h"}}}}


def test_the_served_catalog_follows_the_stored_definitions_and_a_switch(store_backend):
    store = store_backend.create()
    old, new = Catalog(**OLD), Catalog(**NEW)
    pin_definitions(store, old, "main")
    definitions = DefinitionStore(store_backend.side_db(store))
    now = [0.0]
    served = ServedCatalog(stored_definitions(definitions), refresh_s=2.0, clock=lambda: now[0])
    assert served.of(old) is old  # nothing changed: the configured catalog itself
    pinned = served.of(new)
    # As stored (its pane, no membership), with the dimension configured since: one group "" until the switch.
    assert pinned.streams["http"] == old.streams["http"].model_copy(update={"dimensions": ("endpoint", "region")})
    assert pinned.streams["orders"] == new.streams["orders"]
    assert served.of(new) is pinned  # built once per configured catalog and stored definitions
    assert set(definitions.definitions()) == {"http", "orders"}  # read, nothing recorded

    # Another replica's switch: seen once refresh_s has passed; a switch through this one at once.
    definitions.replace("http", definition_version(new.streams["http"]), stream_document(new.streams["http"]), 1)
    assert served.of(new) is pinned
    now[0] = 2.0
    assert served.of(new) is new
    definitions.replace("http", definition_version(old.streams["http"]), stream_document(old.streams["http"]), 2)
    served.refresh()
    assert served.of(new).streams["http"].pane == old.streams["http"].pane
    assert served.of(new).streams["http"].membership is None


def test_a_store_that_cannot_be_read_keeps_the_definitions_read_before():
    stored = {"http": (definition_version(Catalog(**OLD).streams["http"]), stream_document(Catalog(**OLD).streams["http"]))}
    answers = [stored]

    def load():
        if not answers:
            raise OSError("store away")
        return answers.pop()

    served = ServedCatalog(load, refresh_s=0)
    new = Catalog(**NEW)
    assert served.of(new).streams["http"].dimensions == ("endpoint", "region")
    assert served.of(new).streams["http"].dimensions == ("endpoint", "region")  # the read failed: as before
    assert ServedCatalog(lambda: (_ for _ in ()).throw(OSError("away"))).of(new) is new  # never read: configured


def test_a_store_that_is_away_is_asked_once_per_refresh_and_never_holds_the_others_up():
    """Every query read the stored definitions under one lock, and a read that failed was tried
    again at once: with the database away, queries waited one after another, each for a read's
    timeout."""
    import threading

    stored = {"http": (definition_version(Catalog(**OLD).streams["http"]), stream_document(Catalog(**OLD).streams["http"]))}
    now, calls, release = [0.0], [], threading.Event()

    def load():
        calls.append(now[0])
        if len(calls) == 1:
            return stored
        release.wait(5)  # a read hanging on a database that is away
        raise OSError("store away")

    served, new = ServedCatalog(load, refresh_s=2.0, clock=lambda: now[0]), Catalog(**NEW)
    assert served.of(new).streams["http"].dimensions == ("endpoint", "region")
    now[0] = 2.0
    reader = threading.Thread(target=served.of, args=(new,))
    reader.start()
    while len(calls) < 2:
        pass
    assert served.of(new).streams["http"].dimensions == ("endpoint", "region")  # not held up by the hanging read
    release.set()
    reader.join(5)
    assert served.of(new).streams["http"].dimensions == ("endpoint", "region") and len(calls) == 2  # not again at once
    now[0] = 4.0
    served.of(new)
    assert len(calls) == 3
