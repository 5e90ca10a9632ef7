"""When a stream's open sessions move between rows and buckets (store/session_layout.py): pure."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.session_layout import POSTGRES, SQLITE, LayoutChooser, LayoutCosts
from store.sessions import bucket_count

HELD = 50_000  # the demo's http_requests at 20 000 events/s: ~50 000 users' sessions open
BUCKETS = bucket_count(HELD)


def moves(chooser: LayoutChooser, touched: list[int], *, in_buckets: bool, held: int = HELD) -> list[int]:
    """The batches (by index) after which the stream moved, following it as apply() does."""
    moved = []
    for i, n in enumerate(touched):
        if chooser.should_move("s", in_buckets=in_buckets, touched=n, held=held, buckets=bucket_count(held)):
            moved.append(i)
            in_buckets = not in_buckets
    return moved


@pytest.mark.parametrize("costs", [SQLITE, POSTGRES], ids=["sqlite", "postgres"])
def test_batches_of_a_steady_rate_straddling_the_edge_do_not_move_the_stream_back_and_forth(costs):
    """Session 90's steady state at 20 000 events/s: micro-batches of ~1 000 to ~8 000 events (900
    to 5 000 of 50 000 users' keys), a slow batch followed by a large one. The rule on one batch's
    share moved 50 000 sessions to buckets on each large batch and back on each small one
    (~200-230 ms a move). Now the stream moves at most once and stays."""
    sizes = list(itertools.islice(itertools.cycle([900, 2_500, 2_500, 5_000, 900, 2_500, 4_700, 2_500]), 2_000))
    assert moves(LayoutChooser(costs), sizes, in_buckets=True) == []
    assert len(moves(LayoutChooser(costs), sizes, in_buckets=False)) == 1


@pytest.mark.parametrize("costs", [SQLITE, POSTGRES], ids=["sqlite", "postgres"])
def test_a_rate_that_changes_for_good_moves_the_stream_once_the_savings_pay_for_the_move(costs):
    busy, quiet = 2_500, 100  # keys a batch at 20 000 events/s, at the demo's ~120
    saved_busy = costs.rows(busy) - costs.buckets(busy, HELD, BUCKETS)
    saved_quiet = costs.buckets(quiet, HELD, BUCKETS) - costs.rows(quiet)
    assert saved_busy > 0 and saved_quiet > 0
    chooser = LayoutChooser(costs)
    after_busy = moves(chooser, [busy] * 100, in_buckets=False)
    assert after_busy == [int(costs.move(HELD) // saved_busy)]  # the first batch whose savings pass the move's cost
    after_quiet = moves(chooser, [quiet] * 200, in_buckets=True)
    assert after_quiet == [int(costs.move(HELD) // saved_quiet)]


@pytest.mark.parametrize("costs", [SQLITE, POSTGRES], ids=["sqlite", "postgres"])
def test_a_batch_touching_most_of_the_sessions_moves_them_to_buckets_at_once(costs):
    """A backfill's batch: rows would cost more than the move and the buckets together."""
    assert moves(LayoutChooser(costs), [HELD], in_buckets=False) == [0]
    assert moves(LayoutChooser(costs), [HELD // 10], in_buckets=False) == []  # one busy batch is not enough


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 60_000), min_size=1, max_size=300), st.booleans(), st.integers(1_000, 500_000),
       st.sampled_from([SQLITE, POSTGRES]))
def test_a_stream_moves_only_when_what_it_saved_since_its_last_move_pays_for_it(touched, in_buckets, held,
                                                                                costs: LayoutCosts):
    """Between two moves, the other layout's savings (each batch's, summed from the last time
    they fell to nothing) passed the move's cost, and moves never come closer than that allows."""
    chooser = LayoutChooser(costs)
    saved, where = 0.0, in_buckets
    for n in touched:
        here = costs.buckets(n, held, bucket_count(held)) if where else costs.rows(n)
        there = costs.rows(n) if where else costs.buckets(n, held, bucket_count(held))
        saved = max(0.0, saved + here - there)
        moved = chooser.should_move("s", in_buckets=where, touched=n, held=held, buckets=bucket_count(held))
        assert moved == (saved > costs.move(held))
        if moved:
            saved, where = 0.0, not where
