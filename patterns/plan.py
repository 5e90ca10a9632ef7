"""A pattern compiled for matching: steps as plain tuples, literals as the fields hold them, and
which fields of each step's events later steps, measures and the match's dimensions read (all a
run has to keep)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Mapping

from catalog.model import Catalog
from catalog.patterns import Condition, PatternDef, match_dimensions, normalized_conditions

# The last event a step matched, as far as the run kept it: step name -> its kept fields.
Bindings = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class PlanStep:
    name: str
    stream: str
    conditions: tuple[Condition, ...]
    min_times: int
    max_times: int | None  # None: unbounded
    strict: bool  # contiguity `next`

    def passes(self, stream: str, fields: Mapping[str, Any], bindings: Bindings) -> bool:
        return stream == self.stream and all(_holds(c, fields, bindings) for c in self.conditions)

    @cached_property
    def unbound_conditions(self) -> tuple[Condition, ...]:
        """The conditions that do not depend on earlier steps' events (all but `same_as`): an event
        failing one of them fails the step whatever a run holds."""
        return tuple(c for c in self.conditions if c.op != "same_as")

    @cached_property
    def reads_earlier_events(self) -> bool:
        return any(c.op == "same_as" for c in self.conditions)

    def passes_unbound(self, stream: str, fields: Mapping[str, Any]) -> bool:
        """Whether the event passes all but the step's `same_as` conditions (passes() needs those too)."""
        return stream == self.stream and all(_holds(c, fields, {}) for c in self.unbound_conditions)


def holds_alone(condition: Condition, value: Any) -> bool:
    """Whether a field holding `value` passes a condition that reads no earlier step (not same_as)."""
    return _holds(condition, {condition.field: value}, {})


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "in": lambda a, b: a in b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
}


def _holds(condition: Condition, fields: Mapping[str, Any], bindings: Bindings) -> bool:
    value = fields.get(condition.field)
    if value is None:
        return False
    op, target = condition.op, condition.value
    if op == "same_as":
        step, field = target
        bound = bindings.get(step)
        # A reference to a step that matched nothing (optional, skipped) holds for no event, as a
        # comparison with SQL's NULL does.
        return bound is not None and bound.get(field) is not None and value == bound[field]
    try:
        return _COMPARE[op](value, target)
    except TypeError:  # a string where a number was declared: not a match, never an error
        return False


@dataclass(frozen=True)
class Plan:
    name: str
    steps: tuple[PlanStep, ...]
    within: int | None
    absence: PlanStep | None
    absence_within: int | None
    no_skip: bool
    measures: tuple[tuple[str, str, str, str | None], ...]  # (name, kind, step, field)
    kept_fields: tuple[tuple[str, ...], ...]  # per step: the fields its events keep in a run
    # The match's dimensions: (name, step index, field), read from the first event that step took.
    dimensions: tuple[tuple[str, int, str], ...] = ()

    def candidates(self, step: int, count: int) -> tuple[int, ...]:
        """The steps the next taken event may match, after `count` events matched step `step`."""
        out = []
        if self.steps[step].max_times is None or count < self.steps[step].max_times:
            out.append(step)
        if count >= self.steps[step].min_times:
            for later in range(step + 1, len(self.steps)):
                out.append(later)
                if self.steps[later].min_times > 0:
                    break
        return tuple(out)

    def first_steps(self) -> tuple[int, ...]:
        """The steps a match may start at: the first, and those after leading optional steps."""
        out = []
        for i, step in enumerate(self.steps):
            out.append(i)
            if step.min_times > 0:
                break
        return tuple(out)

    def any_strict(self) -> bool:
        """Whether a step is `next`: then every event of a key matters (it breaks runs it does not extend)."""
        return any(s.strict for s in self.steps)

    def complete(self, step: int, count: int) -> bool:
        """Whether the positive part may end here: enough events for this step, the rest optional."""
        return count >= self.steps[step].min_times and all(s.min_times == 0 for s in self.steps[step + 1:])


def compile_pattern(pattern: PatternDef, catalog: Catalog) -> Plan:
    def plan_step(name: str, stream: str, where_conditions: tuple[Condition, ...], low: int, high: int | None,
                  strict: bool) -> PlanStep:
        return PlanStep(name, stream, normalized_conditions(catalog.stream(stream), where_conditions), low, high,
                        strict)

    steps = tuple(plan_step(s.name, s.stream, s.conditions(), s.min_times, s.max_times, s.contiguity == "next")
                  for s in pattern.steps)
    absence = None
    if pattern.not_followed_by is not None:
        a = pattern.not_followed_by
        absence = plan_step(a.name, a.stream, a.conditions(), 1, 1, False)
    kept: dict[str, set[str]] = {s.name: set() for s in steps}
    for step in (*steps, *((absence,) if absence else ())):
        for condition in step.conditions:
            if condition.op == "same_as":
                kept[condition.value[0]].add(condition.value[1])
    measures = []
    for name, measure in pattern.measures.items():
        measures.append((name, measure.kind, measure.step, measure.field))
        if measure.field:
            kept[measure.step].add(measure.field)
    dimensions = tuple((d.name, d.step, d.field) for d in match_dimensions(pattern, catalog))
    for _, step_index, field_name in dimensions:
        kept[steps[step_index].name].add(field_name)
    return Plan(
        name=pattern.name, steps=steps, within=pattern.within, absence=absence,
        absence_within=pattern.not_followed_by.within if pattern.not_followed_by else None,
        no_skip=pattern.after_match == "no_skip", measures=tuple(measures),
        kept_fields=tuple(tuple(sorted(kept[s.name])) for s in steps), dimensions=dimensions,
    )
