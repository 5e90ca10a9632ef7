"""DemoProducer: posts DemoTraffic to the ingest API at a target rate, with retries (backoff on
connection errors, 409, 429 and 5xx; a body over the limit sent in halves) and one
Idempotency-Key per body, so a retried body is never appended twice. With `pg_tables` the
tables' rows are written into PostgreSQL instead (demo/pg_tables.py), for change data capture."""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from typing import Any, TextIO

import httpx
import psycopg

from demo.pg_tables import PostgresTables
from demo.traffic import DemoTraffic

INGEST_PATH = "/api/v1/events"
TABLES_PATH = "/api/v1/tables"  # + /{name}: a table's rows (the demo's users, demo/users.py)


_BEFORE, _DURING, _AFTER = range(3)  # where a producer's clock stands against a spike's window


class DemoProducer:
    """Posts DemoTraffic to the ingest API at `rate` requests/s (times the daily shape)."""

    TICK_S = 0.25
    MAX_CATCHUP_S = 2.0        # after a stall, send at most this much backlog, not all of it
    BACKOFF_START_S = 0.2
    BACKOFF_MAX_S = 5.0
    # The service is busy or still starting; 409: our own earlier try of this body is still
    # being processed (same Idempotency-Key).
    RETRY_STATUSES = frozenset({409, 429, 502, 503, 504})
    TABLE_PAGE = 1000          # keys per GET of a table's rows (the API's most: api/table_routes.py MAX_PAGE)

    def __init__(
        self,
        base_url: str,
        traffic: DemoTraffic,
        *,
        rate: float = 200.0,
        batch_max: int = 500,
        progress_every_s: float = 10.0,
        out: TextIO = sys.stderr,
        token: str | None = None,
        pg_tables: PostgresTables | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        # Sent as a bearer token when the service requires one (SKETCHBOARD_TOKEN, ingest scope).
        self.headers = {"authorization": f"Bearer {token}"} if token else {}
        self.traffic = traffic
        self.rate = rate
        self.batch_max = max(1, batch_max)
        self.progress_every_s = progress_every_s
        self.out = out
        self.sent = 0          # events in requests the service answered 200
        self.accepted = 0
        self.rejected = 0
        self.dropped = 0       # events given up on (stopped while retrying, or a 4xx)
        self.requests = 0      # requests answered 200
        self.errors = 0        # failed requests: connection errors and non-200 answers
        self.by_stream: dict[str, int] = {}
        self.table_rows: dict[str, int] = {}  # rows per table the service accepted (upserts)
        self._started = 0.0
        self._down = False
        self._reported: set[str] = set()
        self._announced: set[str] = set()  # tables whose initial load was reported
        self._spike_phase = [_BEFORE] * len(traffic.spikes)
        self.pg_tables = pg_tables  # set: table rows go into PostgreSQL, not to the API

    def summary(self) -> dict[str, Any]:
        seconds = time.monotonic() - self._started if self._started else 0.0
        return {
            "sent": self.sent,
            "accepted": self.accepted,
            "rejected": self.rejected,
            "dropped": self.dropped,
            "requests": self.requests,
            "errors": self.errors,
            "seconds": round(seconds, 3),
            "events_per_s": round(self.sent / seconds, 1) if seconds > 0 else 0.0,
            "by_stream": dict(self.by_stream),
            "table_rows": dict(self.table_rows),
        }

    def run(self, duration_s: float | None = None, stop: threading.Event | None = None) -> dict[str, Any]:
        """Send until duration_s has passed or stop is set; return summary()."""
        stop = stop or threading.Event()
        self._started = last = time.monotonic()
        deadline = None if duration_s is None else self._started + duration_s
        progress_at, progress_sent = self._started + self.progress_every_s, 0
        owed = 0.0  # fractional events carried between ticks, so low rates still send
        with httpx.Client(base_url=self.base_url, timeout=10.0, headers=self.headers) as client:
            while not stop.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                owed += self.rate * self.traffic.rate_at(self.traffic.clock()) * min(now - last, self.MAX_CATCHUP_S)
                last = now
                n, owed = int(owed), owed - int(owed)
                self.report_spikes(self.traffic.clock())  # before sending: the line precedes the slow events
                # Table rows first (all users at the first tick): events are enriched as of their time.
                self.send_tables(client, stop, deadline)
                if n:
                    for stream, events in self.traffic.generate(n).items():
                        for i in range(0, len(events), self.batch_max):
                            self._post(client, stream, events[i : i + self.batch_max], stop, deadline)
                now = time.monotonic()
                if now >= progress_at:
                    period = now - progress_at + self.progress_every_s
                    print(
                        f"demo: sent {self.sent} events ({(self.sent - progress_sent) / period:.0f}/s over last period),"
                        f" rejected {self.rejected}, errors {self.errors}",
                        file=self.out, flush=True,
                    )
                    progress_at, progress_sent = now + self.progress_every_s, self.sent
                stop.wait(max(0.0, last + self.TICK_S - time.monotonic()))
        return self.summary()

    def send_tables(self, client: httpx.Client | None, stop: threading.Event, deadline: float | None) -> None:
        """The table rows due by the traffic's clock: POSTed, or written into PostgreSQL
        (`pg_tables`, demo/pg_tables.py), where change data capture takes them to the service."""
        for table, rows in self.traffic.table_changes().items():
            first, self._announced = table not in self._announced, self._announced | {table}
            # Only the tables PostgreSQL feeds (not one with a source of its own) go there.
            in_postgres = self.pg_tables is not None and table in self.pg_tables.tables
            if first and not in_postgres:
                held = self._service_keys(client, table)
                key = self.traffic.catalog.streams[table].key_field
                missing = [row for row in rows if str(row[key]) not in held]
                if not missing:
                    # A second producer (a spike beside `make run`) or a restart on the same data: the
                    # rows are there already. Loading every user again would only make the pipeline
                    # spend a batch of ~50 000 upserts on them, seconds in which no event is aggregated.
                    self._say(f"demo: table {table}: the service holds its rows already; only changes follow")
                    continue
                if len(missing) < len(rows):
                    # An initial load stopped part way (Ctrl-C during a first `make run`): only the keys
                    # the service lacks. Every row again would put this run's initial plans over the
                    # changes an earlier run made since.
                    self._say(f"demo: table {table}: the service holds {len(rows) - len(missing)} of its"
                              f" {len(rows)} rows; loading the {len(missing)} missing")
                rows = missing
            if in_postgres:
                self._write_rows(table, rows, stop, deadline)
            else:
                for i in range(0, len(rows), self.batch_max):
                    self._post(client, table, rows[i : i + self.batch_max], stop, deadline, table=True)
            if first:
                where = " into PostgreSQL (the service follows it by CDC)" if in_postgres else ""
                self._say(f"demo: table {table}: {self.table_rows.get(table, 0)} rows loaded{where};"
                          " changes follow every few seconds")

    def _service_keys(self, client: httpx.Client | None, table: str) -> set[str]:
        """The keys GET /api/v1/tables/{table} answers, every page of them. Unreachable, not allowed
        (a token without the read scope) or anything but 200: none (load the table as on a new service)."""
        keys: set[str] = set()
        if client is None:
            return keys
        cursor = ""
        try:
            while True:
                resp = client.get(f"{TABLES_PATH}/{table}", params={"limit": self.TABLE_PAGE, "cursor": cursor})
                if resp.status_code != 200:
                    return set()
                page = resp.json()
                keys.update(str(row["key"]) for row in page.get("rows") or [])
                cursor = page.get("next_cursor")
                if not cursor:
                    return keys
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return set()

    def _write_rows(self, table: str, rows: list[dict], stop: threading.Event, deadline: float | None) -> None:
        """One transaction of upserts, retried with back-off while the database is unreachable."""
        backoff = self.BACKOFF_START_S
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            try:
                self.table_rows[table] = self.table_rows.get(table, 0) + self.pg_tables.write(table, rows)
                return
            except psycopg.OperationalError as exc:
                self.errors += 1
                self._say_once(f"demo: table {table}: cannot write to PostgreSQL ({exc}); retrying")
                stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_MAX_S)
        self.dropped += len(rows)

    def report_spikes(self, now_s: float) -> None:
        """Say when a latency spike starts and ends (run() calls this every tick).

        Judged by the traffic's clock, the one event times come from, so the lines match the
        window the metrics see (give or take the ~2 s of event-time jitter).
        """
        now_ms = round(now_s * 1000)
        for i, spike in enumerate(self.traffic.spikes):
            start_ms, end_ms = spike.window_ms(self.traffic.started_s)
            phase = _AFTER if now_ms >= end_ms else _DURING if now_ms >= start_ms else _BEFORE
            if self._spike_phase[i] == _BEFORE and phase != _BEFORE:
                self._say(f"demo: latency spike started: {spike.endpoint} x{spike.factor:g} for {spike.duration_s:g} s")
            if self._spike_phase[i] != _AFTER and phase == _AFTER:
                self._say(f"demo: latency spike ended: {spike.endpoint}")
            self._spike_phase[i] = phase

    def _post(
        self, client: httpx.Client, stream: str, events: list[dict],
        stop: threading.Event, deadline: float | None, table: bool = False,
    ) -> None:
        body = json.dumps(events, separators=(",", ":")).encode()
        # Every try of this body carries one key: a retry after a timeout whose first try did
        # reach the log is answered from the service's record instead of appended twice.
        headers = {"content-type": "application/json", "idempotency-key": uuid.uuid4().hex}
        backoff = self.BACKOFF_START_S
        while True:
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                self.dropped += len(events)
                return
            try:
                if table:
                    resp = client.post(f"{TABLES_PATH}/{stream}", content=body, headers=headers)
                else:
                    resp = client.post(INGEST_PATH, params={"stream": stream}, content=body, headers=headers)
            except httpx.TransportError as exc:
                # Connection refused while the service starts, or a timeout: wait and retry.
                self.errors += 1
                if not self._down:
                    self._down = True
                    self._say(f"demo: cannot reach {self.base_url} ({type(exc).__name__}); retrying")
                stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_MAX_S)
                continue
            if self._down:
                self._down = False
                self._say(f"demo: connected to {self.base_url}")
            if resp.status_code == 200:
                if table:
                    self._count_rows(stream, events, resp)
                else:
                    self._count(stream, events, resp)
                return
            self.errors += 1
            if resp.status_code == 413 and len(events) > 1:
                half = len(events) // 2  # body over the limit: send it in halves
                self._post(client, stream, events[:half], stop, deadline, table)
                self._post(client, stream, events[half:], stop, deadline, table)
                return
            if resp.status_code in self.RETRY_STATUSES:
                stop.wait(backoff)
                backoff = min(backoff * 2, self.BACKOFF_MAX_S)
                continue
            # Another 4xx/5xx will not get better by resending the same body: report, drop.
            self.dropped += len(events)
            self._say_once(f"demo: {stream}: HTTP {resp.status_code}: {_detail(resp)}")
            return

    def _count(self, stream: str, events: list[dict], resp: httpx.Response) -> None:
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        rejected = answer.get("rejected") if isinstance(answer, dict) else None
        rejected = rejected if isinstance(rejected, list) else []
        accepted = answer.get("accepted") if isinstance(answer, dict) else None
        accepted = accepted if isinstance(accepted, int) else len(events) - len(rejected)
        self.requests += 1
        self.sent += len(events)
        self.accepted += accepted
        self.rejected += len(rejected)
        self.by_stream[stream] = self.by_stream.get(stream, 0) + accepted
        for item in rejected[:1]:  # the first reason of a kind tells what is wrong
            reason = item.get("reason") if isinstance(item, dict) else item
            self._say_once(f"demo: {stream}: event rejected: {reason}")

    def _count_rows(self, table: str, rows: list[dict], resp: httpx.Response) -> None:
        # Not in `sent`/`accepted` (those count events): a table's rows are changes of its state.
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        rejected = answer.get("rejected") if isinstance(answer.get("rejected"), list) else []
        upserts = answer.get("upserts") if isinstance(answer.get("upserts"), int) else len(rows) - len(rejected)
        self.requests += 1
        self.table_rows[table] = self.table_rows.get(table, 0) + upserts
        for item in rejected[:1]:
            reason = item.get("reason") if isinstance(item, dict) else item
            self._say_once(f"demo: table {table}: row rejected: {reason}")

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _say_once(self, line: str) -> None:
        # Bounded, so a broken schema does not flood the terminal.
        if line not in self._reported and len(self._reported) < 20:
            self._reported.add(line)
            self._say(line)


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200]
    return str(body.get("detail", body) if isinstance(body, dict) else body)[:200]
