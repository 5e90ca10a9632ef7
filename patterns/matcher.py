"""The matcher: per key, a set of runs (partial matches) of an NFA over the pattern's steps.

A run holds the events it took (each labelled with its step, with only the fields later steps
and measures read; kept once per key and shared by its runs, which hold ranges of them:
patterns/run_events.py), how many the current step took, and which candidate steps an event it let
pass has ruled out: under `followed_by` a step may skip events, but not one that step itself
would have taken (the first matching event is the one taken); under `next` it may skip none.
Every event is offered to every run of its key it can change; an event that a run may take
spawns a new run (take) and leaves the old one (skip), so all alternatives are followed, as the
brute-force definition in tests/unit/test_pattern_matcher.py enumerates them. Runs wait in buckets
by the steps their next event may take, so an event that passes none of a bucket's steps (a
failed login, for the runs awaiting a success) costs them only the check that they still fit
`within`; under skip_past_last, runs of one start that no later event can tell apart are kept as
one (`_place`). A burst of one key then costs per event the runs it extends, not every run the
burst left (bench/pattern_burst.py); a key's runs are bounded besides (MAX_RUNS_PER_KEY,
MAX_EVENTS_PER_KEY), past which the matcher is no longer exact (docs/patterns.md).

Time comes only from the events and the watermark: events of one key arrive in event-time order
(ties by stream, partition, offset); `advance(w)` says every event with time <= w was fed. Runs
that cannot fit `within` any more are dropped, and absence runs are decided, by either clock.
The state is plain JSON (`state()` / `from_state()`), bounded by `within` and the absence window.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from patterns.events import Match, MatchedEvent, PatternEvent
from patterns.plan import Plan
from patterns.run_events import PoolMap, RunEvents, union

Order = tuple[int, str, int, int]

# The most partial matches (runs and complete positive parts awaiting an absence) a key holds. A
# key past it starts no run and keeps its preferred ones (the earliest first events); the rest are
# dropped and counted (`dropped_runs`). The state is bounded by `within` too, but within ten
# minutes a looping step (one_or_more) keeps a run per event of a burst, each extended by every
# later one: without this bound one key's burst could stall every stream for minutes. As Esper's
# match_recognize max-states.
MAX_RUNS_PER_KEY = 1000
# And at most this many events and ranges in them all (patterns/run_events.py: a key's runs share
# the events they took; each run holds ranges of them): a batch writes a key's state back whole.
MAX_EVENTS_PER_KEY = 50_000


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
    taken: RunEvents  # the events it took, in its key's pool
    count: int  # events the current (last taken) step has taken
    blocked: frozenset[int] = frozenset()  # candidate steps ruled out since the last take
    deadline: int | None = None  # set on a run whose positive part is complete, awaiting absence

    @property
    def step(self) -> int:
        return self.taken.step

    @property
    def start(self) -> Taken:
        return self.taken.start

    def preference(self) -> tuple:
        """Which of several matches decided at one moment comes first: the earliest start, then
        the most events (greedy), then the earliest events."""
        return (self.start.order, -len(self.taken), tuple((t.order, t.step) for t in self.taken))

    def to_json(self, moved: PoolMap) -> dict:
        """As stored: its ranges and last events per step where `moved` puts them in the written pool."""
        return {"ranges": [[moved(first), moved(first) + end - first] for first, end in self.taken.ranges],
                "lasts": [moved(at) if at >= 0 else -1 for at in self.taken.lasts], "count": self.count,
                "blocked": sorted(self.blocked), "deadline": self.deadline}

    @classmethod
    def from_json(cls, data: dict, pool: list[Taken]) -> Run:
        if "taken" in data:  # a state written before runs shared their key's events: its own, appended
            first = len(pool)
            pool.extend(Taken.from_json(t) for t in data["taken"])
            lasts: dict[int, int] = {}
            for i in range(first, len(pool)):
                lasts[pool[i].step] = i
            events = RunEvents(pool, ((first, len(pool)),), len(pool) - first,
                               tuple(lasts.get(s, -1) for s in range(max(lasts, default=-1) + 1)))
        else:
            ranges = tuple((first, end) for first, end in data["ranges"])
            events = RunEvents(pool, ranges, sum(end - first for first, end in ranges), tuple(data["lasts"]))
        return cls(events, data["count"], frozenset(data["blocked"]), data["deadline"])


# Where a key's partial runs wait: (the step its last event took, the steps its next event may
# take) -> the runs, each under its identity (PatternMatcher._identity).
BucketKey = tuple[int, tuple[int, ...]]


@dataclass
class KeyState:
    last: Order | None = None
    # The partial runs grouped by what an event can do to them: an event that passes none of a
    # bucket's open steps, none of them `next`, leaves every run in it as it is, so a burst of
    # failures costs the runs it extends, not every run waiting for the success.
    buckets: dict[BucketKey, dict[Any, Run]] = field(default_factory=dict)
    waiting: list[Run] = field(default_factory=list)  # complete positive parts awaiting the absence deadline
    # The events the key's runs took, shared by them (patterns/run_events.py); compacted to those
    # still held when it has doubled since (`compacted`: its size then).
    events: list[Taken] = field(default_factory=list)
    compacted: int = 0

    def runs(self) -> list[Run]:
        return [run for bucket in self.buckets.values() for run in bucket.values()]

    def run_count(self) -> int:
        return sum(len(bucket) for bucket in self.buckets.values())

    def empty(self) -> bool:
        return not self.buckets and not self.waiting

    def held(self) -> list[Run]:
        return self.runs() + self.waiting

    def compact(self) -> None:
        """Keep in the pool only the events a run holds, and point the runs at them."""
        covered = union([r for run in self.held() for r in run.taken.ranges])
        pool = [t for first, end in covered for t in self.events[first:end]]
        moved = PoolMap(covered)
        for bucket in self.buckets.values():
            for identity, run in bucket.items():
                bucket[identity] = run._replace(taken=run.taken.remapped(pool, moved))
        self.waiting = [w._replace(taken=w.taken.remapped(pool, moved)) for w in self.waiting]
        self.events = pool
        self.compacted = len(pool)


@dataclass(frozen=True)
class Outcome:
    """What feeding one event gave: the matches decided, and whether the event came too late
    (behind the watermark: the matcher already decided the moments it belongs to)."""

    matches: list[Match]
    late: bool = False


class PatternMatcher:
    def __init__(self, plan: Plan, *, max_runs_per_key: int | None = None):
        self.plan = plan
        self.watermark: int | None = None
        self.late_events = 0
        self.max_runs_per_key = MAX_RUNS_PER_KEY if max_runs_per_key is None else max_runs_per_key
        self.max_events_per_key = MAX_EVENTS_PER_KEY
        self.dropped_runs = 0  # partial matches not started or dropped: their key held the most it may
        self._serial = itertools.count()  # under no_skip, a run's identity (never merged)
        self._keys: dict[str, KeyState] = {}
        names = {step.name: i for i, step in enumerate(plan.steps)}
        every = (*plan.steps, *((plan.absence,) if plan.absence else ()))
        self._strict = [step.strict for step in plan.steps]
        # What of a run the steps to come read (same_as): (step index, field) of its last event there.
        self._references = tuple(sorted({(names[c.value[0]], c.value[1]) for step in every
                                         for c in step.conditions if c.op == "same_as"}))

    # -- reading -------------------------------------------------------------------------------

    @property
    def keys_held(self) -> int:
        return len(self._keys)

    @property
    def partial_matches(self) -> int:
        return sum(s.run_count() + len(s.waiting) for s in self._keys.values())

    def holds(self, key: str) -> bool:
        """Whether the key has anything pending (its state is kept), whether or not any of it can
        still matter: runs past `within` and absences due leave at the key's next event or at
        `advance()`."""
        return key in self._keys

    def holds_at(self, key: str, time: int) -> bool:
        """Whether the key holds anything an event of it at `time` could still extend or decide: a
        run whose first event is within `within` of it, or an absence whose deadline it does not
        pass. Fed to a key that holds nothing of the kind, an event starts a run that depends on no
        earlier event (a restart: a replay may start there). Unlike holds(), it does not depend on
        when the watermark last advanced, so the batch cuts and a replay mark the same restarts:
        what it reads is what the event is offered to, once the absences due before it are decided
        (feed() decides them first, advance() may have before), and under skip_past_last each
        match so decided discards the runs that start at or before its last event."""
        state = self._keys.get(key)
        if state is None:
            return False
        waiting, cut = state.waiting, None
        while not self.plan.no_skip:  # as _decide_absences, without deciding: the runs left behind
            due = [w for w in waiting if w.deadline is not None and w.deadline < time]
            if not due:
                break
            first = min(due, key=lambda w: (w.deadline, w.preference()))
            cut = first.taken[-1].order
            waiting = [w for w in waiting if w is not first and w.start.order > cut]
        if any(w.deadline is None or w.deadline >= time for w in waiting):
            return True
        within = self.plan.within
        earliest = None if within is None else time - within
        return any((cut is None or run.start.order > cut) and (earliest is None or run.taken[0].time >= earliest)
                   for bucket in state.buckets.values() for run in bucket.values())

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
                within = self.plan.within
                self._filter_runs(state, lambda r: r.start.time + within > watermark)
            self._store(key, state)
        return matches

    # -- the NFA -------------------------------------------------------------------------------

    def _offer(self, event: PatternEvent, state: KeyState) -> list[Match]:
        plan = self.plan
        within = plan.within
        steps = plan.steps
        # Asked once per event, not once per run: which steps the event passes but for same_as.
        passing = [step.passes_unbound(event.stream, event.fields) for step in steps]
        taken_as: dict[int, int] = {}  # step -> the event's place in the key's pool, taken as that step
        kept: list[Run] = []
        grown: list[Run] = []
        if within is not None:  # cheap beside an offer: the runs that cannot fit `within` any more go first
            # (else a key's expired runs would count towards its bound and say it holds something)
            earliest = event.time - within
            self._filter_runs(state, lambda r: r.taken[0].time >= earliest)
        for bucket_key in list(state.buckets):
            _, open_steps = bucket_key
            if not any(passing[s] or self._strict[s] for s in open_steps):
                continue  # the event changes none of these runs: they wait as they are
            bucket = state.buckets.pop(bucket_key)
            for run in bucket.values():
                bindings = None
                ruled_out = set()
                for s in open_steps:
                    step = steps[s]
                    takes = passing[s]
                    if takes and step.reads_earlier_events:
                        if bindings is None:
                            bindings = self._bindings(run)
                        takes = step.passes(event.stream, event.fields, bindings)
                    if takes:
                        if s not in taken_as:
                            taken_as[s] = self._take(state, event, s)
                        grown.append(Run(run.taken.extended(taken_as[s]), run.count + 1 if s == run.step else 1))
                    if takes or step.strict:
                        ruled_out.add(s)
                if len(ruled_out) < len(open_steps):
                    kept.append(run._replace(blocked=run.blocked | ruled_out) if ruled_out else run)
        full = (state.run_count() + len(kept) + len(state.waiting) >= self.max_runs_per_key
                or _held_units(state, kept, self.max_events_per_key) >= self.max_events_per_key)
        for s in plan.first_steps():
            if passing[s] and (not steps[s].reads_earlier_events or steps[s].passes(event.stream, event.fields, {})):
                if full:
                    self.dropped_runs += 1
                else:
                    if s not in taken_as:
                        taken_as[s] = self._take(state, event, s)
                    grown.append(Run(RunEvents.first(state.events, taken_as[s]), 1))
        if plan.absence is not None and state.waiting and plan.absence.passes_unbound(event.stream, event.fields):
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
        for run in kept:
            self._place(state, run)
        self._bound(state)
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
        self._filter_runs(state, lambda r: r.start.order > cut)
        state.waiting = [w for w in state.waiting if w.start.order > cut]

    # -- where runs wait ---------------------------------------------------------------------------

    def _place(self, state: KeyState, run: Run) -> None:
        """Put a run with an open step in its bucket. Under skip_past_last, of two runs that began
        at the same event and that no event can tell apart any more (same step, the same steps
        open, a count that still matters equal, the same values for the same_as conditions to
        come), only the one that would be preferred as a match is kept: whatever completes the
        other completes it too, at the same moment and before it, and both begin at or before
        that match's last event, so skip_past_last would drop the other unpublished. A burst of
        failed logins makes such runs by the hundred: each failure past the fifth leaves one
        waiting for a success from its address."""
        plan = self.plan
        open_steps = tuple(s for s in plan.candidates(run.step, run.count) if s not in run.blocked)
        bucket = state.buckets.setdefault((run.step, open_steps), {})
        identity = self._identity(run, open_steps)
        held = bucket.get(identity)
        if held is None or _preferred(run, held):
            bucket[identity] = run

    def _bound(self, state: KeyState) -> None:
        """Past max_runs_per_key runs or max_events_per_key events and ranges in them (the runs
        already held took this event and each left a run that skipped it), keep the preferred
        runs: the earliest first events, then the most events."""
        runs_room = self.max_runs_per_key - len(state.waiting)
        if state.run_count() <= runs_room and _held_units(state, (), self.max_events_per_key) <= self.max_events_per_key:
            return
        held = [(run, key, identity) for key, bucket in state.buckets.items() for identity, run in bucket.items()]
        # By Run.preference, whose first two parts (start, then the most events) nearly always
        # decide: the whole preference (every event's place) is built only for a tie at the cut.
        def coarse(entry: tuple[Run, BucketKey, Any]) -> tuple:
            return (entry[0].start.order, -len(entry[0].taken))

        held.sort(key=coarse)
        cut = self._cut(state, [h[0] for h in held], max(runs_room, 0))
        if 0 < cut < len(held) and coarse(held[cut - 1]) == coarse(held[cut]):
            edge = coarse(held[cut])
            first = next(i for i in range(cut, -1, -1) if i == 0 or coarse(held[i - 1]) != edge)
            last = next(i for i in range(cut, len(held)) if i + 1 == len(held) or coarse(held[i + 1]) != edge)
            held[first:last + 1] = sorted(held[first:last + 1], key=lambda h: h[0].preference())
            cut = self._cut(state, [h[0] for h in held], max(runs_room, 0))
        dropped = held[cut:]
        for _, key, identity in dropped:
            del state.buckets[key][identity]
            if not state.buckets[key]:
                del state.buckets[key]
        self.dropped_runs += len(dropped)

    def _cut(self, state: KeyState, runs: list[Run], room: int) -> int:
        """How many of `runs` (in preference order) the key keeps: at most `room`, and no more
        than fit max_events_per_key events and ranges beside its waiting runs'."""
        covered = bytearray(len(state.events))
        units = sum(_cover(covered, w.taken) for w in state.waiting)
        for i in range(min(len(runs), room)):
            units += _cover(covered, runs[i].taken)
            if units > self.max_events_per_key:
                return i
        return min(len(runs), room)

    def _identity(self, run: Run, open_steps: tuple[int, ...]) -> Any:
        if self.plan.no_skip:  # every complete match is published: a run is only itself
            return next(self._serial)
        step = self.plan.steps[run.step]
        if run.step not in open_steps:
            count = None  # the step takes no more: its count no longer changes what comes next
        elif step.max_times is None:
            count = min(run.count, step.min_times)
        else:
            count = run.count
        return (run.start.order, count, *(_hashable(self._last_value(run, s, name)) for s, name in self._references))

    @staticmethod
    def _last_value(run: Run, step: int, name: str) -> Any:
        taken = run.taken.last_of(step)
        return None if taken is None else dict(taken.fields).get(name)

    def _filter_runs(self, state: KeyState, keep) -> None:
        for bucket_key in list(state.buckets):
            bucket = state.buckets[bucket_key]
            left = {identity: run for identity, run in bucket.items() if keep(run)}
            if len(left) == len(bucket):
                continue
            if left:
                state.buckets[bucket_key] = left
            else:
                del state.buckets[bucket_key]

    # -- helpers -------------------------------------------------------------------------------

    def _take(self, state: KeyState, event: PatternEvent, step: int) -> int:
        """`event` taken as `step`, into the key's pool: its place there."""
        fields = tuple((name, event.fields.get(name)) for name in self.plan.kept_fields[step])
        state.events.append(Taken(step, event.stream, event.partition, event.offset, event.time, fields))
        return len(state.events) - 1

    def _bindings(self, run: Run) -> dict[str, dict[str, Any]]:
        """Per step the run took, the fields of its last event of it (what same_as reads)."""
        steps, pool = self.plan.steps, run.taken.pool
        return {steps[step].name: dict(pool[at].fields) for step, at in enumerate(run.taken.lasts) if at >= 0}

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
            return
        if len(state.events) > 2 * state.compacted + 64:  # the pool doubled since: drop what no run holds
            state.compact()
        self._keys[key] = state

    # -- state ---------------------------------------------------------------------------------

    def state(self) -> dict:
        """JSON-able; from_state(plan, state()) continues exactly where this one is."""
        return {
            "watermark": self.watermark,
            "late_events": self.late_events,
            "keys": {key: _key_json(s) for key, s in self._keys.items()},
        }

    @classmethod
    def from_state(cls, plan: Plan, data: dict) -> PatternMatcher:
        matcher = cls(plan)
        matcher.watermark = data["watermark"]
        matcher.late_events = data["late_events"]
        for key, s in data["keys"].items():
            pool = [Taken.from_json(t) for t in s.get("events", ())]
            state = KeyState(tuple(s["last"]) if s["last"] else None, events=pool)
            state.waiting = [Run.from_json(w, pool) for w in s["waiting"]]
            for run in s["runs"]:
                matcher._place(state, Run.from_json(run, pool))
            state.compacted = len(pool)
            matcher._keys[key] = state
        return matcher


