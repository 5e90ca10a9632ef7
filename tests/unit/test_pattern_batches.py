"""One pattern run batch by batch (aggregates/pattern_batch.py), pure, the store simulated by a
JSON round trip of what a batch commits: events arrive in any order, split into batches, each
with the watermark its streams reached; the matches published, less those retracted, plus those
late events added, equal the brute-force definition over every event but the late ones with no
kept history of their key to replay; late events are recorded, and nothing is left once the
watermark passes everything."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregates.pattern_batch import history_span_ms, may_take, pattern_watermark, run_pattern_batch
from catalog.loader import parse_catalog
from catalog.model import Catalog
from patterns.events import PatternEvent
from patterns.matcher import PatternMatcher, run_start_times
from patterns.plan import compile_pattern
from store.patterns import BufferedEvent, HistoryEvent, KeyState, PatternLoad
from tests.support.patterns import EXAMPLES_YAML
from tests.unit.test_pattern_matcher import STREAMS, matched, oracle, patterns

MIN = 60_000
EXAMPLES = parse_catalog(EXAMPLES_YAML)


class FakeStore:
    """What store/patterns.py keeps, as JSON: the pattern's watermark, its keys with due times, its
    buffered events (by place in the log), released and deleted when the watermark passes them."""

    def __init__(self):
        self.watermark: int | None = None
        self.keys: dict[str, str] = {}
        self.buffer: dict[tuple, str] = {}
        self.matches: list = []
        self.late: list = []
        self.written: list[set] = []  # per batch: the keys it wrote
        self.history: dict[tuple, HistoryEvent] = {}  # by (key, place): pattern_history
        self.added: list = []
        self.retracted: list = []

    def load(self, keys, due_through, history_keys=()) -> PatternLoad:
        released = [BufferedEvent(*json.loads(text)) for text in self.buffer.values()
                    if due_through is not None and json.loads(text)[4] <= due_through]
        keys = set(keys) | {e.key for e in released}
        found = {}
        for key, text in self.keys.items():
            stored = KeyState(**{**json.loads(text), "buffered": tuple(json.loads(text)["buffered"])})
            if key in keys or (due_through is not None and stored.due_ms is not None and stored.due_ms <= due_through):
                found[key] = stored
        history: dict[str, list] = {}
        for (key, _), h in sorted(self.history.items(), key=lambda kv: kv[1].order):
            if key in history_keys:
                history.setdefault(key, []).append(h)
        return PatternLoad(self.watermark, found, released, history)

    def batch(self, plan, events, stream_watermark):
        now = pattern_watermark(self.watermark, {s.stream: stream_watermark for s in plan.steps}, [s.stream for s in plan.steps])
        before = self.watermark
        ready = {e.key for e in events if now is not None and e.time <= now and (before is None or e.time > before)}
        late_keys = {e.key for e in events if before is not None and e.time <= before}
        out = run_pattern_batch(plan, self.load(ready | late_keys, now, late_keys), events, now)
        c = out.commit
        self.history = {k: h for k, h in self.history.items() if k[0] not in c.history_rewritten}
        for h in c.history:
            self.history[h.key, (h.stream, h.partition, h.offset)] = h
        if c.history_cut_ms is not None:
            self.history = {k: h for k, h in self.history.items() if h.time_ms >= c.history_cut_ms}
        self.watermark = c.watermark_ms
        for key, state in c.keys.items():
            if state.buffered or (state.state and (state.state["runs"] or state.state["waiting"])):
                self.keys[key] = json.dumps(state.__dict__)
            else:
                self.keys.pop(key, None)
        if c.watermark_ms is not None:
            self.buffer = {k: text for k, text in self.buffer.items() if json.loads(text)[4] > c.watermark_ms}
        for e in c.buffer:
            assert c.watermark_ms is None or e.time_ms > c.watermark_ms
            self.buffer.setdefault((e.stream, e.partition, e.offset), json.dumps(list(e)))
        self.written.append(set(c.keys))
        self.matches += out.matches
        self.added += out.added
        self.retracted += out.retracted
        self.late += c.late
        return out


def test_events_wait_for_the_watermark_and_are_fed_in_event_time_order():
    pattern = EXAMPLES.patterns[0]  # credential_stuffing: five failures then a success from the same address
    plan = compile_pattern(pattern, EXAMPLES)
    store = FakeStore()
    events = [PatternEvent("logins", 0, i, i * MIN, "alice", {"outcome": "failure", "ip": "10.0.0.9"}) for i in range(5)]
    success = PatternEvent("logins", 1, 9, 6 * MIN, "alice", {"outcome": "success", "ip": "10.0.0.9"})
    # The success arrives first, the failures after it, in reverse: in arrival order nothing would match.
    out = store.batch(plan, [success, *reversed(events[2:])], None)
    assert out.matches == [] and out.released == 0 and store.watermark is None
    assert store.keys == {} and len(store.buffer) == 4  # buffered as rows: no key state read or written
    out = store.batch(plan, events[:2], 3 * MIN)  # failures 0..3 released (time <= 3 min), in order
    assert out.released == 4 and out.matches == [] and store.watermark == 3 * MIN
    late = PatternEvent("logins", 2, 10, 3 * MIN, "alice", {"outcome": "failure", "ip": "10.0.0.9"})
    # At the watermark: late, recorded, not fed in order; replayed with alice's kept history (from
    # her first event), so her state is the in-order run's: the match takes it, as the definition does.
    out = store.batch(plan, [late], 6 * MIN)
    [match] = out.matches
    assert [e.offset for e in match.events] == [0, 1, 2, 3, 10, 9] and match.decided_at == 6 * MIN
    assert out.added == out.retracted == []  # nothing was decided before it came
    assert [(e.offset, e.time_ms, e.watermark_ms) for e in out.commit.late] == [(10, 3 * MIN, 3 * MIN)]
    assert store.keys == {} and store.buffer == {}  # nothing pending: the key is gone


def test_the_watermark_is_the_lowest_of_the_patterns_streams_and_never_goes_back():
    assert pattern_watermark(None, {"a": 10, "b": 5}, ["a", "b"]) == 5
    assert pattern_watermark(None, {"a": 10}, ["a", "b"]) == 10  # b has none yet: it holds nothing back
    assert pattern_watermark(7, {"a": 10, "b": 5}, ["a", "b"]) == 7
    assert pattern_watermark(7, {}, ["a"]) == 7 and pattern_watermark(None, {}, ["a"]) is None


def test_an_absence_is_decided_when_the_watermark_passes_its_deadline_and_only_due_keys_are_read():
    pattern = EXAMPLES.patterns[1]  # abandoned_checkout: started, not completed within 30 minutes
    plan = compile_pattern(pattern, EXAMPLES)
    store = FakeStore()
    store.batch(plan, [PatternEvent("checkouts", 0, 0, 0, "s1", {"stage": "started"}),
                       PatternEvent("checkouts", 0, 1, 1 * MIN, "s2", {"stage": "started"})], 2 * MIN)
    assert sorted(store.keys) == ["s1", "s2"]
    assert store.load(set(), 30 * MIN).keys.keys() == {"s1"}  # s2 is due at 31 min: not read before
    out = store.batch(plan, [PatternEvent("checkouts", 0, 2, 20 * MIN, "s2", {"stage": "completed"})], 30 * MIN)
    assert [(m.key, m.decided_at) for m in out.matches] == [("s1", 30 * MIN)]
    assert store.batch(plan, [], 120 * MIN).matches == [] and store.keys == {}


def test_buffering_reads_and_writes_no_key_and_a_batch_writes_only_the_keys_it_changed():
    plan = compile_pattern(EXAMPLES.patterns[0], EXAMPLES)  # credential_stuffing, within 10 minutes
    store = FakeStore()

    def failure(offset, minute, key):
        return PatternEvent("logins", 0, offset, minute * MIN, key, {"outcome": "failure", "ip": "10.0.0.9"})

    store.batch(plan, [failure(0, 1, "alice"), failure(1, 1, "bob")], 2 * MIN)
    assert store.written[-1] == {"alice", "bob"} and len(store.keys) == 2  # each started a partial match
    store.batch(plan, [failure(2, 5, "alice")], 3 * MIN)  # ahead of the watermark: buffered
    assert store.written[-1] == set() and len(store.buffer) == 1
    out = store.batch(plan, [], 6 * MIN)  # alice's event released; bob has nothing to do
    assert out.released == 1 and store.written[-1] == {"alice"} and store.buffer == {}
    store.batch(plan, [], 11 * MIN)  # both due: the runs started at 1 min fall out of `within`
    assert store.written[-1] == {"alice", "bob"} and list(store.keys) == ["alice"]  # her run from 5 min
    store.batch(plan, [], 16 * MIN)
    assert store.written[-1] == {"alice"} and store.keys == {}


def test_events_a_key_buffered_in_the_older_layout_are_released_or_moved_to_the_buffer():
    plan = compile_pattern(EXAMPLES.patterns[0], EXAMPLES)
    store = FakeStore()
    store.watermark = 0
    legacy = [["logins", 0, i, (i + 1) * MIN, {"outcome": "failure", "ip": "10.0.0.9"}] for i in range(5)]
    store.keys["alice"] = json.dumps({"state": None, "buffered": legacy, "due_ms": MIN, "partial_matches": 0})
    success = PatternEvent("logins", 1, 9, 7 * MIN, "alice", {"outcome": "success", "ip": "10.0.0.9"})
    out = store.batch(plan, [success], 3 * MIN)  # three released, two moved to the buffer with the success
    assert out.released == 3 and len(store.buffer) == 3 and json.loads(store.keys["alice"])["buffered"] == []
    [match] = store.batch(plan, [], 8 * MIN).matches
    assert [e.offset for e in match.events] == [0, 1, 2, 3, 4, 9]


@st.composite
def arrivals(draw):
    """Events of two keys in a random order of arrival, cut into batches, each batch with the
    watermark its streams reached (never back), then a last batch whose watermark passes all."""
    raw = draw(st.lists(st.tuples(st.sampled_from(["x", "x", "x", "y"]), st.integers(0, 8), st.sampled_from(["s", "t"]),
                                  st.sampled_from(["a", "b", "c"]), st.sampled_from(["1.1.1.1", "2.2.2.2"]),
                                  st.sampled_from([100, 600])), min_size=3, max_size=9))
    events = []
    for offset, (key, time, stream, kind, ip, amount) in enumerate(raw):
        fields = {"k": key, "kind": kind} | ({"ip": ip, "amount": amount} if stream == "s" else {})
        events.append(PatternEvent(stream, offset % 2, offset, time, key, fields))
    events = draw(st.permutations(events))
    batches, i, mark = [], 0, None
    while i < len(events):
        n = draw(st.integers(1, 3))
        if draw(st.booleans()):
            mark = draw(st.integers(-1 if mark is None else mark, 10))
        batches.append((events[i:i + n], mark))
        i += n
    batches.append(([], 10_000))
    return batches


def net(store: FakeStore) -> list:
    """The matches published, less those retracted (each withdraws one), plus those added."""
    published = matched([*store.matches, *store.added])
    for m in matched(store.retracted):
        published.remove(m)
    return published


@st.composite
def late_arrivals(draw):
    """As arrivals, but each batch's watermark follows the newest event seen (less 0 to 2), so
    the events that arrive out of order are often late for the pattern."""
    batches = draw(arrivals())
    out, newest, mark = [], None, None
    for events, _ in batches[:-1]:
        for e in events:
            newest = e.time if newest is None else max(newest, e.time)
        if newest is not None:
            candidate = newest - draw(st.integers(0, 2))
            mark = candidate if mark is None else max(mark, candidate)
        out.append((events, mark))
    return out + [batches[-1]]


@settings(max_examples=400, deadline=None)
@given(catalog=patterns(), batches=st.one_of(arrivals(), late_arrivals()))
def test_late_events_after_their_keys_kept_history_start_are_corrected_to_the_definition_over_every_event(
        catalog, batches):
    """Published matches, less those retracted, plus those added, are the definition's over every
    event but the late ones that came before anything of their key was fed (no history to replay:
    only recorded); every other late event is corrected."""
    plan = compile_pattern(catalog.patterns[0], catalog)
    store = FakeStore()
    counted: list[PatternEvent] = []  # the events fed, and the late events corrected
    only_recorded = []
    late_seen = 0
    for events, mark in batches:
        before = store.watermark
        for e in events:
            if before is not None and e.time <= before:
                late_seen += 1
                # Correctable: an event of its key fed (or corrected) before it: the key's history starts there.
                if any(c.key == e.key and c.order < e.order for c in counted):
                    counted.append(e)
                else:
                    only_recorded.append(e)
            else:
                counted.append(e)
        store.batch(plan, events, mark)
    assert sorted(net(store)) == sorted(oracle(plan, sorted(counted, key=lambda e: e.order), 10_000))
    assert store.keys == {} and store.buffer == {}
    assert len(store.late) == late_seen  # every late event recorded, corrected or not


def live_before(plan, fed: list[PatternEvent], restart: PatternEvent) -> bool:
    """Whether the in-order run over `fed` (one key's) holds, just before `restart`, anything that
    could still matter at its time: a run within `within` of it, an absence it does not pass, once
    the absences due before it are decided (under skip_past_last their matches discard the runs
    they overlap, whether an advance between the batches or `restart` itself decides them)."""
    matcher = PatternMatcher(plan)
    for e in sorted(fed, key=lambda e: e.order):
        if e.order < restart.order:
            matcher.feed(e)
    matcher.advance(restart.time - 1)
    state = matcher.state()["keys"].get(restart.key)
    if state is None:
        return False
    if any(w["deadline"] >= restart.time for w in state["waiting"]):
        return True
    return any(plan.within is None or start >= restart.time - plan.within for start in run_start_times(state))


@st.composite
def spread_arrivals(draw):
    """Bursts of events, mostly of one key, separated by quiet spells now and then (a gap of 8 or
    15 ms), a few arriving later than their place, each batch's watermark the newest event seen
    less 0 to 2 ms: with the kept horizon made 3 ms, late events come both within and past the
    history kept, and quiet spells leave keys with nothing live, with or without a watermark
    advance between."""
    raw = draw(st.lists(st.tuples(st.sampled_from(["x", "x", "x", "y"]), st.sampled_from([0, 0, 1, 3, 8, 15]),
                                  st.sampled_from(["s", "t"]), st.sampled_from(["a", "a", "b", "c"]),
                                  st.sampled_from(["1.1.1.1", "2.2.2.2"]), st.sampled_from([100, 600])),
                        min_size=3, max_size=14))
    events, time = [], 0
    for offset, (key, gap, stream, kind, ip, amount) in enumerate(raw):
        time += gap
        events.append(PatternEvent(stream, offset % 2, offset, time, key,
                                   {"k": key, "kind": kind} | ({"ip": ip, "amount": amount} if stream == "s" else {})))
    for _ in range(draw(st.integers(1, 4))):  # arrives later than its place
        i = draw(st.integers(0, len(events) - 1))
        events.insert(draw(st.integers(i, len(events) - 1)), events.pop(i))
    batches, i, newest, mark = [], 0, None, None
    while i < len(events):
        n = draw(st.integers(1, 4))
        for e in events[i:i + n]:
            newest = e.time if newest is None else max(newest, e.time)
        candidate = newest - draw(st.integers(0, 2))
        mark = candidate if mark is None else max(mark, candidate)
        batches.append((events[i:i + n], mark))
        i += n
    return batches + [([], 10_000)]


def seeded_case() -> dict:
    """The failing case of a seeded run (shrunk): a match decided by its absence at 1 ms, then
    at 8 ms a burst whose first event is a restart (its absence decided at an advance between,
    or by that event) and a late event of the burst that is corrected."""
    catalog = Catalog.model_validate({"streams": STREAMS, "patterns": [{
        "name": "p", "key": "k", "within": "8ms", "after_match": "skip_past_last",
        "steps": [{"name": "step0", "stream": "s", "contiguity": "next"},
                  {"name": "step1", "stream": "s", "contiguity": "next"},
                  {"name": "step2", "stream": "t", "times": [1, 3], "contiguity": "next"}],
        "not_followed_by": {"name": "absent", "stream": "s", "within": "1ms"}}]})

    def event(offset, time, stream):
        fields = {"k": "x", "kind": "a"} | ({"ip": "1.1.1.1", "amount": 100} if stream == "s" else {})
        return PatternEvent(stream, offset % 2, offset, time, "x", fields)

    cuts = [([(1, 0, "s")], 0), ([(2, 0, "s"), (3, 0, "s")], 0), ([(4, 0, "s"), (5, 0, "t"), (6, 8, "s")], 7),
            ([(8, 8, "s"), (9, 8, "t"), (10, 16, "s")], 16), ([(7, 8, "s"), (0, 0, "s")], 16), ([(11, 16, "s")], 16),
            ([], 10_000)]
    return {"catalog": catalog, "batches": [([event(*e) for e in events], mark) for events, mark in cuts]}


@settings(max_examples=1000, deadline=None)
@given(catalog=patterns(), batches=spread_arrivals())
@example(**seeded_case())
def test_a_late_event_after_a_kept_restart_is_corrected_whatever_the_batch_cuts(catalog, batches):
    """docs/patterns.md, "Late events": a late event is corrected exactly when an event of its key
    fed (or corrected) before it is kept (not behind the watermark less the span and the horizon)
    and is a restart: the in-order run over its key's events held nothing that could still matter
    at its time. That depends on the events only, not on where the batches cut them nor on
    replays: a quiet spell and the next burst released in one batch mark the burst's first event
    as two batches do, and a replay marks it again."""
    plan = compile_pattern(catalog.patterns[0], catalog)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("aggregates.pattern_batch.LATE_HORIZON_MS", 3)
        span = history_span_ms(plan)
        store = FakeStore()
        counted: list[PatternEvent] = []  # the events fed, and the late events corrected
        fed: list[PatternEvent] = []  # of those, the ones the matcher took in (kept in the history)
        for events, mark in batches:
            before = store.watermark
            for e in events:
                if before is not None and e.time <= before:
                    mine = [c for c in fed if c.key == e.key]
                    if any(r.order < e.order and r.time >= before - span and not live_before(plan, mine, r)
                           for r in mine):
                        counted.append(e)
                        if may_take(plan, e):  # one no step might take is recorded only
                            fed.append(e)
                else:
                    counted.append(e)
                    fed.append(e)
            store.batch(plan, events, mark)
    assert sorted(net(store)) == sorted(oracle(plan, sorted(counted, key=lambda e: e.order), 10_000))


def test_a_quiet_spell_and_the_next_burst_in_one_batch_mark_the_burst_a_restart_as_two_batches_do():
    """credential_stuffing: three failures, a quiet half hour, five failures and a success. The
    second burst's first event is a restart whether the watermark advanced between the bursts or
    not, so once the first burst is cut from the history, a late failure of the second burst is
    still replayed and completes its match."""
    plan = compile_pattern(EXAMPLES.patterns[0], EXAMPLES)

    def login(offset, minute, outcome):
        return PatternEvent("logins", 0, offset, minute * MIN, "alice", {"outcome": outcome, "ip": "9.9.9.9"})

    first = [login(0, 0, "failure"), login(1, 1, "failure"), login(2, 2, "failure")]
    second = [login(3, 40, "failure"), login(4, 41, "failure"), login(5, 42, "failure"), login(6, 43, "failure"),
              login(7, 45, "success")]
    for cuts in ([(first, 5), ([], 30), (second, 50)], [(first + second, 50)]):
        store = FakeStore()
        for events, minute in cuts:
            store.batch(plan, events, minute * MIN)
        assert [(h.time_ms // MIN, h.restart) for h in sorted(store.history.values(), key=lambda h: h.order)] == [
            (0, True), (1, False), (2, False), (40, True), (41, False), (42, False), (43, False), (45, False)]
        store.batch(plan, [], 75 * MIN)  # the first burst is cut from the history
        assert min(h.time_ms for h in store.history.values()) == 40 * MIN
        out = store.batch(plan, [login(8, 44, "failure")], 76 * MIN)  # five failures 40..44, then the success
        assert [[e.offset for e in m.events] for m in out.added] == [[3, 4, 5, 6, 8, 7]]


def test_a_run_an_absence_decided_before_an_event_discards_leaves_it_a_restart_whatever_the_cuts():
    """Under skip_past_last the match an absence decides discards the runs it overlaps (here the
    one that could take more `t`s): decided by an advance between two batches or by the next
    event itself (one batch, or a replay), that event is a restart either way. Read before the
    due absence was decided, the run left behind made it a restart only with the advance between
    (the seeded run of the property test below: a late event was corrected or only recorded by
    where the batches cut)."""
    catalog = Catalog.model_validate({"streams": STREAMS, "patterns": [{
        "name": "p", "key": "k", "within": "12ms", "after_match": "skip_past_last",
        "steps": [{"name": "step0", "stream": "s", "contiguity": "next"},
                  {"name": "step1", "stream": "s", "contiguity": "next"},
                  {"name": "step2", "stream": "t", "one_or_more": True, "contiguity": "next"}],
        "not_followed_by": {"name": "absent", "stream": "s", "within": "1ms"}}]})
    plan = compile_pattern(catalog.patterns[0], catalog)

    def event(offset, time, stream):
        return PatternEvent(stream, offset % 2, offset, time, "x", {"k": "x", "kind": "a"})

    first = [event(1, 0, "s"), event(3, 0, "s"), event(5, 0, "t")]  # a match, decided at 1 by its absence
    second = [event(6, 8, "s"), event(8, 8, "s"), event(9, 8, "t")]
    for cuts in ([(first, 0), ([], 7), (second, 16)], [(first + second, 16)]):
        store = FakeStore()
        for events, mark in cuts:
            store.batch(plan, events, mark)
        assert [(h.offset, h.restart) for h in sorted(store.history.values(), key=lambda h: h.order)] == [
            (1, True), (3, False), (5, False), (6, True), (8, False), (9, False)]


def test_a_late_event_no_step_might_take_is_recorded_only_neither_kept_nor_replayed():
    """docs/patterns.md, "Late events": events no step might take are not fed and not kept; a late
    one is recorded only. Kept, it would rewrite its key's history (and its restart marks) for
    nothing. Under a `next` step every event matters: it is replayed as any."""
    plan = compile_pattern(EXAMPLES.patterns[0], EXAMPLES)  # credential_stuffing: failures, success

    def login(offset, minute, outcome):
        return PatternEvent("logins", 0, offset, minute * MIN, "alice", {"outcome": outcome, "ip": "9.9.9.9"})

    store = FakeStore()
    store.batch(plan, [login(0, 0, "failure"), login(1, 1, "failure"), login(2, 3, "failure")], 5 * MIN)
    kept = dict(store.history)
    out = store.batch(plan, [login(3, 2, "lockout")], 6 * MIN)  # late; no step takes a lockout
    assert [(e.offset, e.watermark_ms) for e in out.commit.late] == [(3, 5 * MIN)]  # recorded
    assert out.commit.history_rewritten == [] and out.commit.history == [] and store.history == kept
    assert out.added == out.retracted == []
    strict = parse_catalog(EXAMPLES_YAML.replace(
        "{name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}}",
        "{name: success, stream: logins, where: {outcome: success, ip: {same_as: failures.ip}}, contiguity: next}", 1))
    plan = compile_pattern(strict.patterns[0], strict)
    store = FakeStore()
    store.batch(plan, [login(0, 0, "failure"), login(1, 1, "failure"), login(2, 3, "failure")], 5 * MIN)
    out = store.batch(plan, [login(3, 2, "lockout")], 6 * MIN)  # it breaks the runs it does not extend
    assert out.commit.history_rewritten == ["alice"]
    assert (3, False) in [(h.offset, h.restart) for h in store.history.values()]


def test_a_late_completion_retracts_an_abandoned_checkout_and_restores_the_in_order_state():
    plan = compile_pattern(EXAMPLES.patterns[1], EXAMPLES)  # abandoned_checkout: started, not completed in 30 min
    store = FakeStore()
    started = PatternEvent("checkouts", 0, 0, 0, "s1", {"stage": "started"})
    store.batch(plan, [started], 1 * MIN)
    [abandoned] = store.batch(plan, [], 40 * MIN).matches
    assert abandoned.decided_at == 30 * MIN and store.keys == {}  # decided: the key holds nothing
    assert [(h.offset, h.restart) for h in store.history.values()] == [(0, True)]  # kept for a replay
    completed = PatternEvent("checkouts", 0, 1, 10 * MIN, "s1", {"stage": "completed"})
    out = store.batch(plan, [completed], 41 * MIN)
    assert [(e.offset, e.watermark_ms) for e in out.commit.late] == [(1, 40 * MIN)]  # still recorded as late
    assert out.retracted == [abandoned] and out.added == [] and out.matches == []
    assert [(m.retraction, m.late) for m in out.commit.matches] == [(True, True)]
    assert [(h.offset, h.restart) for h in sorted(store.history.values(), key=lambda h: h.order)] == [(0, True), (1, False)]
    # A late event older than anything kept of its key (nothing fed before it) is only recorded.
    early = PatternEvent("checkouts", 0, 2, 5 * MIN, "s2", {"stage": "started"})
    out = store.batch(plan, [early], 42 * MIN)
    assert out.added == out.retracted == [] and len(out.commit.late) == 1
    # Past the kept horizon the history is cut: a later late event of s1 has nothing to replay.
    store.batch(plan, [], 40 * MIN + history_span_ms(plan) + 1)
    assert store.history == {}


def test_the_partial_matches_a_full_key_drops_are_counted_in_the_batch_commit(monkeypatch):
    monkeypatch.setattr("patterns.matcher.MAX_RUNS_PER_KEY", 10)
    catalog = parse_catalog(EXAMPLES_YAML.replace("times: 5}", "one_or_more: true}", 1))
    plan = compile_pattern(catalog.patterns[0], catalog)
    events = [PatternEvent("logins", 0, i, i * 100, "alice", {"outcome": "failure", "ip": "10.0.0.9"})
              for i in range(30)]
    out = run_pattern_batch(plan, PatternLoad(None, {}, [], {}), events, 30 * 100)
    assert out.commit.dropped_runs > 0
    assert out.commit.keys["alice"].partial_matches <= 10

