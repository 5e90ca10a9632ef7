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
