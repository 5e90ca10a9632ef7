"""Late events as corrections (patterns/corrections.py): the published matches, less those
retracted, plus those added, are the brute-force definition's over every event; an absence a
late event fills is retracted, a match a late event completes is added."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.loader import parse_catalog
from patterns.corrections import correct, replay, replay_run
from patterns.events import PatternEvent
from patterns.plan import compile_pattern
from tests.support.patterns import EXAMPLES_YAML
from tests.unit.test_pattern_matcher import matched, oracle, patterns

MIN = 60_000
EXAMPLES = parse_catalog(EXAMPLES_YAML)


@st.composite
def late_split(draw):
    raw = draw(st.lists(st.tuples(st.sampled_from(["x", "x", "y"]), st.integers(0, 8), st.sampled_from(["s", "t"]),
                                  st.sampled_from(["a", "b", "c"]), st.sampled_from(["1.1.1.1", "2.2.2.2"]),
                                  st.sampled_from([100, 600])), min_size=2, max_size=9))
    events = []
    for offset, (key, time, stream, kind, ip, amount) in enumerate(raw):
        fields = {"k": key, "kind": kind} | ({"ip": ip, "amount": amount} if stream == "s" else {})
        events.append(PatternEvent(stream, offset % 2, offset, time, key, fields))
    late = draw(st.sets(st.sampled_from(range(len(events))), max_size=3))
    return [e for i, e in enumerate(events) if i not in late], [events[i] for i in sorted(late)]


@settings(max_examples=300, deadline=None)
@given(catalog=patterns(), split=late_split(), watermark=st.integers(8, 30))
def test_published_less_retracted_plus_added_is_the_definition_over_every_event(catalog, split, watermark):
    plan = compile_pattern(catalog.patterns[0], catalog)
    history, late = split
    published = matched(replay(plan, history, watermark))
    assert published == oracle(plan, sorted(history, key=lambda e: e.order), watermark)
    fix = correct(plan, history, late, watermark)
    retracted, added = matched(fix.retracted), matched(fix.added)
    assert set(retracted) <= set(published) and not set(added) & set(published)
    kept = [m for m in published if m not in retracted]
    assert sorted(kept + added) == sorted(oracle(plan, sorted([*history, *late], key=lambda e: e.order), watermark))


def test_a_late_completion_retracts_an_abandoned_checkout_and_a_late_failure_adds_a_match():
    abandoned = compile_pattern(EXAMPLES.patterns[1], EXAMPLES)
    started = PatternEvent("checkouts", 0, 0, 0, "s1", {"stage": "started"})
    completed = PatternEvent("checkouts", 0, 1, 10 * MIN, "s1", {"stage": "completed"})
    fix = correct(abandoned, [started], [completed], 40 * MIN)
    assert fix.added == [] and [(m.key, m.decided_at) for m in fix.retracted] == [("s1", 30 * MIN)]
    stuffing = compile_pattern(EXAMPLES.patterns[0], EXAMPLES)
    failures = [PatternEvent("logins", 0, i, i * MIN, "alice", {"outcome": "failure", "ip": "10.0.0.9"})
                for i in range(5)]
    success = PatternEvent("logins", 0, 9, 6 * MIN, "alice", {"outcome": "success", "ip": "10.0.0.9"})
    fix = correct(stuffing, [*failures[:2], *failures[3:], success], [failures[2]], 7 * MIN)
    assert fix.retracted == [] and [[e.offset for e in m.events] for m in fix.added] == [[0, 1, 2, 3, 4, 9]]


def test_a_replay_marks_a_restart_after_a_quiet_spell_as_the_pipeline_does():
    """A replay advances no watermark between its events: the runs of a burst past `within` are
    still in its state when the next burst begins, yet can take nothing of it. The next burst's
    first event is a restart all the same (the pipeline marks it so when the watermark passed
    between), or a late event's rewrite of the history would lose it, and once the first burst is
    cut, the key's later late events could only be recorded."""
    stuffing = compile_pattern(EXAMPLES.patterns[0], EXAMPLES)  # within 10 minutes
    logins = [PatternEvent("logins", 0, i, minute * MIN, "alice", {"outcome": "failure", "ip": "10.0.0.9"})
              for i, minute in enumerate([0, 1, 2, 40, 41, 42])]
    assert replay_run(stuffing, logins, 50 * MIN).restarts == {("logins", 0, 0), ("logins", 0, 3)}
    # An absence not yet due keeps the key live up to its deadline (inclusive), not past it.
    abandoned = compile_pattern(EXAMPLES.patterns[1], EXAMPLES)
    checkouts = [PatternEvent("checkouts", 0, i, minute * MIN, "s1", {"stage": "started"})
                 for i, minute in enumerate([0, 30, 61])]
    assert replay_run(abandoned, checkouts, 120 * MIN).restarts == {("checkouts", 0, 0), ("checkouts", 0, 2)}
