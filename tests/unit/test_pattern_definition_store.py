"""Patterns defined through the API, stored on every backend (store/pattern_definitions.py):
create, replace, delete, the counter readers poll, and what a restart finds."""

from __future__ import annotations

import pytest

from store.pattern_definitions import PatternConflict, PatternDefinitionStore

PATTERN = {"name": "bursts", "key": "user_id", "steps": [{"name": "fail", "stream": "logins"}]}


def test_definitions_their_versions_and_the_counter_survive_a_restart(store_backend):
    panes = store_backend.create()
    defs = PatternDefinitionStore(panes.side_db())
    assert defs.version() == 0 and defs.patterns() == (0, [])
    created = defs.create("bursts", PATTERN, now_ms=1_000)
    assert (created.definition, created.version, created.created_ms, created.updated_ms) == (PATTERN, 1, 1_000, 1_000)
    with pytest.raises(PatternConflict, match="already exists"):
        defs.create("bursts", PATTERN, now_ms=1_001)
    assert defs.version() == 1  # a refused create changes nothing
    changed = {**PATTERN, "description": "changed"}
    replaced = defs.replace("bursts", changed, now_ms=900)  # a clock gone back: updated_ms never goes back
    assert (replaced.definition, replaced.version, replaced.created_ms, replaced.updated_ms) == (changed, 2, 1_000, 1_000)
    assert defs.replace("nope", PATTERN, now_ms=2_000) is None and defs.version() == 2
    defs.create("other", {**PATTERN, "name": "other"}, now_ms=2_000)
    defs.close()

    again = PatternDefinitionStore(store_backend.reopen(panes).side_db())
    version, stored = again.patterns()
    assert version == 3 and [(p.name, p.version) for p in stored] == [("bursts", 2), ("other", 3)]
    assert again.delete("bursts") and not again.delete("bursts") and again.version() == 4
    assert again.pattern("bursts") is None
    # Created again under the same name: a version it never had, so a reader cannot take it for the old one.
    assert again.create("bursts", PATTERN, now_ms=3_000).version == 5
    again.close()
