"""The window join's rule (aggregates/window_join.py), pure: examples of each case, and
Hypothesis properties against a brute-force join over any split of the events into batches."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
from datasketches import kll_doubles_sketch
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.joins import derived_partials, join_partials
from aggregates.window_join import JoinRule, join_batch, join_clock
from store.joins import JoinCommit, JoinEvent, JoinState
from store.panes import ValueStats


class MemoryState:
    """The join's state as the store keeps it (store/joins.py's lookup and apply, in memory)."""

    def __init__(self):
        self.clock = None
        self.lefts: dict[tuple[int, int], JoinEvent] = {}
        self.rights: dict[tuple[int, int], JoinEvent] = {}
        self.pairs = self.unmatched = 0

    def lookup(self, keys, through) -> JoinState:
        lefts = sorted(e for e in self.lefts.values() if e.key in keys)
        rights = sorted(e for e in self.rights.values()
                        if e.key in keys or (through is not None and e.time_ms <= through))
        return JoinState(self.clock, lefts, rights)

    def apply(self, c: JoinCommit) -> None:
        for e in c.lefts:
            self.lefts[(e.partition, e.offset)] = e
        for e in c.rights:
            self.rights[(e.partition, e.offset)] = e
        if c.expire_through_ms is not None:
            self.lefts = {k: e for k, e in self.lefts.items() if e.time_ms > c.expire_through_ms}
            self.rights = {k: e for k, e in self.rights.items() if e.time_ms > c.expire_through_ms}
        self.clock = c.clock_ms
        self.pairs += c.pairs
        self.unmatched += c.unmatched_right


LATENESS = 5  # both streams' allowed lateness in these examples


def clocks(batches, lateness: int = LATENESS) -> list[int | None]:
    """The join's clock after each batch: the lower of the two streams' watermarks (each its
    newest event - lateness here: one partition per side, caught up), never going back."""
    out, clock, newest = [], None, {"l": None, "r": None}
    for lefts, rights in batches:
        for side, events in (("l", lefts), ("r", rights)):
            newest[side] = max([e.time_ms for e in events] + ([newest[side]] if newest[side] is not None else []),
                               default=None)
        marks = {side: None if t is None else t - lateness for side, t in newest.items()}
        clock = join_clock(clock, marks["l"], marks["r"])
        out.append(clock)
    return out


def run(rule: JoinRule, batches, lateness: int = LATENESS) -> tuple[list, MemoryState]:
    """Every batch through join_batch with the state in between, as the pipeline does."""
    state, rows = MemoryState(), []
    for (lefts, rights), clock in zip(batches, clocks(batches, lateness), strict=True):
        through = None if clock is None else clock - rule.keep_ms
        out = join_batch(rule, state.lookup({e.key for e in [*lefts, *rights]}, through), lefts, rights, clock)
        state.apply(out.commit)
        rows += out.rows
    return rows, state


@dataclass(frozen=True)
class Summary:
    searches: Counter
    pairs: Counter  # (left time, dims, latency)
    clicked: Counter
    unmatched: Counter

    @classmethod
    def of_rows(cls, rows) -> Summary:
        s = cls(Counter(), Counter(), Counter(), Counter())
        for r in rows:
            if r.values.get("searches"):
                s.searches[(r.time_ms, r.dims)] += 1
            if r.values.get("pairs"):
                s.pairs[(r.time_ms, r.dims, r.values["latency_ms"])] += 1
            if r.values.get("clicked"):
                s.clicked[(r.time_ms, r.dims)] += 1
            if r.values.get("unmatched_right"):
                s.unmatched[r.time_ms] += 1
        return s


def brute_force(rule: JoinRule, batches, lateness: int = LATENESS) -> Summary:
    """The same join by its definition: every event kept forever with its arrival batch; two
    events pair when in the same batch or when the earlier one was still in the state (its time
    after the previous batch's expiry) when the later one came."""
    throughs = [None if clock is None else clock - rule.keep_ms for clock in clocks(batches, lateness)]

    def present(e: JoinEvent, arrived: int, at: int) -> bool:  # in the state at the start of batch `at`
        before = throughs[at - 1]
        return arrived < at and (before is None or e.time_ms > before)

    lefts = [(e, b) for b, (ls, _) in enumerate(batches) for e in ls]
    rights = [(e, b) for b, (_, rs) in enumerate(batches) for e in rs]
    s = Summary(Counter(), Counter(), Counter(), Counter())
    paired_right = set()
    for left, bl in lefts:
        s.searches[(left.time_ms, left.dims)] += 1
        found = False
        for right, br in rights:
            if right.key != left.key or not left.time_ms <= right.time_ms <= left.time_ms + rule.within_ms:
                continue
            if bl == br or present(left, bl, br) or present(right, br, bl):
                s.pairs[(left.time_ms, left.dims, right.time_ms - left.time_ms)] += 1
                found = True
                paired_right.add((right.partition, right.offset))
        if found:
            s.clicked[(left.time_ms, left.dims)] += 1
    last = throughs[-1] if throughs else None
    for right, _ in rights:
        if (right.partition, right.offset) not in paired_right and last is not None and right.time_ms <= last:
            s.unmatched[right.time_ms] += 1
    return s


RULE = JoinRule("j", within_ms=30, late_horizon_ms=20)


def L(t, key, offset, dims=("a",)):
    return JoinEvent(t, 0, offset, key, dims)


def R(t, key, offset):
    return JoinEvent(t, 1, offset, key)


def test_a_click_in_the_window_pairs_at_the_search_time_with_its_latency_and_counts_clicked_once():
    rows, state = run(RULE, [([L(100, "s1", 1)], [R(110, "s1", 1), R(125, "s1", 2), R(131, "s1", 3)])])
    s = Summary.of_rows(rows)
    assert s.searches == Counter({(100, ("a",)): 1})
    assert s.pairs == Counter({(100, ("a",), 10): 1, (100, ("a",), 25): 1})  # 131 is past the window (130)
    assert s.clicked == Counter({(100, ("a",)): 1})
    assert (state.pairs, state.unmatched) == (2, 0)
    assert {e.offset: e.matched for e in state.rights.values()} == {1: True, 2: True, 3: False}


def test_a_click_before_its_search_waits_and_a_late_click_still_matches_within_the_horizon():
    # Batch 1: the click arrives first (its search is unknown yet); batch 2: the search; batch 3:
    # the clock moves far ahead (lateness passed), then a late click of the same search.
    rows, state = run(RULE, [([], [R(105, "s1", 1)]), ([L(100, "s1", 1)], []), ([], [R(150, "x", 2)]),
                             ([], [R(112, "s1", 3)])])
    s = Summary.of_rows(rows)
    assert s.pairs == Counter({(100, ("a",), 5): 1, (100, ("a",), 12): 1})
    assert s.clicked == Counter({(100, ("a",)): 1})
    assert s.unmatched == Counter()


def test_a_click_whose_search_never_comes_or_expired_is_counted_unmatched_not_lost():
    rows, state = run(RULE, [([L(100, "s1", 1)], [R(105, "nobody", 1)]),
                             ([L(300, "y", 2)], [R(300, "x", 2)]),   # clock 295: everything up to 245 expires
                             ([], [R(110, "s1", 3)])])  # its search expired: unmatched at its own time
    s = Summary.of_rows(rows)
    assert s.pairs == Counter()
    assert s.unmatched == Counter({105: 1, 110: 1})
    assert set(state.lefts) == {(0, 2)} and set(state.rights) == {(1, 2)}  # bounded: only the newest events wait
    assert state.unmatched == 2


@st.composite
def batches(draw):
    n = draw(st.integers(0, 40))
    offset = iter(range(10_000))
    events = []
    for _ in range(n):
        side = draw(st.sampled_from("lr"))
        key = draw(st.sampled_from(["k0", "k1", "k2"]))
        t = draw(st.integers(0, 200))
        o = next(offset)
        events.append(L(t, key, o, (draw(st.sampled_from("ab")),)) if side == "l" else R(t, key, o))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6)))
    out, prev = [], 0
    for cut in [*cuts, n]:
        chunk = events[prev:cut]
        out.append(([e for e in chunk if e.partition == 0], [e for e in chunk if e.partition == 1]))
        prev = cut
    return out


