"""The suite's collection refuses items that share a node id (tests/conftest.py `every_id_once`):
under xdist only one of them would run, with a green exit."""

from types import SimpleNamespace

import pytest

from tests.conftest import every_id_once


def test_items_with_one_node_id_fail_the_collection():
    every_id_once([SimpleNamespace(nodeid="t.py::a[x]"), SimpleNamespace(nodeid="t.py::a[y]")])
    with pytest.raises(pytest.UsageError, match=r"share a node id.*t\.py::a\[x\]"):
        every_id_once([SimpleNamespace(nodeid="t.py::a[x]"), SimpleNamespace(nodeid="t.py::b"),
                       SimpleNamespace(nodeid="t.py::a[x]")])
