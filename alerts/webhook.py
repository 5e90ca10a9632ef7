"""Webhook notifier: POSTs Alertmanager webhook (v4) JSON, one message per rule (the group),
from a worker thread, so that the scheduler's `observe()` never waits on the network.

What to send is decided by `alerts.dedup.plan()` against what was last *delivered*; the group
memory moves forward only after a 2xx, so a delivery that failed is planned again by the next
evaluation. The queue holds at most one batch per rule: a newer evaluation of a rule replaces
the one still waiting (`dedup.coalesce`), and it is planned only when the worker takes it,
against the memory the previous send left, so a slow or retrying receiver never gets stale
duplicates. Connection errors, timeouts, 5xx and 429 are retried with exponential backoff;
any other status is final (retrying a 400 only repeats it).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from urllib.parse import quote

import httpx

from alerts.dedup import (FIRING, RESOLVED, GroupMemory, Plan, Why, coalesce, memory_from_json, memory_json, plan,
                          with_undelivered)
from alerts.states import Notice, RuleNotices

log = logging.getLogger("sketchboard.alerts.webhook")

RECEIVER = "webhook"
NOT_ENDED = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of an alert that still fires
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HEADERS = {"Content-Type": "application/json", "User-Agent": "sketchboard-alerts"}


# -- the message ---------------------------------------------------------------------------


def rfc3339(ms: int) -> str:
    """Epoch milliseconds as RFC 3339 UTC with milliseconds, e.g. 2024-05-01T12:00:00.250Z."""
    # timedelta keeps whole milliseconds exact; fromtimestamp(ms / 1000) can round to .249999.
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def group_key(rule: str) -> str:
    """Alertmanager's groupKey: the route's matchers ({} here: one route) and the group labels."""
    return "{}:{alertname=" + json.dumps(rule) + "}"


def alertmanager_body(rule: str, alerts: Sequence[Notice], external_url: str) -> dict:
    """The Alertmanager webhook v4 body for one rule's group of alerts."""
    items = [_alert(rule, n, external_url) for n in alerts]
    return {
        "version": "4",
        "groupKey": group_key(rule),
        "truncatedAlerts": 0,
        "status": FIRING if any(n.status == FIRING for n in alerts) else RESOLVED,
        "receiver": RECEIVER,
        "groupLabels": {"alertname": rule},
        "commonLabels": _common([a["labels"] for a in items]),
        "commonAnnotations": _common([a["annotations"] for a in items]),
        "externalURL": external_url,
        "alerts": items,
    }


def _alert(rule: str, n: Notice, external_url: str) -> dict:
    ended = n.status == RESOLVED and n.ends_at_ms is not None
    return {
        "status": n.status,
        "labels": {"alertname": rule, **n.labels},
        "annotations": dict(n.annotations),
        "startsAt": rfc3339(n.starts_at_ms),
        "endsAt": rfc3339(n.ends_at_ms) if ended else NOT_ENDED,
        "generatorURL": f"{external_url.rstrip('/')}/api/v1/alerts?rule={quote(rule, safe='')}",
        "fingerprint": n.fingerprint,
        # JSON has no NaN or infinity: an error/nodata instance may carry no usable value.
        "value": n.value if n.value is not None and math.isfinite(n.value) else None,
    }


def _common(dicts: list[dict[str, str]]) -> dict[str, str]:
    if not dicts:
        return {}
    shared = set(dicts[0].items())
    for d in dicts[1:]:
        shared &= set(d.items())
    return dict(sorted(shared))