rules = st.builds(JoinRule, st.just("j"), st.integers(1, 40), st.integers(0, 60))


@settings(max_examples=300, deadline=None)
@given(rules, batches(), st.integers(0, 20))
def test_the_join_equals_the_brute_force_join_over_any_batches(rule, split, lateness):
    rows, state = run(rule, split, lateness)
    assert Summary.of_rows(rows) == brute_force(rule, split, lateness)
    # Nothing lost: every right event is in a pair, counted unmatched, or still in the state.
    s = Summary.of_rows(rows)
    rights = sum(len(rs) for _, rs in split)
    paired = {(e.partition, e.offset) for e in state.rights.values() if e.matched}
    waiting = sum(1 for e in state.rights.values() if not e.matched)
    assert sum(s.unmatched.values()) + waiting <= rights
    assert state.pairs == sum(s.pairs.values()) and state.unmatched == sum(s.unmatched.values())
    assert len(paired) <= rights
    # Bounded: nothing in the state is older than the clock allows.
    if state.clock is not None:
        assert all(e.time_ms > state.clock - rule.keep_ms for e in [*state.lefts.values(), *state.rights.values()])


def comparable(partials: list) -> list:
    """Partials with each compacted KLL as what its random compaction leaves alike: DataSketches
    picks the odd or even items of a compaction at random (two sketches of the same items in the
    same order differ in about half the runs), so a compacted sketch is compared by its count,
    min, max and how many items it retains; a sketch that kept every item, by its bytes."""
    def kll(stats: ValueStats) -> ValueStats:
        if stats.kll is None:
            return stats
        sketch = kll_doubles_sketch.deserialize(stats.kll)
        if not sketch.is_estimation_mode():
            return stats
        shape = (sketch.n, sketch.get_min_value(), sketch.get_max_value(), sketch.num_retained)
        return replace(stats, kll=repr(shape).encode())

    return [replace(p, data=replace(p.data, values={name: kll(v) for name, v in p.data.values.items()}))
            for p in partials]


