"""The alerting service: rules from the store, evaluated on their interval, the results
saved (instances and history in one transaction) and handed to the notifiers. The API's
rule routes go through it too, so that every change is validated the same way.

Runs as a background thread in the API process (like the lag sampler, it must keep
watching while the pipeline is down: that is when lag and absence rules matter).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from alerts.evaluator import Evaluation, Transition, evaluate
from alerts.kinds import evaluate_rule
from alerts.machine import Instance
from alerts.outcome import AlertData, Outcome
from alerts.rules import Rule, RuleError, TrendRule, against_ms, parse_rule, rule_json
from alerts.states import AlertState, Notice, RuleNotices
from catalog import Catalog
from store.alerts import RuleConflict, SqliteAlertStore, StoredRule

log = logging.getLogger("sketchboard.alerts")

__all__ = ["AlertService", "RuleConflict", "RuleError", "LoadedRule"]


@dataclass(frozen=True)
class LoadedRule:
    stored: StoredRule
    rule: Rule | None  # None: the stored definition no longer validates (e.g. its metric was removed)
    problem: str | None = None


class AlertService:
    def __init__(self, catalog: Catalog, store: SqliteAlertStore, data: AlertData, *,
                 default_interval_ms: int = 10_000, notifiers: Iterable = (), clock: Callable[[], float] = time.time,
                 active: Callable[[], bool] | None = None, served: Callable[[Catalog], Catalog] | None = None):
        self.catalog = catalog  # rules are checked against it (they outlive a switch)
        # ... and evaluated against the catalog the served output was built with (api/served_catalog.py):
        # until a switch, a rule needing what only the configuration has is an Error, not a wrong value.
        self.served = served
        # Whether this replica may write evaluations now (it holds the leader lease:
        # sketchboard/leader.py), asked right before each save; None: always. A lease that lapsed
        # mid-evaluation (its renewal blocked) must not write over the new leader's.
        self.active = active
        self.store = store
        self.data = data
        self.default_interval_ms = default_interval_ms
        self.notifiers = list(notifiers)
        self.clock = clock
        self.last_error: str | None = None
        self._lock = threading.RLock()  # one evaluation or rule change at a time
        self._cache: tuple[int, list[LoadedRule]] | None = None
        self._due: dict[str, tuple[int, int]] = {}  # rule -> (its updated_ms, next due time)
        self._firing: dict[str, list[Notice]] = {}  # rule -> notices it last reported as firing
        self._orphans_due_ms = 0  # when to look next for rules the notifiers remember but that are gone
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # -- rules -----------------------------------------------------------------------------

    def use_catalog(self, catalog: Catalog) -> None:
        """Rules are checked and evaluated against `catalog` from now on (it gained or lost a
        pattern defined through the API: api/pattern_definitions.py)."""
        with self._lock:
            self.catalog = catalog
            if hasattr(self.data, "catalog"):
                self.data.catalog = catalog
            self._cache = None  # loaded against the old one

    def rules(self) -> list[LoadedRule]:
        version = self.store.rules_version()
        if self._cache is None or self._cache[0] != version:
            self._cache = (version, [self._load(stored) for stored in self.store.rules()])
        return self._cache[1]

    def create(self, definition: Mapping) -> StoredRule:
        rule = parse_rule(dict(definition), self.catalog)
        return self.store.create_rule(rule.name, rule_json(rule), source="api", now_ms=self.now_ms())

    def replace(self, name: str, definition: Mapping) -> StoredRule | None:
        definition = dict(definition)
        given = definition.setdefault("name", name)
        if given != name:
            raise RuleError(f"name: the body names {given!r} but the path names {name!r}; a rule cannot be renamed")
        rule = parse_rule(definition, self.catalog)
        return self.store.replace_rule(name, rule_json(rule), now_ms=self.now_ms())

    def delete(self, name: str) -> bool:
        """Remove an API rule; its active instances end in the history as Normal ("rule deleted")
        and what was firing is resolved at the notifiers."""
        with self._lock:
            stored = self.store.rule(name)
            if stored is None:
                return False
            now = self.now_ms()
            ended = [_ended(i, now) for i in self.store.instances(name)]
            if stored.source != "file":
                self.store.save_evaluation(name, [], ended, now_ms=now)
            if not self.store.delete_rule(name):
                return False
            self._resolve_all(name, now)
            return True

    def silence(self, name: str, duration_ms: int | None) -> StoredRule | None:
        now = self.now_ms()
        return self.store.set_silence(name, None if duration_ms is None else now + duration_ms, now_ms=now)

    def sync_file(self, rules: Mapping[str, Rule]) -> list[str]:
        """Make the file rules exactly `rules`; return the names of those removed. A removed rule
        ends like a deleted one (history "rule deleted", resolved at the notifiers), even when it
        was removed while the API was down: the notifiers resolve what they remember delivering."""
        with self._lock:
            now = self.now_ms()
            removed = self.store.sync_file_rules({name: rule_json(rule) for name, rule in rules.items()}, now_ms=now,
                                                 ended=lambda instances: [_ended(i, now) for i in instances])
            for name in removed:
                self._resolve_all(name, now)
            return removed

    # -- evaluation ------------------------------------------------------------------------

    def evaluate_due(self, now_ms: int | None = None) -> list[Evaluation]:
        """Evaluate every rule whose interval has come (and each new or changed rule at once)."""
        now = self.now_ms() if now_ms is None else now_ms
        out = []
        rules = self.rules()
        for loaded in rules:
            name, updated = loaded.stored.name, loaded.stored.updated_ms
            seen_version, due = self._due.get(name, (None, 0))
            if seen_version == updated and now < due:
                continue
            interval = self._interval(loaded)
            self._due[name] = (updated, now // interval * interval + interval)  # aligned, like Prometheus groups
            out.append(self.evaluate_rule(loaded, now))
        self._forget_removed(rules)
        if now >= self._orphans_due_ms:
            self._orphans_due_ms = now + self.default_interval_ms
            self._resolve_orphans(now)
        return out

    def evaluate_rule(self, loaded: LoadedRule, now_ms: int) -> Evaluation:
        with self._lock:
            name = loaded.stored.name
            previous = {d["fingerprint"]: _instance(d) for d in self.store.instances(name)}
            if loaded.rule is None:
                rule = _stand_in(loaded.stored)
                outcome = Outcome.failed(f"the rule's definition is no longer valid: {loaded.problem}")
            else:
                rule = loaded.rule
                catalog = self.catalog if self.served is None else self.served(self.catalog)
                outcome = evaluate_rule(rule, self.data, catalog, now_ms, cursor=self.store.cursor(name))
            result = evaluate(rule, outcome, previous, now_ms)
            if self.active is not None and not self.active():
                return result  # no longer the leader: neither saved nor notified (the new leader evaluates)
            history = [_transition_json(t, _input(rule, self.catalog, t)) for t in result.transitions]
            self.store.save_evaluation(name, [_instance_json(i) for i in result.instances], history, now_ms=now_ms,
                                       cursor=result.cursor)
            silenced = (loaded.stored.silenced_until_ms or 0) > now_ms
            self._notify(RuleNotices(name, now_ms, result.notices, silenced=silenced))
            self._firing[name] = [n for n in result.notices if n.status == "firing"]
            return result

    def with_corrections_since(self, history: list[dict]) -> list[dict]:
        """History entries with `corrections_since`: how many corrections changed the window an
        entry was decided on, after the decision (None where the rule reads no metric window).
        Decisions are not revised: this only tells the reader the value has since changed."""
        rules = {loaded.stored.name: loaded.rule for loaded in self.rules()
                 if getattr(loaded.rule, "metric", None) in self.catalog.metrics}
        for event in history:
            # What the decision read, recorded with it: a rule replaced since (another filter,
            # metric or `against`) does not change which corrections concern an older decision.
            # Entries from before it was recorded are read with the rule as it is now.
            read = event.pop("input", None)
            rule = rules.get(event["rule"]) if event.get("window_start_ms") is not None else None
            if read is None and rule is not None:
                read = _input(rule, self.catalog, event)
            event["corrections_since"] = None if read is None else sum(
                self.data.corrections_after(read["stream"], start, end, event["at_ms"], read["dims"])
                for start, end in read["windows"])
        return history

    # -- the background thread --------------------------------------------------------------

    def start(self, tick_s: float = 0.5) -> None:
        if self._thread is not None:
            if not self._stop.is_set():
                return
            self._thread.join()  # paused while an evaluation was still running: let it end first
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(tick_s,), name="alert-evaluator", daemon=True)
        self._thread.start()

    def pause(self, timeout_s: float = 5.0) -> None:
        """Stop evaluating, keep the notifiers (another replica took the lease; start() resumes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if not self._thread.is_alive():  # else start() waits for it: never two evaluators
                self._thread = None

    def resume(self, tick_s: float = 0.5) -> None:
        """This replica leads (again): the notifiers first read what the previous leader delivered,
        and every rule is evaluated at once, from the instances the store holds."""
        for notifier in self.notifiers:
            reload = getattr(notifier, "reload_memory", None)
            if reload is not None:
                reload()
        with self._lock:
            self._due.clear()
            self._orphans_due_ms = 0  # what the previous leader failed to resolve, at once
        self.start(tick_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        self.pause(timeout_s)
        for notifier in self.notifiers:
            try:
                notifier.close()
            except Exception as exc:  # stopping must go on whatever one notifier does
                log.warning("closing notifier %r failed: %s", notifier, exc)

    def _run(self, tick_s: float) -> None:
        while not self._stop.is_set():
            try:
                self.evaluate_due()
                self.last_error = None
            except Exception as exc:  # keep evaluating: a locked store may come back
                if self.last_error != str(exc):
                    log.warning("alert evaluation failed: %s", exc)
                self.last_error = str(exc)
            self._stop.wait(tick_s)

    # -- helpers -------------------------------------------------------------------------------

    def _load(self, stored: StoredRule) -> LoadedRule:
        try:
            return LoadedRule(stored, parse_rule(stored.definition, self.catalog))
        except RuleError as exc:
            return LoadedRule(stored, None, str(exc))

    def _interval(self, loaded: LoadedRule) -> int:
        interval = loaded.rule.interval if loaded.rule is not None else None
        return interval or self.default_interval_ms

    def _notify(self, batch: RuleNotices) -> None:
        for notifier in self.notifiers:
            try:
                notifier.observe(batch)
            except Exception as exc:  # one broken notifier must not stop evaluation or the others
                log.warning("notifier %r failed: %s", notifier, exc)

    def _resolve_all(self, name: str, now_ms: int) -> None:
        """The rule is gone: resolve at the notifiers what it had firing. Sent even when this process
        knows of nothing firing (after a restart), since a notifier resolves what it remembers
        delivering and is not mentioned."""
        firing = self._firing.pop(name, [])
        resolved = [Notice(n.rule, n.fingerprint, "resolved", AlertState.NORMAL, n.labels, n.annotations,
                           n.starts_at_ms, now_ms, n.value) for n in firing]
        self._notify(RuleNotices(name, now_ms, resolved))
        self._due.pop(name, None)

    def _resolve_orphans(self, now_ms: int) -> None:
        """Resolve again, at each notifier, the rules it remembers delivering as firing but that no
        longer exist: a deletion's resolution queues one message, and one given up on (the receiver
        was down) would otherwise never be sent, since no evaluation of the rule comes to retry it.
        Once per default interval, like an evaluation; the notifier's memory is read before the
        rules, so a rule created meanwhile is seen as present."""
        for notifier in self.notifiers:
            remembered = getattr(notifier, "remembered_rules", None)
            if remembered is None:
                continue
            try:
                names = remembered()
                if not names:
                    continue
                with self._lock:
                    present = {stored.name for stored in self.store.rules()}
                    for name in sorted(names - present):
                        if self.active is not None and not self.active():
                            return
                        notifier.observe(RuleNotices(name, now_ms, []))
            except Exception as exc:  # one broken notifier must not stop evaluation or the others
                log.warning("notifier %r failed: %s", notifier, exc)

    def _forget_removed(self, rules: list[LoadedRule]) -> None:
        present = {loaded.stored.name for loaded in rules}
        for name in [n for n in self._firing if n not in present]:  # removed from the file, say
            self._resolve_all(name, self.now_ms())
        for name in [n for n in self._due if n not in present]:
            self._due.pop(name, None)


def _instance_json(inst: Instance) -> dict:
    return {**asdict(inst), "state": inst.state.value}


def _instance(data: dict) -> Instance:
    return Instance(**{**data, "state": AlertState(data["state"])})


def _transition_json(t: Transition, read: dict | None) -> dict:
    entry = {**asdict(t), "from_state": t.from_state.value, "to_state": t.to_state.value}
    return entry if read is None else {**entry, "input": read}


def _input(rule: Rule, catalog: Catalog, entry: Transition | dict) -> dict | None:
    """What a decision on a metric window read: the stream, the dimension values of its panes
    and the windows (corrections_since counts the corrections to them); None without a window."""
    get = entry.get if isinstance(entry, dict) else lambda name: getattr(entry, name)
    metric = catalog.metrics.get(getattr(rule, "metric", None))
    if metric is None or get("window_start_ms") is None:
        return None
    return {"stream": metric.stream, "dims": _input_dims(rule, get("labels") or {}),
            "windows": [list(w) for w in _windows_read(rule, get("window_start_ms"), get("window_end_ms"))]}


def _ended(instance: dict, now_ms: int) -> dict:
    return {"rule": instance["rule"], "fingerprint": instance["fingerprint"], "labels": instance["labels"],
            "annotations": instance.get("annotations", {}), "from_state": instance["state"], "to_state": "normal",
            "value": None, "at_ms": now_ms, "window_start_ms": None, "window_end_ms": None, "revision": None,
            "reason": "rule deleted"}


def _windows_read(rule: Rule, start_ms: int, end_ms: int) -> list[tuple[int, int]]:
    """The windows a decision on [start_ms, end_ms) read: a trend rule's baseline too, `against`
    earlier (alerts/kinds.py _trend); a correction there changed the decision's value as much."""
    if not isinstance(rule, TrendRule):
        return [(start_ms, end_ms)]
    offset = against_ms(rule)  # at least the window (alerts/rules.py): the two never overlap
    return [(start_ms, end_ms), (start_ms - offset, end_ms - offset)]


def _input_dims(rule: Rule, labels: Mapping[str, str]) -> dict[str, str]:
    """The dimension values of the panes an entry's decision read: the rule's filters and the
    entry's group (a correction to another endpoint did not change this entry's window)."""
    group = {k: labels[k] for k in getattr(rule, "group_by", ()) if k in labels}
    return {**rule.filters, **group}


def _stand_in(stored: StoredRule):
    """Enough of a rule to move its instances to Error when its definition no longer validates."""
    from alerts.rules import LagStatusRule

    labels = stored.definition.get("labels")
    labels = labels if isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values()) else {}
    return LagStatusRule.model_construct(name=stored.name, kind="lag_status", labels=labels, annotations={},
                                         for_=0, keep_firing_for=0, no_data_state="nodata", error_state="error")