def run_start_times(key_state: dict) -> list[int]:
    """The time of each partial run's first event in a key's stored state (state()["keys"][key]),
    as written now or before runs shared their key's events."""
    events = key_state.get("events")
    return [(events[r["ranges"][0][0]] if events is not None and "ranges" in r else r["taken"][0])[4]
            for r in key_state.get("runs", ()) if r.get("ranges") or r.get("taken")]


def _key_json(state: KeyState) -> dict:
    """A key's state as stored: the events its runs hold, once, and each run as ranges of them;
    the runs in preference order, so the stored state is unchanged when its runs are."""
    runs = _in_preference(state.runs())
    covered = union([r for run in runs + state.waiting for r in run.taken.ranges])
    moved = PoolMap(covered)
    return {"last": list(state.last) if state.last else None,
            "events": [t.to_json() for first, end in covered for t in state.events[first:end]],
            "runs": [r.to_json(moved) for r in runs], "waiting": [w.to_json(moved) for w in state.waiting]}


def _in_preference(runs: list[Run]) -> list[Run]:
    """`runs` sorted by Run.preference, whose whole (every event's place) is built only for runs of
    one start and length: a burst's runs are each as long as the burst."""
    runs = sorted(runs, key=lambda r: (r.start.order, -len(r.taken)))
    out: list[Run] = []
    for _, tied in itertools.groupby(runs, key=lambda r: (r.start.order, -len(r.taken))):
        tied = list(tied)
        out += sorted(tied, key=Run.preference) if len(tied) > 1 else tied
    return out


