"""DemoTraffic: a pure generator of demo events (seeded RNG, injected clock, no I/O), so its
shape can be tested: skewed endpoint popularity, one slow endpoint with a heavy tail, lognormal
latencies, now-and-then error bursts on one endpoint, a daily rate shape with short spikes,
Zipf-skewed users and slightly out-of-order event times, plus the stragglers and spikes asked for."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Collection, Sequence

import numpy as np

from catalog import Catalog, StreamDef
from catalog.tables import row_columns
from demo.shapes import (
    BURST_MAX,
    BURST_MIN,
    BURST_PROBABILITY,
    BURST_SLOT_S,
    COUNTRIES,
    CUSTOMER_POPULATION,
    DAILY_MAX,
    DAILY_MIN,
    ENDPOINTS,
    EP_SHARES,
    ERROR_MAX_S,
    ERROR_MIN_S,
    ERROR_PROBABILITY,
    ERROR_SHARE,
    ERROR_SLOT_S,
    FAILABLE,
    MAX_JITTER_MS,
    MOBILE_RATIO,
    ORDER_RATIO,
    PATHS,
    PAYMENT_METHODS,
    PEAK_HOUR_UTC,
    REGIONS,
    SEARCH_RATIO,
    SLOW,
    USER_POPULATION,
    shares,
    unit,
)
from demo.checkouts import CheckoutFunnel
from demo.devices import DeviceFleet
from demo.logins import LoginTraffic
from demo.plans import PlanTable
from demo.searches import SearchClicks, run_id
from demo.spikes import LatencySpike
from demo.stragglers import BEYOND_HORIZON, DELAYED, FUTURE, LATE, OFFLINE, ON_TIME, Stragglers
from demo.users import UserTable


class DemoTraffic:
    """Seeded generator of demo events; event times come from the injected clock (epoch s)."""

    def __init__(self, catalog: Catalog, *, seed: int = 0, clock: Callable[[], float] = time.time,
                 stragglers: Stragglers | None = None, spikes: Sequence[LatencySpike] = (),
                 users: int = USER_POPULATION):
        if users < 1:
            raise ValueError(f"the demo needs at least one user, not {users}")
        self.catalog = catalog
        self.seed = seed
        self.clock = clock
        self.stragglers = stragglers or Stragglers.none()
        self.spikes = tuple(spikes)
        self.started_s = clock()  # what LatencySpike.start_s counts from
        self.last_kinds: list[str] = []  # per event of the last generate_stream(): ON_TIME, DELAYED, ...
        self._rng = np.random.default_rng(seed)
        # Zipf ranks map to ids through a fixed permutation, so the heavy users are not
        # simply u00001, u00002, ... (ids look arbitrary, as real ones do).
        # `users`: the shop's user population (the `users` table's rows); fewer keep a test's table
        # load small, more make the distinct counts and the table larger.
        ids = np.random.default_rng([seed, 1]).permutation(max(users, CUSTOMER_POPULATION))
        self._user_ids = [f"u{i:05d}" for i in ids[:users]]
        self._customer_ids = [f"c{i:05d}" for i in ids[:CUSTOMER_POPULATION]]
        self.fleet = DeviceFleet(seed)  # the mobile app's devices and their clocks
        self.search_clicks = self._search_model(catalog, seed)  # searches and the clicks on their results
        # The `users` table's rows and plan changes (demo/users.py), when the catalog declares it.
        self.user_table = UserTable(seed, self._user_ids) if self._has_user_table(catalog) else None
        # The `plans` table (demo/plans.py): a handful of rows, changing every few minutes.
        self.plan_table = PlanTable(seed) if self._has_plan_table(catalog) else None
        self._tables_started = False
        # Logins with credential-stuffing bursts and the checkout funnel (demo/logins.py,
        # demo/checkouts.py), for the demo's patterns: a few events per second of the clock.
        started_ms = round(self.started_s * 1000)
        self.login_traffic = (LoginTraffic(seed, self._user_ids, started_ms, run=run_id(seed, started_ms))
                              if self._has_fields(catalog, "logins", {"user_id", "ip", "outcome"}) else None)
        self.checkout_funnel = (CheckoutFunnel(seed, self._customer_ids, started_ms, run=run_id(seed, started_ms))
                                if self._has_fields(catalog, "checkouts", {"checkout_id", "stage"}) else None)

    # -- rate shape ---------------------------------------------------------------------

    def rate_at(self, t: float) -> float:
        """Traffic multiplier at epoch second t, in [RATE_MIN, RATE_MAX]; deterministic per seed.

        A daily sinusoid over the UTC hour (DAILY_MIN at night, DAILY_MAX mid-afternoon)
        times an occasional short burst (x2..x3 for one BURST_SLOT_S slot).
        """
        hour = (t % 86_400.0) / 3_600.0
        mid, amp = (DAILY_MAX + DAILY_MIN) / 2, (DAILY_MAX - DAILY_MIN) / 2
        daily = mid + amp * math.cos(2 * math.pi * (hour - PEAK_HOUR_UTC) / 24.0)
        slot = math.floor(t / BURST_SLOT_S)
        if unit(self.seed, "burst", slot) < BURST_PROBABILITY:
            daily *= BURST_MIN + (BURST_MAX - BURST_MIN) * unit(self.seed, "burst-size", slot)
        return daily

    def error_burst_at(self, t: float) -> str | None:
        """The endpoint failing at epoch second t, or None when there is no error burst."""
        slot = math.floor(t / ERROR_SLOT_S)
        if unit(self.seed, "errors", slot) >= ERROR_PROBABILITY:
            return None
        length = ERROR_MIN_S + (ERROR_MAX_S - ERROR_MIN_S) * unit(self.seed, "errors-len", slot)
        start = slot * ERROR_SLOT_S + (ERROR_SLOT_S - length) * unit(self.seed, "errors-start", slot)
        if not start <= t < start + length:
            return None
        pick = int(unit(self.seed, "errors-endpoint", slot) * len(FAILABLE))
        return ENDPOINTS[FAILABLE[pick]].path

    # -- events -------------------------------------------------------------------------

    def generate(self, n: int, skip: Collection[str] = ()) -> dict[str, list[dict]]:
        """Events per stream for n HTTP requests' worth of traffic, but none of the streams in `skip`
        (a load generator drawing the requests in several threads draws the rest in one: one
        device fleet, one search model, as one demo has).

        http_requests gets n events, orders ~ORDER_RATIO * n, mobile_app ~MOBILE_RATIO * n (plus
        the offline backlogs that come back), searches ~SEARCH_RATIO * n, clicks those on earlier
        searches' results that are due by now (see generate_stream), logins and checkouts those of
        the clock time since the last call (a few per second, whatever n), and any other stream in
        the catalog n generic events.
        """
        out: dict[str, list[dict]] = {}
        ratios = {"orders": ORDER_RATIO, "mobile_app": MOBILE_RATIO}
        for name in self.catalog.streams:
            if self.catalog.streams[name].derived_from:  # e.g. <stream>_sessions: made by the pipeline
                continue
            if self.catalog.streams[name].kind == "table":  # rows, not events: table_changes()
                continue
            if name in skip:
                continue
            if name == "searches":  # its own RNG: the other streams' draws are what they were before it
                count = self.search_clicks.count(n, SEARCH_RATIO)
            elif self._by_clock(name):  # drawn by the clock, not per request: n is not used
                count = 0
            else:
                count = int(self._rng.binomial(n, ratios[name])) if name in ratios else n
            out[name] = self.generate_stream(name, count)
        return out

    def table_changes(self) -> dict[str, list[dict]]:
        """Rows per table to post (POST /api/v1/tables/{name}) by the clock: on the first call every
        user's row (the initial load) and every plan's, then the plan changes and sign-ups due since
        the last call, and the plans' rare changes."""
        if self.user_table is None and self.plan_table is None:
            return {}
        now_ms = int(self.clock() * 1000)
        first, self._tables_started = not self._tables_started, True
        out = {}
        for name, table in (("users", self.user_table), ("plans", self.plan_table)):
            if table is None:
                continue
            rows = table.initial(now_ms) if first else table.due(now_ms)
            fields = set(self._table_fields(self.catalog.streams[name]))
            if rows:
                out[name] = [{k: v for k, v in row.items() if k in fields} for row in rows]
        return out

    @staticmethod
    def _has_fields(catalog: Catalog, name: str, fields: set[str]) -> bool:
        # Another configuration's stream of that name, without these fields, gets generic events.
        stream = catalog.streams.get(name)
        return stream is not None and stream.kind != "table" and fields <= set(stream.string_fields)

    def _by_clock(self, name: str) -> bool:
        return (name == "logins" and self.login_traffic is not None) or (
            name == "checkouts" and self.checkout_funnel is not None)

    @staticmethod
    def _has_user_table(catalog: Catalog) -> bool:
        # Another configuration's `users` (not a table, or keyed otherwise) gets no rows from the demo.
        users = catalog.streams.get("users")
        return users is not None and users.kind == "table" and users.key_field == "user_id"

    @staticmethod
    def _has_plan_table(catalog: Catalog) -> bool:
        plans = catalog.streams.get("plans")
        return plans is not None and plans.kind == "table" and plans.key_field == "plan_id"

    @staticmethod
    def _table_fields(table: StreamDef) -> tuple[str, ...]:
        dimensions, values = row_columns(table)  # without the implicit `op`, which Sketchboard sets
        return (table.time_field, table.key_field or "", *dimensions, *values)

    def generate_stream(self, name: str, n: int) -> list[dict]:
        """n events for one stream, with exactly its declared fields.

        Except `clicks` when it declares a `search_id` (the demo's): n is ignored, and the clicks
        on the results of searches drawn earlier (generate_stream("searches", ...)) whose send
        time has come by the clock are returned, possibly none (demo/searches.py). And `logins` and
        `checkouts` when they declare the demo's fields: n is ignored, and the events of the clock
        time since the last call are returned (demo/logins.py, demo/checkouts.py).
        """
        stream = self.catalog.stream(name)
        if name == "clicks" and self._clicks_follow_searches(stream):
            return self._due_clicks(stream)
        if self._by_clock(name):
            return self._due_by_clock(name, stream)
        if n <= 0:
            return []
        now_ms = int(self.clock() * 1000)
        strings: dict[str, list[str]] = {}
        numbers: dict[str, list[float] | list[int]] = {}
        times = sent = None
        if name == "http_requests":
            self._http_requests(n, now_ms / 1000.0, strings, numbers)
        elif name == "orders":
            self._orders(n, strings, numbers)
        elif name == "searches":
            drawn = self.search_clicks.searches(n, now_ms)
            strings, numbers, times = drawn.strings, drawn.numbers, drawn.time_ms
        elif name == "mobile_app":
            # Times by each device's own clock, and backlogs sent after hours offline (demo/devices.py).
            drawn = self.fleet.events(n, now_ms)
            strings, numbers, times, sent, n = drawn.strings, drawn.numbers, drawn.time_ms, drawn.sent_ms, len(drawn.device)
        events = self._assemble(stream, n, now_ms, strings, numbers, times=times, sent=sent)
        if name == "mobile_app":
            self.last_kinds = [OFFLINE if o else ON_TIME for o in drawn.offline]
        elif name == "searches":
            self.last_kinds = [ON_TIME] * n
        if name == "http_requests" and self.spikes:
            self._apply_spikes(stream, events)
        return events

    def _search_model(self, catalog: Catalog, seed: int) -> SearchClicks:
        clicks = catalog.streams.get("clicks")
        lateness, pane = (clicks.allowed_lateness, clicks.pane) if clicks else (60_000, 10_000)
        # Search ids carry a tag of (seed, start time): a restarted demo sends new ids. Buffered
        # clicks follow demo.stragglers' rule for events sent after their pane is final.
        return SearchClicks(seed, run=run_id(seed, round(self.started_s * 1000)), users=self._user_ids,
                            late_after_ms=lateness + pane + 1_000, late_spread_ms=lateness)

    @staticmethod
    def _clicks_follow_searches(stream: StreamDef) -> bool:
        # A `clicks` stream of another configuration, without a search id, gets generic events.
        return "search_id" in stream.string_fields

    def _due_clicks(self, stream: StreamDef) -> list[dict]:
        now_ms = int(self.clock() * 1000)
        drawn = self.search_clicks.due_clicks(now_ms)
        self.last_kinds = drawn.kinds  # CLICK_ON_TIME, CLICK_LATE, CLICK_UNKNOWN
        if not drawn.time_ms:
            return []
        return self._assemble(stream, len(drawn.time_ms), now_ms, drawn.strings, drawn.numbers, times=drawn.time_ms)

    def _due_by_clock(self, name: str, stream: StreamDef) -> list[dict]:
        now_ms = int(self.clock() * 1000)
        factor = self.rate_at(now_ms / 1000.0)  # the daily shape and the rate bursts, as for requests
        drawn = (self.login_traffic.due(now_ms, factor) if name == "logins"
                 else self.checkout_funnel.due(now_ms, factor))
        self.last_kinds = [ON_TIME] * len(drawn.time_ms)
        if not drawn.time_ms:
            return []
        numbers = getattr(drawn, "numbers", {})
        return self._assemble(stream, len(drawn.time_ms), now_ms, drawn.strings, numbers, times=drawn.time_ms)

    def _apply_spikes(self, stream: StreamDef, events: list[dict]) -> None:
        # Applied to the assembled events, once their event times are known (stragglers
        # included), and without drawing from the RNG: every other field, and every event
        # outside a window, is exactly what the same seed gives without spikes.
        if not {"endpoint", "latency_ms"} <= {*stream.string_fields, *stream.values}:
            return  # a config whose http_requests lacks these fields has nothing to slow down
        for spike in self.spikes:
            start_ms, end_ms = spike.window_ms(self.started_s)
            for event in events:
                if event["endpoint"] == spike.endpoint and start_ms <= event[stream.time_field] < end_ms:
                    # The generator's floor of 0.1 ms still holds for a factor below 1.
                    event["latency_ms"] = max(round(event["latency_ms"] * spike.factor, 2), 0.1)

    def _times(self, n: int, now_ms: int, stream: StreamDef | None = None) -> list[int]:
        # Mostly a few hundred ms behind the clock, never more than MAX_JITTER_MS; the
        # random jitter is what puts events out of order.
        rng = self._rng
        jitter = np.minimum(rng.exponential(400.0, n), MAX_JITTER_MS)
        times = now_ms - jitter.astype(np.int64)
        s = self.stragglers
        kinds = np.full(n, ON_TIME, dtype=object)
        if stream is not None and (s.delayed_fraction or s.late_fraction or s.horizon_fraction or s.future_fraction):
            u = rng.random(n)
            edges = np.cumsum([s.future_fraction, s.horizon_fraction, s.late_fraction, s.delayed_fraction])
            spread = rng.integers(60_000, 86_400_000, n)  # 1 min .. 1 day past a boundary
            late = stream.allowed_lateness + stream.pane + 1_000 + rng.exponential(max(stream.allowed_lateness, 1), n)
            delayed = rng.exponential(s.delay_mean_s * 1000.0, n)
            for kind, lo, hi, t in (
                (FUTURE, 0.0, edges[0], now_ms + stream.max_future_skew + spread),
                (BEYOND_HORIZON, edges[0], edges[1], now_ms - stream.retention - spread),
                (LATE, edges[1], edges[2], now_ms - late.astype(np.int64)),
                (DELAYED, edges[2], edges[3], now_ms - delayed.astype(np.int64)),
            ):
                pick = (u >= lo) & (u < hi)
                times = np.where(pick, t, times)
                kinds[pick] = kind
        self.last_kinds = kinds.tolist()
        return times.tolist()

    def _zipf_ids(self, n: int, ids: list[str], a: float) -> list[str]:
        # numpy's zipf is unbounded; ranks past the population wrap around, which adds a
        # broad base of occasional users under the heavy head.
        ranks = (self._rng.zipf(a, n) - 1) % len(ids)
        return [ids[r] for r in ranks.tolist()]

    def _http_requests(self, n: int, now_s: float, strings: dict, numbers: dict) -> None:
        rng = self._rng
        ep = rng.choice(len(ENDPOINTS), size=n, p=EP_SHARES)
        region = rng.choice(len(REGIONS), size=n, p=shares(REGIONS))

        median = np.array([e.latency_ms for e in ENDPOINTS])[ep] * np.array([r[2] for r in REGIONS])[region]
        sigma = np.array([e.sigma for e in ENDPOINTS])[ep]
        latency = median * np.exp(sigma * rng.standard_normal(n))
        # Heavy tail: some searches hit a cold index, and anything can stall now and then.
        latency = np.where((ep == SLOW) & (rng.random(n) < 0.04), latency * rng.lognormal(math.log(6.0), 0.5, n), latency)
        latency = np.where(rng.random(n) < 0.005, latency * 4.0, latency)

        size = np.array([e.bytes_median for e in ENDPOINTS])[ep] * rng.lognormal(0.0, 0.35, n)

        u = rng.random(n)
        p302 = np.array([e.p302 for e in ENDPOINTS])[ep]
        p404 = np.array([e.p404 for e in ENDPOINTS])[ep]
        status = np.full(n, 200)
        status = np.where(u < 0.002, 500, np.where(u < 0.002 + p302, 302, np.where(u < 0.002 + p302 + p404, 404, status)))
        failing = self.error_burst_at(now_s)
        if failing is not None:
            hit = (ep == PATHS.index(failing)) & (rng.random(n) < ERROR_SHARE)
            status = np.where(hit, np.where(rng.random(n) < 0.6, 500, 503), status)
        # Errors and redirects are small; 503s are shed fast, 500s often after a timeout.
        size = np.where(status == 200, size, np.where(status == 404, 350.0, np.where(status == 302, 0.0, 220.0)))
        latency = np.where(status == 503, 3.0 * rng.lognormal(0.0, 0.3, n), latency)
        latency = np.where((status == 500) & (rng.random(n) < 0.5), latency * 8.0, latency)
        latency = np.where((status == 404) | (status == 302), latency * 0.4, latency)

        method = [""] * n
        for i, e in enumerate(ENDPOINTS):
            idx = np.flatnonzero(ep == i)
            if len(e.methods) == 1:
                for j in idx.tolist():
                    method[j] = e.methods[0][0]
            else:
                picks = rng.choice(len(e.methods), size=len(idx), p=shares(e.methods))
                for j, m in zip(idx.tolist(), picks.tolist()):
                    method[j] = e.methods[m][0]

        strings["endpoint"] = [ENDPOINTS[i].path for i in ep.tolist()]
        strings["method"] = method
        strings["status"] = [str(s) for s in status.tolist()]
        strings["region"] = [REGIONS[i][0] for i in region.tolist()]
        strings["user_id"] = self._zipf_ids(n, self._user_ids, 1.1)
        numbers["latency_ms"] = np.round(np.maximum(latency, 0.1), 2).tolist()
        numbers["response_bytes"] = np.round(size).astype(np.int64).tolist()

    def _orders(self, n: int, strings: dict, numbers: dict) -> None:
        rng = self._rng
        # Most baskets hold one or two items; at most 8.
        items = np.minimum(rng.geometric(0.45, n), 8)
        unit_price = rng.lognormal(math.log(22.0), 0.6, n)
        amount = items * unit_price
        amount = np.where(amount < 50.0, amount + 4.99, amount)  # shipping on small orders
        strings["country"] = [COUNTRIES[i][0] for i in rng.choice(len(COUNTRIES), size=n, p=shares(COUNTRIES)).tolist()]
        strings["payment_method"] = [
            PAYMENT_METHODS[i][0] for i in rng.choice(len(PAYMENT_METHODS), size=n, p=shares(PAYMENT_METHODS)).tolist()
        ]
        strings["customer_id"] = self._zipf_ids(n, self._customer_ids, 1.1)
        numbers["amount"] = np.round(amount, 2).tolist()
        numbers["items"] = items.astype(np.int64).tolist()

    def _generic_strings(self, field: str, n: int, keyed: bool) -> list[str]:
        if keyed:  # keys and distinct fields: a large skewed population
            ranks = (self._rng.zipf(1.2, n) - 1) % 10_000
            return [f"{field}_{r}" for r in ranks.tolist()]
        vocab = [f"{field}_{i}" for i in range(1, 7)]  # dimensions: a small vocabulary
        picks = self._rng.choice(len(vocab), size=n, p=shares(tuple((v, 1.0 / (i + 1)) for i, v in enumerate(vocab))))
        return [vocab[i] for i in picks.tolist()]

    def _assemble(self, stream: StreamDef, n: int, now_ms: int, strings: dict, numbers: dict, *,
                  times: list[int] | None = None, sent: list[int] | None = None) -> list[dict]:
        # Take the domain columns the stream declares (with the right kind), fill anything
        # else it declares generically, and drop what it does not declare: the events
        # carry exactly the stream's fields even if the config changes.
        columns: dict[str, list] = {stream.time_field: times if times is not None else self._times(n, now_ms, stream)}
        if stream.sent_time_field:  # by the device's clock; a stream without a device model: sent as it happens
            columns[stream.sent_time_field] = sent if sent is not None else list(columns[stream.time_field])
        if stream.event_id_field:
            # Unique per event, across runs and producers too (a random prefix per call, outside the
            # seeded RNG, so every other field is still what the seed gives): a retry sends the same.
            prefix = uuid.uuid4().hex[:16]
            columns[stream.event_id_field] = [f"{prefix}-{i}" for i in range(n)]
        keyed = set(stream.distinct_fields) | ({stream.key_field} if stream.key_field else set())
        enriched = set(stream.enriched_dimensions)  # set by the pipeline's lookup, not sent
        for field in stream.string_fields:
            if field not in columns and field not in enriched:
                columns[field] = strings.get(field) or self._generic_strings(field, n, field in keyed)
        for field in stream.values:
            if field not in columns:
                columns[field] = numbers.get(field) or np.round(self._rng.lognormal(math.log(50.0), 1.0, n), 3).tolist()
        names = list(columns)
        return [dict(zip(names, row)) for row in zip(*columns.values())]
