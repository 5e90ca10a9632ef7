"""A view changelog's cursors and what a switch appends to it (store/view_state.py). Pure."""

from __future__ import annotations

import random

import pytest

from store.view_state import Cursor, ViewLink, parse_cursor, switch_changes


def test_cursors_are_positions_and_the_old_batch_seq_form_is_still_read():
    assert parse_cursor("") == Cursor(0)
    assert parse_cursor("17") == Cursor(17)
    assert parse_cursor("12.3") == Cursor(batch=12, seq=3)
    assert parse_cursor(str(2**63 - 1)) == Cursor(2**63 - 1)
    # Past 64 bits (the store's bind raised OverflowError: a 500) and non-ASCII digits are no cursor.
    for bad in ("u1", "1.", ".2", "-1", "1.2.3", "a.1", str(2**63), f"1.{2**63}", f"{10**20}.1", "١٢", "1.١"):
        with pytest.raises(ValueError, match="not a changes cursor"):
            parse_cursor(bad)


def link(key: str, row: dict | None, offset: int = 0) -> ViewLink:
    return ViewLink(key, None, row, 1_000 + offset, 0, offset)


def test_a_switch_appends_the_difference_from_the_served_rows_to_the_rebuilt_ones():
    served = {"u1": link("u1", {"tier": "free"}, 1), "u2": link("u2", {"tier": "gold"}, 2),
              "u3": link("u3", {"tier": "gold"}, 3), "u4": link("u4", None, 4)}
    rebuilt = {"u1": link("u1", {"tier": "free", "region": "eu"}, 5), "u2": link("u2", {"tier": "gold"}, 6),
               "u4": link("u4", {"tier": "free"}, 7), "u5": link("u5", None, 8)}
    changes = switch_changes(served, rebuilt)
    assert [(c.key, c.old, c.new, c.offset) for c in changes] == [
        ("u1", {"tier": "free"}, {"tier": "free", "region": "eu"}, 5),  # changed: the rebuilt row's position
        ("u3", {"tier": "gold"}, None, 3),  # gone with its left row: the served row's position
        ("u4", None, {"tier": "free"}, 7),  # an inner view's row that now joins
    ]  # u2 the same, u5 in neither view: no change


def test_applying_the_switch_changes_to_the_served_rows_gives_the_rebuilt_ones():
    rng = random.Random(4)
    for _ in range(200):
        def view() -> dict:
            return {f"u{i}": link(f"u{i}", rng.choice([None, {"t": rng.choice("ab")}, {"t": "a", "r": "x"}]))
                    for i in range(8) if rng.random() < 0.7}
        served, rebuilt = view(), view()
        rows = {k: dict(v.row) for k, v in served.items() if v.row is not None}
        for c in switch_changes(served, rebuilt):
            assert rows.get(c.key) == c.old and c.old != c.new
            if c.new is None:
                del rows[c.key]
            else:
                rows[c.key] = c.new
        assert rows == {k: v.row for k, v in rebuilt.items() if v.row is not None}
