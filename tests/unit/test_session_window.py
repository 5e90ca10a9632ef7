"""The session window's rule (aggregates/session_window.py), pure: examples of each case, and
Hypothesis properties against a brute-force sessionization over any split of the events into
batches and any watermarks."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.session_window import due_through, session_batch, session_batch_columns
from store.sessions import Session, SessionColumns, SessionCommit

GAP = 10


def sessionize(events: list[tuple[str, int]], gap: int = GAP) -> list[Session]:
    """Brute force: per key, the sorted times cut where neighbours are `gap` or more apart."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for key, t in events:
        by_key[key].append(t)
    out = []
    for key, times in sorted(by_key.items()):
        times.sort()
        start = 0
        for i in range(1, len(times) + 1):
            if i == len(times) or times[i] - times[i - 1] >= gap:
                out.append(Session(key, times[start], times[i - 1], i - start))
                start = i
    return out


class MemoryState:
    """The open sessions as the store keeps them (store/sessions.py's lookup and apply, in memory)."""

    def __init__(self):
        self.open: dict[tuple[str, int], Session] = {}

    def lookup(self, keys, due) -> list[Session]:
        return sorted(s for s in self.open.values() if s.key in keys or (due is not None and s.last_ms <= due))

    def apply(self, c: SessionCommit) -> None:
        for s in c.removed:
            del self.open[(s.key, s.first_ms)]
        for s in c.kept:
            assert (s.key, s.first_ms) not in self.open
            self.open[(s.key, s.first_ms)] = s


def run_batches(batches: list[list[tuple[str, int]]], watermarks: list[int | None]) -> tuple[list[Session], MemoryState]:
    """The rule over the batches (each cut into runs first, as the Spark step does); the
    sessions it closed, in order, and the state it leaves."""
    state, closed = MemoryState(), []
    for events, watermark in zip(batches, watermarks, strict=True):
        runs = sessionize(events)
        stored = state.lookup({r.key for r in runs}, due_through(GAP, watermark))
        outcome = session_batch("s", GAP, stored, runs, watermark)
        state.apply(outcome.commit)
        closed += outcome.closed
    return closed, state


def oracle(batches: list[list[tuple[str, int]]], watermarks: list[int | None],
           gap: int = GAP) -> tuple[list[Session], list[Session]]:
    """Brute force over events: the events of sessions not closed yet are kept; each batch
    sessionizes them with its own and closes the sessions the watermark passed (+ gap)."""
    pending: list[tuple[str, int]] = []
    closed = []
    for events, watermark in zip(batches, watermarks, strict=True):
        pending += events
        still = []
        for s in sessionize(pending, gap):
            if watermark is not None and s.last_ms + gap <= watermark:
                closed.append(s)
            else:
                still.append(s)
        pending = [(k, t) for k, t in pending if any(s.key == k and s.first_ms <= t <= s.last_ms for s in still)]
    return closed, sessionize(pending, gap)


def test_a_run_extends_an_open_session_and_it_closes_once_the_watermark_passes_last_plus_gap():
    first = session_batch("s", GAP, [], [Session("u", 100, 105, 2)], 90)
    assert first.closed == [] and first.commit == SessionCommit("s", [], [Session("u", 100, 105, 2)])
    second = session_batch("s", GAP, [Session("u", 100, 105, 2)], [Session("u", 112, 112, 1)], 121)
    assert second.closed == []  # 112 + 10 > 121
    assert second.commit == SessionCommit("s", [Session("u", 100, 105, 2)], [Session("u", 100, 112, 3)])
    third = session_batch("s", GAP, [Session("u", 100, 112, 3)], [], 122)
    assert third.closed == [Session("u", 100, 112, 3)] and third.commit == SessionCommit("s", [Session("u", 100, 112, 3)], [])


def test_a_run_that_bridges_two_open_sessions_merges_them():
    stored = [Session("u", 0, 5, 2), Session("u", 30, 40, 3)]
    outcome = session_batch("s", GAP, stored, [Session("u", 14, 21, 2)], None)
    assert outcome.closed == []
    assert outcome.commit == SessionCommit("s", stored, [Session("u", 0, 40, 7)])


def test_a_gap_of_exactly_gap_splits_and_an_untouched_open_session_is_not_rewritten():
    stored = [Session("u", 0, 5, 1), Session("v", 0, 8, 1)]
    outcome = session_batch("s", GAP, stored, [Session("u", 15, 15, 1)], 14)
    assert outcome.closed == [] and outcome.commit == SessionCommit("s", [], [Session("u", 15, 15, 1)])


def test_a_late_event_behind_the_watermark_extends_an_open_session_or_closes_as_a_session_of_its_own():
    # The watermark is 100: an event at 50 alone is a session that closes at once (its pane gets a correction).
    alone = session_batch("s", GAP, [], [Session("u", 50, 50, 1)], 100)
    assert alone.closed == [Session("u", 50, 50, 1)] and alone.commit == SessionCommit("s", [], [])
    # Near an open session, a late event extends it backwards: its first event moves.
    grown = session_batch("s", GAP, [Session("u", 95, 98, 2)], [Session("u", 88, 88, 1)], 100)
    assert grown.closed == [] and grown.commit == SessionCommit("s", [Session("u", 95, 98, 2)], [Session("u", 88, 98, 3)])


