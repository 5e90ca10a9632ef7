"""Shared test helpers: the repo's demo catalog and where artifacts go."""

from __future__ import annotations

from pathlib import Path

import pytest

from catalog import Catalog, load_catalog

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO_ROOT / "config" / "streams.yaml"


@pytest.fixture(scope="session")
def demo_catalog() -> Catalog:
    return load_catalog(DEMO_CONFIG)


@pytest.fixture
def service_factory(tmp_path):
    """service_factory(**settings) -> a real-process tests.procs.Service (nothing started yet);
    all are closed at the end. For tests/e2e and tests/browser."""
    from tests.procs import Service

    made: list[Service] = []

    def make(**settings) -> Service:
        root = tmp_path / f"service{len(made)}"
        root.mkdir()
        made.append(Service(root, settings))
        return made[-1]

    yield make
    for service in made:
        service.close()