@settings(max_examples=200, deadline=None)
@given(rules, batches(), st.integers(0, 20), st.sampled_from([1, 7, 50]), st.sampled_from([8, 200]))
def test_the_joins_columns_roll_up_as_its_rows_do(rule, split, lateness, pane_ms, kll_k):
    """The pipeline rolls a batch's derived rows up from columns (join_partials, numpy); the same
    rows one by one (derived_partials) give the same partials: counts, n/sum/min/max and the
    latency KLL's bytes (fed in the same order; k 8 makes it compact, and a compacted sketch's
    bytes are random in part: `comparable`)."""
    state, clock = MemoryState(), None
    for (lefts, rights), clock in zip(split, clocks(split, lateness), strict=True):
        through = None if clock is None else clock - rule.keep_ms
        out = join_batch(rule, state.lookup({e.key for e in [*lefts, *rights]}, through), lefts, rights, clock)
        state.apply(out.commit)
        assert comparable(join_partials(out.columns, "j", ("d",), pane_ms, kll_k)) == \
            comparable(derived_partials(out.rows, "j", ("d",), pane_ms, kll_k))


def test_a_compacted_kll_differs_from_run_to_run_so_it_is_compared_by_its_shape():
    """Why `comparable` exists: the same items in the same order, two different sketches at times."""
    def blob() -> bytes:
        sketch = kll_doubles_sketch(8)
        sketch.update(np.arange(1.0, 15.0))
        return sketch.serialize()

    assert len({blob() for _ in range(200)}) == 2


@settings(max_examples=200, deadline=None)
@given(batches())
def test_while_nothing_expires_the_result_is_the_exact_join_whatever_the_batches(split):
    rule = JoinRule("j", within_ms=25, late_horizon_ms=10**9)
    rows, _ = run(rule, split, lateness=0)
    lefts = [e for ls, _ in split for e in ls]
    rights = [e for _, rs in split for e in rs]
    exact = Counter((left.time_ms, left.dims, r.time_ms - left.time_ms) for left in lefts for r in rights
                    if r.key == left.key and left.time_ms <= r.time_ms <= left.time_ms + 25)
    s = Summary.of_rows(rows)
    assert s.pairs == exact
    assert sum(s.clicked.values()) == sum(1 for left in lefts if any(
        r.key == left.key and left.time_ms <= r.time_ms <= left.time_ms + 25 for r in rights))
    assert s.unmatched == Counter()


def test_a_batch_of_clicks_only_does_not_move_the_clock_past_the_searches():
    # The searches stop at 100 (their watermark 95); clicks run on to 10 000: nothing of the
    # searches' side may expire on the clicks' progress alone, so a search of a lagging
    # partition that comes now still finds the click that waited for it.
    rows, state = run(RULE, [([L(100, "s1", 1)], [R(101, "s2", 1)]), ([], [R(10_000, "x", 2)]),
                             ([L(98, "s2", 3)], [])])
    assert state.clock == 95
    assert Summary.of_rows(rows).pairs == Counter({(98, ("a",), 3): 1})
    assert Summary.of_rows(rows).unmatched == Counter()


def test_the_clock_is_the_lower_of_the_two_watermarks_and_never_goes_back():
    assert join_clock(None, None, 50) is None  # no search yet: nothing can expire
    assert join_clock(None, 40, 50) == 40
    assert join_clock(40, 90, 45) == 45
    assert join_clock(45, 30, 90) == 45