def url_problem(url: str) -> str | None:
    """What makes `url` unusable as the webhook's address, or None. The settings check with this
    too, so that a URL they accept is one the notifier takes. The URL is never part of the answer:
    it may carry a password or a token."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError, TypeError):
        return "is not a valid URL"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "must be an http:// or https:// URL with a host"
    if any(c.isspace() for c in url):
        return "must not contain blanks"
    if port is not None and not 0 < port < 65536:
        return "has a port out of range (1-65535)"
    return None


def _retryable(status: int) -> bool:
    return status >= 500 or status == 429


# -- the notifier --------------------------------------------------------------------------


class WebhookNotifier:
    """observe(batch) after each evaluation of each rule; close() at shutdown; stats() for
    /metrics or logs. One worker thread, started here, does every POST."""

    def __init__(self, url: str, *, timeout_s: float = 5.0, max_attempts: int = 4, backoff_s: float = 0.5,
                 max_backoff_s: float = 8.0, repeat_interval_s: float = 4 * 3600,
                 external_url: str = "http://127.0.0.1:8000/", queue_size: int = 1000,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 memory_store=None, active: Callable[[], bool] | None = None, close_timeout_s: float = 5.0):
        problem = url_problem(url)
        if problem is not None:  # the URL itself is not shown: it may hold a password
            raise ValueError(f"alert_webhook_url {problem}")
        if max_attempts < 1 or queue_size < 1 or timeout_s <= 0:
            raise ValueError("alert webhook: max_attempts and queue_size must be >= 1, timeout_s > 0")
        self._url = url
        self._timeout_s = timeout_s
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._repeat_interval_s = repeat_interval_s
        self._external_url = external_url
        self._queue_size = queue_size
        self._close_timeout_s = close_timeout_s  # the shutdown flush's bound (alert_webhook_shutdown_timeout)
        self._clock = clock
        self._sleep = sleep

        self._cond = threading.Condition()
        # Guarded by _cond: rule -> its newest batch not yet planned (insertion order = FIFO).
        self._pending: dict[str, RuleNotices] = {}
        self._closing = False
        self._abandoned = False  # close() timed out: stop retrying, send nothing more
        self._counts = {"sent": 0, "failed": 0, "retried": 0, "dropped": 0, "deduplicated": 0, "standby": 0}
        # With several API replicas only the lease holder notifies (sketchboard/leader.py): a replica
        # that is not (or no longer) the leader drops what it is given, and checks again before each
        # attempt of a delivery and before saving it, so a replica that lost the lease while a batch
        # waited, or while it backed off, neither sends it nor writes over the new leader's memory.
        self._active = active
        self._reload = False  # reload_memory() asked: the worker reads the store's memory first
        self._last_error: str | None = None
        # Worker thread only: rule -> what was last delivered. With a memory store (e.g.
        # store.alerts.SqliteAlertStore) it survives a restart, so an alert delivered as firing
        # before the restart is delivered as resolved after it, and not delivered twice.
        self._memory_store = memory_store
        self._memory: dict[str, GroupMemory] = {}
        # Worker thread only: rule -> the resolved notices of its last message given up on, by
        # fingerprint. Planned again with the rule's next batch, they keep their end time (the
        # memory, unchanged, would otherwise make up a resolution ending at that batch's time).
        self._undelivered: dict[str, dict[str, Notice]] = {}
        self._load_memory()

        self._thread = threading.Thread(target=self._run, name="alert-webhook", daemon=True)
        self._thread.start()

    def _load_memory(self) -> None:
        """What was last delivered, as the store holds it (worker thread, or before it starts)."""
        if self._memory_store is None:
            return
        memory: dict[str, GroupMemory] = {}
        for rule, data in self._memory_store.notifier_memory(self._url).items():
            try:
                memory[rule] = memory_from_json(data)
            except (KeyError, TypeError, ValueError) as exc:  # a document from another version
                log.warning("webhook: ignoring the saved memory of rule %r: %s", rule, exc)
        with self._cond:  # the worker changes it under _cond: remembered_rules() reads it
            self._memory = memory

    # -- the scheduler's side --------------------------------------------------------------

    def reload_memory(self) -> None:
        """Read what was delivered from the store again before the next send: this replica just
        became the leader, and the previous one delivered meanwhile (not sending it twice)."""
        with self._cond:
            self._reload = True
            self._cond.notify()

    def remembered_rules(self) -> set[str]:
        """The rules whose message the receiver was last told something firing for (the alert
        service resolves those whose rule is gone: a resolution given up on is sent again)."""
        with self._cond:
            return set(self._memory)

    def observe(self, batch: RuleNotices) -> None:
        """Queue one evaluation's notices for the worker; returns at once. A rule that already
        waits in the queue is updated in place; a new rule is dropped (and counted) when
        `queue_size` rules are waiting or the notifier is closed."""
        if not self._is_active():
            with self._cond:
                self._counts["standby"] += 1
            return
        with self._cond:
            older = self._pending.get(batch.rule)
            if older is not None:
                self._pending[batch.rule] = coalesce(older, batch)
                return
            if self._closing or len(self._pending) >= self._queue_size:
                self._counts["dropped"] += 1
                why = "closed" if self._closing else f"{self._queue_size} rules already queued"
                log.warning("webhook: dropped the notices of rule %r (%s)", batch.rule, why)
                return
            self._pending[batch.rule] = batch
            self._cond.notify()

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued (retries included), then stop the worker, waiting at most
        `timeout_s` (default: the notifier's `close_timeout_s`); what is still unsent then is given
        up here and logged. Not lost: what was delivered is remembered (in the memory store) only
        once it was, so the next leader's evaluations plan what this one did not send again."""
        if timeout_s is None:
            timeout_s = self._close_timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            with self._cond:
                self._abandoned = True
                left = len(self._pending)
                self._pending.clear()
            log.warning("webhook: still sending after %.1f s at close; %d queued rule(s) not sent here: not"
                        " remembered as delivered, they are the next leader's to send", timeout_s, left)

    def _is_active(self) -> bool:
        return self._active is None or self._active()

    def stats(self) -> dict:
        """sent / failed (deliveries given up) / retried (attempts repeated) / dropped (queue
        full or closed) / deduplicated (evaluations with nothing new to send) / standby
        (evaluations given while this replica did not lead) counts, queued
        (rules waiting now) and last_error (the latest failed attempt, or None)."""
        with self._cond:
            return {**self._counts, "queued": len(self._pending), "last_error": self._last_error}

    # -- the worker ------------------------------------------------------------------------

    def _run(self) -> None:
        with httpx.Client(timeout=self._timeout_s, follow_redirects=False) as client:
            while (batch := self._next()) is not None:
                try:
                    self._handle(client, batch)
                except Exception as exc:  # the worker must outlive any one bad batch
                    log.exception("webhook: failed on rule %r", batch.rule)
                    self._record_failure(f"{type(exc).__name__}: {exc}", gave_up=True)

    def _next(self) -> RuleNotices | None:
        while True:
            with self._cond:
                while not self._pending and not self._closing and not self._reload:
                    self._cond.wait()
                reload, self._reload = self._reload, False
                if not reload:
                    if not self._pending or self._abandoned:
                        return None
                    return self._pending.pop(next(iter(self._pending)))
            try:  # outside the lock: observe() must not wait on the store
                self._load_memory()
            except Exception as exc:  # the store is away: keep what this replica remembered
                log.warning("webhook: could not read what was delivered: %s", exc)

    def _handle(self, client: httpx.Client, batch: RuleNotices) -> None:
        if not self._is_active():  # the lease moved on while this batch waited: the new leader sends
            with self._cond:
                self._counts["standby"] += 1
            return
        undelivered = {} if batch.silenced else self._undelivered.pop(batch.rule, {})
        for part in with_undelivered(batch, self._memory.get(batch.rule), undelivered):
            if not self._send(client, part):
                return  # a new firing is not sent before the resolution that comes first

    def _send(self, client: httpx.Client, batch: RuleNotices) -> bool:
        """Plan `batch` and deliver it; False when the delivery was given up on."""
        decided = plan(batch, self._memory.get(batch.rule), self._clock(), self._repeat_interval_s)
        if decided.why is Why.DUPLICATE:
            with self._cond:
                self._counts["deduplicated"] += 1
        if not decided.send:
            return True
        delivered = self._deliver(client, decided)
        if delivered is None:  # the lease moved on mid-delivery: the new leader's memory stands
            with self._cond:
                self._counts["standby"] += 1
            return False
        if not delivered:
            self._undelivered[batch.rule] = {n.fingerprint: n for n in decided.alerts if n.status == RESOLVED}
            return False
        with self._cond:
            if decided.remember is None:
                self._memory.pop(batch.rule, None)
            else:
                self._memory[batch.rule] = decided.remember
            self._counts["sent"] += 1
        self._save_memory(batch.rule, decided.remember)
        return True

    def _save_memory(self, rule: str, memory: GroupMemory | None) -> None:
        if self._memory_store is None:
            return
        try:
            self._memory_store.save_notifier_memory(self._url, rule, None if memory is None else memory_json(memory))
        except Exception as exc:  # delivered all the same; only a restart would repeat it
            log.warning("webhook: could not save what was delivered for rule %r: %s", rule, exc)

    def _deliver(self, client: httpx.Client, decided: Plan) -> bool | None:
        """True when delivered, False when given up on, None when this replica stopped leading:
        the lease is asked before every attempt and after the last, since another replica may
        lead by then, decide from the store's memory and send; a late retry or memory saved here
        would contradict it (an alert it resolved, or never sent, left firing at the receiver)."""
        body = json.dumps(alertmanager_body(decided.rule, decided.alerts, self._external_url),
                          separators=(",", ":"), allow_nan=False).encode()
        for attempt in range(1, self._max_attempts + 1):
            if not self._is_active():
                log.info("webhook: rule %r not sent: this replica no longer leads", decided.rule)
                return None
            error, retry = self._post(client, body)
            if error is None:
                log.info("webhook: sent rule %r (%s, %d alert(s))", decided.rule, decided.why.value,
                         len(decided.alerts))
                return True if self._is_active() else None
            if not retry or attempt == self._max_attempts or self._abandoned:
                break
            delay = min(self._backoff_s * 2 ** (attempt - 1), self._max_backoff_s)
            log.info("webhook: rule %r attempt %d failed (%s); retrying in %.2f s", decided.rule, attempt, error, delay)
            self._record_failure(error, gave_up=False)
            self._sleep(delay)
            if self._abandoned:  # close() stopped waiting while we slept
                break
        log.error("webhook: gave up on rule %r after %d attempt(s): %s; the next evaluation tries again",
                  decided.rule, attempt, error)
        self._record_failure(error, gave_up=True)
        return False

    def _post(self, client: httpx.Client, body: bytes) -> tuple[str | None, bool]:
        """(None, _) when delivered, else (what went wrong, whether another attempt may help)."""
        # httpx's timeout bounds each read, not the attempt: a receiver that answers a byte at a time
        # would hold the worker (and every rule behind it) as long as it likes. The answer's body is
        # read in chunks against a deadline on the monotonic clock, and dropped with the connection
        # once it passes (an attempt lasts at most about twice the timeout: one read more).
        deadline = time.monotonic() + self._timeout_s
        try:
            with client.stream("POST", self._url, content=body, headers=_HEADERS) as response:
                for _ in response.iter_raw():
                    if time.monotonic() >= deadline:
                        return f"timed out after {self._timeout_s:g} s (the answer was still arriving)", True
        except httpx.TimeoutException as exc:
            return f"timed out after {self._timeout_s:g} s ({type(exc).__name__})", True
        except httpx.TransportError as exc:  # refused, reset, DNS: the receiver may come back
            return f"{type(exc).__name__}: {exc}", True
        if response.is_success:
            return None, False
        return f"HTTP {response.status_code}", _retryable(response.status_code)

    def _record_failure(self, error: str, *, gave_up: bool) -> None:
        with self._cond:
            self._counts["failed" if gave_up else "retried"] += 1
            self._last_error = error
