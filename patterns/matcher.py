"""The matcher: per key, a set of runs (partial matches) of an NFA over the pattern's steps.

A run holds the events it took (each labelled with its step, with only the fields later steps
and measures read), how many the current step took, and which candidate steps an event it let
pass has ruled out: under `followed_by` a step may skip events, but not one that step itself
would have taken (the first matching event is the one taken); under `next` it may skip none.
Every event is offered to every run of its key; an event that a run may take spawns a new run
(take) and leaves the old one (skip), so all alternatives are followed, as the brute-force
definition in tests/unit/test_pattern_matcher.py enumerates them.

Time comes only from the events and the watermark: events of one key arrive in event-time order
(ties by stream, partition, offset); `advance(w)` says every event with time <= w was fed. Runs
that cannot fit `within` any more are dropped, and absence runs are decided, by either clock.
The state is plain JSON (`state()` / `from_state()`), bounded by `within` and the absence window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from patterns.events import Match, MatchedEvent, PatternEvent
from patterns.plan import Plan

Order = tuple[int, str, int, int]


class Taken(NamedTuple):
    # NamedTuples rather than frozen dataclasses: a batch builds one per event a run keeps, from
    # the stored JSON, and a tuple is several times cheaper to make.
    step: int
    stream: str
    partition: int
    offset: int
    time: int
    fields: tuple[tuple[str, Any], ...]

    @property
    def order(self) -> Order:
        return (self.time, self.stream, self.partition, self.offset)

    def to_json(self) -> list:
        return [self.step, self.stream, self.partition, self.offset, self.time, dict(self.fields)]

    @classmethod
    def from_json(cls, data: list) -> Taken:
        step, stream, partition, offset, time, fields = data
        # As to_json wrote them (the plan's kept fields, in order): nothing reads their order.
        return cls(step, stream, partition, offset, time, tuple(fields.items()))


class Run(NamedTuple):
    taken: tuple[Taken, ...]
    count: int  # events the current (last taken) step has taken
    blocked: frozenset[int] = frozenset()  # candidate steps ruled out since the last take
    deadline: int | None = None  # set on a run whose positive part is complete, awaiting absence

    @property
    def step(self) -> int:
        return self.taken[-1].step

    @property
    def start(self) -> Taken:
        return self.taken[0]

    def preference(self) -> tuple:
        """Which of several matches decided at one moment comes first: the earliest start, then
        the most events (greedy), then the earliest events."""
        return (self.start.order, -len(self.taken), tuple((t.order, t.step) for t in self.taken))

    def to_json(self) -> dict:
        return {"taken": [t.to_json() for t in self.taken], "count": self.count, "blocked": sorted(self.blocked),
                "deadline": self.deadline}

    @classmethod
    def from_json(cls, data: dict) -> Run:
        return cls(tuple([Taken.from_json(t) for t in data["taken"]]), data["count"], frozenset(data["blocked"]),
                   data["deadline"])


@dataclass
class KeyState:
    last: Order | None = None
    runs: list[Run] = field(default_factory=list)
    waiting: list[Run] = field(default_factory=list)  # complete positive parts awaiting the absence deadline

    def empty(self) -> bool:
        return not self.runs and not self.waiting


@dataclass(frozen=True)
class Outcome:
    """What feeding one event gave: the matches decided, and whether the event came too late
    (behind the watermark: the matcher already decided the moments it belongs to)."""

    matches: list[Match]
    late: bool = False


class PatternMatcher:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.watermark: int | None = None
        self.late_events = 0
        self._keys: dict[str, KeyState] = {}

    # -- reading -------------------------------------------------------------------------------

    @property
    def keys_held(self) -> int:
        return len(self._keys)

    @property
    def partial_matches(self) -> int:
        return sum(len(s.runs) + len(s.waiting) for s in self._keys.values())

    def holds(self, key: str) -> bool:
        """Whether the key has anything pending: fed to a key that holds nothing, an event starts a
        run that depends on no earlier event (a replay may start there)."""
        return key in self._keys

    # -- input ---------------------------------------------------------------------------------

    def feed(self, event: PatternEvent) -> Outcome:
        if self.watermark is not None and event.time <= self.watermark:
            self.late_events += 1
            return Outcome([], late=True)
        state = self._keys.get(event.key)
        if state is None:
            state = KeyState()
        elif state.last is not None and event.order <= state.last:
            raise ValueError(f"pattern {self.plan.name!r}, key {event.key!r}: event {event.order} fed after"
                             f" {state.last}; events of one key must come in event-time order")
        state.last = event.order
        matches = self._decide_absences(event.key, state, lambda deadline: deadline < event.time)
        matches += self._offer(event, state)
        self._store(event.key, state)
        return Outcome(matches)

    def advance(self, watermark: int) -> list[Match]:
        """Every event with time <= watermark has been fed: decide absences due by then and drop
        runs that can take no more events."""
        if self.watermark is not None and watermark <= self.watermark:
            return []
        self.watermark = watermark
        matches: list[Match] = []
        for key in sorted(self._keys):
            state = self._keys[key]
            matches += self._decide_absences(key, state, lambda deadline: deadline <= watermark)
            if self.plan.within is not None:
                state.runs = [r for r in state.runs if r.start.time + self.plan.within > watermark]
            self._store(key, state)
        return matches

    # -- the NFA -------------------------------------------------------------------------------

    def _offer(self, event: PatternEvent, state: KeyState) -> list[Match]:
        plan = self.plan
        within = plan.within
        if within is not None:
            state.runs = [r for r in state.runs if event.time - r.start.time <= within]
        kept: list[Run] = []
        grown: list[Run] = []
        for run in state.runs:
            bindings = self._bindings(run)
            open_steps = [s for s in plan.candidates(run.step, run.count) if s not in run.blocked]
            ruled_out = set()
            for s in open_steps:
                step = plan.steps[s]
                takes = step.passes(event.stream, event.fields, bindings)
                if takes:
                    grown.append(Run(run.taken + (self._taken(event, s),), run.count + 1 if s == run.step else 1))
                if takes or step.strict:
                    ruled_out.add(s)
            if len(ruled_out) < len(open_steps):
                kept.append(run._replace(blocked=run.blocked | ruled_out))
        for s in plan.first_steps():
            if plan.steps[s].passes(event.stream, event.fields, {}):
                grown.append(Run((self._taken(event, s),), 1))
        if plan.absence is not None:
            state.waiting = [w for w in state.waiting
                             if not plan.absence.passes(event.stream, event.fields, self._bindings(w))]
        complete: list[Run] = []
        for run in grown:
            if plan.complete(run.step, run.count):
                if plan.absence is not None:
                    state.waiting.append(run._replace(deadline=run.taken[-1].time + plan.absence_within))
                else:
                    complete.append(run)
            if plan.candidates(run.step, run.count):
                kept.append(run)
        state.runs = kept
        if not complete:
            return []
        if plan.no_skip:
            return [self._match(event.key, r, event.time) for r in sorted(complete, key=Run.preference)]
        first = min(complete, key=Run.preference)
        self._skip_past(state, first)
        return [self._match(event.key, first, event.time)]

    def _decide_absences(self, key: str, state: KeyState, due) -> list[Match]:
        matches: list[Match] = []
        while True:
            ready = sorted((w for w in state.waiting if due(w.deadline)), key=lambda w: (w.deadline, w.preference()))
            if not ready:
                return matches
            if self.plan.no_skip:
                done = {id(w) for w in ready}
                state.waiting = [w for w in state.waiting if id(w) not in done]
                return matches + [self._match(key, w, w.deadline) for w in ready]
            first = ready[0]
            state.waiting = [w for w in state.waiting if w is not first]
            self._skip_past(state, first)
            matches.append(self._match(key, first, first.deadline))

    def _skip_past(self, state: KeyState, match: Run) -> None:
        """skip_past_last: the next match starts after this one's last event."""
        cut = match.taken[-1].order
        state.runs = [r for r in state.runs if r.start.order > cut]
        state.waiting = [w for w in state.waiting if w.start.order > cut]

    # -- helpers -------------------------------------------------------------------------------

    def _taken(self, event: PatternEvent, step: int) -> Taken:
        fields = tuple((name, event.fields.get(name)) for name in self.plan.kept_fields[step])
        return Taken(step, event.stream, event.partition, event.offset, event.time, fields)

    def _bindings(self, run: Run) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for taken in run.taken:
            out[self.plan.steps[taken.step].name] = dict(taken.fields)
        return out

    def _match(self, key: str, run: Run, decided_at: int) -> Match:
        names = [s.name for s in self.plan.steps]
        measures: dict[str, Any] = {}
        for name, kind, step, field_name in self.plan.measures:
            events = [t for t in run.taken if names[t.step] == step]
            if kind == "count":
                measures[name] = len(events)
            elif kind == "first_time":
                measures[name] = events[0].time if events else None
            elif kind == "last_time":
                measures[name] = events[-1].time if events else None
            else:
                measures[name] = sum(v for t in events if isinstance(v := dict(t.fields).get(field_name), (int, float))
                                     and not isinstance(v, bool))
        events_out = tuple(MatchedEvent(names[t.step], t.stream, t.partition, t.offset, t.time) for t in run.taken)
        dims: dict[str, str] = {}
        for name, step_index, field_name in self.plan.dimensions:
            first = next((t for t in run.taken if t.step == step_index), None)
            value = None if first is None else dict(first.fields).get(field_name)
            if value is not None:
                dims[name] = str(value)
        return Match(self.plan.name, key, events_out, measures, decided_at, dims)

    def _store(self, key: str, state: KeyState) -> None:
        if state.empty():
            self._keys.pop(key, None)  # nothing pending: the key costs nothing
        else:
            self._keys[key] = state

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able; from_state(plan, state()) continues exactly where this one is."""
        return {
            "watermark": self.watermark,
            "late_events": self.late_events,
            "keys": {key: {"last": list(s.last) if s.last else None, "runs": [r.to_json() for r in s.runs],
                           "waiting": [w.to_json() for w in s.waiting]} for key, s in self._keys.items()},
        }

    @classmethod
    def from_state(cls, plan: Plan, data: dict) -> PatternMatcher:
        matcher = cls(plan)
        matcher.watermark = data["watermark"]
        matcher.late_events = data["late_events"]
        for key, s in data["keys"].items():
            matcher._keys[key] = KeyState(tuple(s["last"]) if s["last"] else None,
                                          [Run.from_json(r) for r in s["runs"]],
                                          [Run.from_json(w) for w in s["waiting"]])
        return matcher