batch_events = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 200)), max_size=12)


@st.composite
def batches_and_watermarks(draw, *, never_late: bool):
    batches = draw(st.lists(batch_events, min_size=1, max_size=6))
    watermarks: list[int | None] = []
    mark: int | None = None
    for events in batches:
        if draw(st.booleans()):
            step = draw(st.integers(0, 80))
            mark = (step if mark is None else mark + step)
        watermarks.append(mark)
    if never_late:
        # Keep only the events at or after the watermark their batch arrives behind.
        behind = [None, *watermarks[:-1]]
        batches = [[(k, t) for k, t in events if w is None or t >= w] for events, w in zip(batches, behind, strict=True)]
    return batches, watermarks


@settings(max_examples=400, deadline=None)
@given(batches_and_watermarks(never_late=False))
def test_the_rule_equals_a_brute_force_sessionization_of_the_events_not_yet_closed(case):
    batches, watermarks = case
    closed, state = run_batches(batches, watermarks)
    expected_closed, expected_open = oracle(batches, watermarks)
    assert closed == expected_closed
    assert sorted(state.open.values()) == expected_open
    # Nothing is lost or counted twice: every event is in one closed or open session.
    assert sum(s.events for s in closed) + sum(s.events for s in state.open.values()) == sum(map(len, batches))


@settings(max_examples=400, deadline=None)
@given(batches_and_watermarks(never_late=True))
def test_without_late_events_the_sessions_are_those_of_all_events_however_split_into_batches(case):
    batches, watermarks = case
    closed, state = run_batches(batches, watermarks)
    everything = sessionize([e for events in batches for e in events])
    assert Counter(closed) + Counter(state.open.values()) == Counter(everything)
    # The ones closed are exactly those the last watermark passed.
    last = watermarks[-1]
    assert sorted(closed) == [s for s in everything if last is not None and s.last_ms + GAP <= last]


def columns(sessions: list[Session]) -> SessionColumns:
    return SessionColumns([s.key for s in sessions], [s.first_ms for s in sessions], [s.last_ms for s in sessions],
                          [s.events for s in sessions])


# Keys whose code point order is not their length or ASCII order (Arrow sorts UTF-8 bytes, Python code points).
any_keys = st.lists(st.tuples(st.sampled_from(["a", "ab", "z", "é", "😀", "\u00ff", "B"]), st.integers(-50, 200)),
                    max_size=14)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(any_keys, st.one_of(st.none(), st.integers(-50, 250))), min_size=1, max_size=6))
def test_the_columnar_rule_decides_exactly_as_the_per_key_rule_batch_by_batch(case):
    """session_batch_columns (what the pipeline runs) against session_batch, on the same stored
    sessions and runs: the same closed sessions, removed and kept rows, in the same order."""
    state = MemoryState()
    for events, watermark in case:
        runs = sessionize(events)
        stored = state.lookup({r.key for r in runs}, due_through(GAP, watermark))
        expected = session_batch("s", GAP, stored, runs, watermark)
        got = session_batch_columns("s", GAP, columns(stored), columns(runs), watermark)
        assert got.closed == expected.closed
        assert list(got.commit.removed) == list(expected.commit.removed)
        assert list(got.commit.kept) == list(expected.commit.kept)
        state.apply(expected.commit)


def test_the_columnar_rule_falls_back_to_the_per_key_rule_for_times_too_far_apart_to_shift():
    stored = [Session("u", -(2**61), -(2**61), 1)]
    runs = [Session("u", 2**61, 2**61, 1), Session("v", 0, 5, 2)]
    expected = session_batch("s", GAP, stored, runs, 10)
    got = session_batch_columns("s", GAP, columns(stored), columns(runs), 10)
    assert got.closed == expected.closed == [Session("u", -(2**61), -(2**61), 1)]
    assert (list(got.commit.removed), list(got.commit.kept)) == (list(expected.commit.removed), list(expected.commit.kept))


def test_the_columnar_rule_merges_runs_inside_a_long_open_session_by_its_latest_last_event():
    # Two runs inside one stored session: the second starts long after the first ends, but not
    # after the stored session's last event, so all three are one session.
    stored = [Session("u", 0, 100, 9), Session("w", 0, 5, 1)]
    runs = [Session("u", 10, 20, 2), Session("u", 40, 50, 2), Session("u", 130, 130, 1), Session("v", 3, 3, 1)]
    expected = session_batch("s", GAP, stored, runs, 60)
    got = session_batch_columns("s", GAP, columns(stored), columns(runs), 60)
    assert expected.commit.kept == [Session("u", 0, 100, 13), Session("u", 130, 130, 1)]
    assert got.closed == expected.closed == [Session("v", 3, 3, 1), Session("w", 0, 5, 1)]
    assert (list(got.commit.removed), list(got.commit.kept)) == (list(expected.commit.removed), list(expected.commit.kept))