def _hashable(value: Any) -> Any:
    """A same_as value as part of a run's identity: kept as is when hashable; otherwise (a list
    or object from a JSON field) its repr, one for equal JSON values."""
    try:
        hash(value)
    except TypeError:
        return ("unhashable", repr(value))
    return value


def _preferred(run: Run, other: Run) -> bool:
    """Run.preference(run) < Run.preference(other) for two runs of one start, without building
    either's whole preference when their lengths already decide (the longer comes first)."""
    if len(run.taken) != len(other.taken):
        return len(run.taken) > len(other.taken)
    return run.preference() < other.preference()


def _held_units(state: KeyState, more: list[Run], limit: int) -> int:
    """What a key's runs hold (and `more`'s): the distinct events of its pool they take, plus their
    ranges. Counted exactly only when the pool and the ranges together reach `limit`: below it, the
    pool's size (which may hold events no run takes any more) is enough to say they fit."""
    runs = [*state.runs(), *state.waiting, *more]
    ranges = sum(len(run.taken.ranges) for run in runs)
    if len(state.events) + ranges < limit:
        return len(state.events) + ranges
    return ranges + sum(end - first for first, end in union([r for run in runs for r in run.taken.ranges]))


def _cover(covered: bytearray, events: RunEvents) -> int:
    """Mark `events`' places in `covered`; what they add: the events not marked before, and their ranges."""
    added = len(events.ranges)
    for first, end in events.ranges:
        added += end - first - covered[first:end].count(1)
        covered[first:end] = b"\x01" * (end - first)
    return added
