"""The websocket hub: one tailer thread follows the store's change feed and the watermarks,
recomputes only the points that changed for each distinct subscription shape (computed once,
shared by every client with that shape), polls the broadcast feeds, and hands messages to
the clients' bounded queues on the event loop.

Per client, a bounded queue (`queue_size` messages): when it is full, points messages are
coalesced per subscription (the newer point wins) and topic messages dropped; the client is
then told `{"type": "dropped", "count": n}`. Points are never dropped (past the bound each
subscription keeps one merged entry), nor are snapshots and replies: a client with more of
those waiting than queue_size + max_subscriptions is closed (1008). Memory per client is
therefore bounded by that many messages plus one points map per subscription, whatever the
client's speed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from api.ws_compute import ALL_GROUPS, affected_windows, changed_points, group_marks, snapshot_result
from api.ws_protocol import TOPICS, error
from api.ws_workers import SnapshotWorkers
from query import Query
from store import PaneStore
from store.point_cache import PointCache
from store.retention_clock import retention_now_ms
from store.switch import SWITCHED_REVISION

log = logging.getLogger("sketchboard.ws")


class Feed(Protocol):
    """A broadcast topic: poll() returns the messages new since its previous call."""

    topic: str

    def poll(self) -> list[dict]: ...


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str)


# -- what a client's queue holds -----------------------------------------------------------


@dataclass
class Subscription:
    id: str
    query: Query
    token: int  # distinguishes a re-subscription under the same id
    ready: bool = False  # its snapshot is queued: points may follow
    # The query as the client asked it (api.ws_protocol.QueryIn): resolved again when a switch
    # changes its stream's served definition (Hub._reloads); None: `query` is kept as it is.
    request: Any = None


class PointsBatch:
    """Changed points of one subscription shape in one tick; shared by all its subscribers,
    encoded to JSON once."""

    __slots__ = ("series", "extra", "_tail")

    def __init__(self, series: list[dict], extra: dict):
        self.series = series
        self.extra = extra  # start, end, watermark_ms
        self._tail: str | None = None

    def tail(self) -> str:
        if self._tail is None:
            self._tail = _dumps({"series": self.series, **self.extra})[1:]
        return self._tail

    def merged(self, newer: PointsBatch) -> PointsBatch:
        """Coalesce: this batch's points overridden by newer ones (by stat, group, t)."""
        table: dict[tuple, dict] = {}
        for batch in (self, newer):
            for s in batch.series:
                key = (s["stat"], tuple(sorted(s["group"].items())))
                entry = table.setdefault(key, {"stat": s["stat"], "group": s["group"], "points": {}})
                for p in s["points"]:
                    entry["points"][p["t"]] = p
        series = [{**e, "points": [e["points"][t] for t in sorted(e["points"])]} for e in table.values()]
        return PointsBatch(series, dict(newer.extra))


@dataclass
class QueuedPoints:
    sub: Subscription
    batch: PointsBatch

    def text(self) -> str:
        return '{"type":"points","id":' + _dumps(self.sub.id) + "," + self.batch.tail()


@dataclass
class QueuedMessage:
    msg: dict
    droppable: bool  # topic messages and heartbeats may be dropped when the client is slow
    encoded: str | None = None
    # The subscription a message belongs to (a `switched` reload): it waits for that subscription's
    # snapshot, and is dropped with it when it ends.
    sub: Subscription | None = None
    # The subscription this message ends (a switch left its query unresolvable): nothing queued
    # for it is sent after the message is delivered.
    ends: Subscription | None = None

    def text(self) -> str:
        return self.encoded if self.encoded is not None else _dumps(self.msg)


class QueueClosed(Exception):
    """The client's queue was closed (`reason`): its connection is to be closed (1008)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ClientQueue:
    """A client's outgoing messages. Used on the event loop thread only.

    At `bound` messages, points are merged per subscription and topic messages dropped (both
    counted in `dropped`). Points are never dropped: past the bound a subscription's points merge
    into those it has queued, or are queued as its one entry (so up to one per subscription beyond
    the bound). Replies and snapshots are never dropped either: a client holding more than
    `bound + headroom` of them is closed (QueueClosed from get()) rather than silently missing one."""

    def __init__(self, bound: int, headroom: int = 0):
        self.bound = bound
        self.limit = bound + headroom  # the most messages other than points it holds
        self.closed: str | None = None  # why the connection is to be closed
        self.items: deque[QueuedPoints | QueuedMessage] = deque()
        # sub token -> what waits for its snapshot: points (merged), or a reload and the points after it
        self.pending: dict[int, list[QueuedPoints | QueuedMessage]] = {}
        self.dropped = 0  # not yet reported to the client
        self.dropped_total = 0
        self.high_water = 0
        self._wakeup = asyncio.Event()

    def put(self, item: QueuedPoints | QueuedMessage) -> None:
        if self.closed is not None:
            return
        if item.sub is not None and not item.sub.ready:
            self._hold(item)
            return
        if len(self.items) >= self.bound:
            points_at, others = self._compact()
            if len(self.items) >= self.bound:
                if isinstance(item, QueuedPoints):
                    at = points_at.get(item.sub.token)
                    if at is not None:  # merged into its subscription's queued points
                        self.items[at] = QueuedPoints(item.sub, self.items[at].batch.merged(item.batch))
                        self._count_dropped(1)
                        self._wakeup.set()
                        return
                    # else: queued as the subscription's one entry, beyond the bound
                elif item.droppable:
                    self._count_dropped(1)
                    return
                elif others >= self.limit:
                    self.close(f"too slow: {others} messages waiting")
                    return
        self.items.append(item)
        self.high_water = max(self.high_water, len(self.items))
        self._wakeup.set()

    def _compact(self) -> tuple[dict[int, int], int]:
        """Coalesce points per subscription and drop topic messages. A subscription's newer points
        merge into its first points queued since its last reload, never into points queued before
        one: they would reach the client before the reload, which would then overwrite them."""
        kept: deque = deque()
        by_token: dict[int, int] = {}  # sub token -> where its points since its last reload are kept
        removed = 0
        for item in self.items:
            if isinstance(item, QueuedPoints):
                at = by_token.get(item.sub.token)
                if at is not None:
                    first = kept[at]
                    kept[at] = QueuedPoints(first.sub, first.batch.merged(item.batch))
                    removed += 1
                    continue
                by_token[item.sub.token] = len(kept)
            elif item.droppable:
                removed += 1
                continue
            elif item.sub is not None:
                by_token.pop(item.sub.token, None)
            kept.append(item)
        self.items = kept
        self._count_dropped(removed)
        return by_token, len(kept) - sum(isinstance(i, QueuedPoints) for i in kept)

    def close(self, reason: str) -> None:
        """Send nothing more: get() raises QueueClosed(reason), and the connection is closed."""
        if self.closed is None:
            self.closed = reason
            self.items.clear()
            self.pending.clear()
            self._wakeup.set()

    def _count_dropped(self, n: int) -> None:
        self.dropped += n
        self.dropped_total += n

    def _hold(self, item: QueuedPoints | QueuedMessage) -> None:
        held = self.pending.setdefault(item.sub.token, [])
        if isinstance(item, QueuedMessage):
            held[:] = [item]  # a whole new snapshot (a reload): what was held before it is superseded
        elif held and isinstance(held[-1], QueuedPoints):
            held[-1] = QueuedPoints(item.sub, held[-1].batch.merged(item.batch))
        else:
            held.append(item)

    def release(self, sub: Subscription) -> None:
        """The snapshot of `sub` is queued: what was computed for it meanwhile may follow it."""
        sub.ready = True
        for item in self.pending.pop(sub.token, ()):
            self.put(item)

    def forget(self, sub: Subscription) -> None:
        """`sub` ended: nothing queued for it is sent (its points, a reload)."""
        self.pending.pop(sub.token, None)
        self.items = deque(i for i in self.items if i.sub is None or i.sub.token != sub.token)

    async def get(self, timeout: float) -> str | None:
        """The next message's text (a 'dropped' notice first, when due); None after `timeout` idle;
        QueueClosed once the queue was closed."""
        if not self.items and not self.dropped and self.closed is None:
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout)
            except TimeoutError:
                return None
        if self.closed is not None:
            raise QueueClosed(self.closed)
        if self.dropped:
            n, self.dropped = self.dropped, 0
            return _dumps({"type": "dropped", "count": n})
        if not self.items:
            return None
        return self.items.popleft().text()

    def __len__(self) -> int:
        return len(self.items)


class Client:
    """One websocket connection's state in the hub."""

    def __init__(self, queue_size: int, max_subscriptions: int):
        # Beyond its bound, room for a snapshot of each subscription (a slow client subscribing).
        self.queue = ClientQueue(queue_size, headroom=max_subscriptions)
        self.subs: dict[str, Subscription] = {}
        self.topics: set[str] = set(TOPICS)
        self.max_subscriptions = max_subscriptions


# -- the hub -----------------------------------------------------------------------------


# Finished snapshots kept for identical subscriptions still to come (dashboards reopened, 50
# clients on one view). Not every one since the feed last moved: on a quiet store each distinct
# range (a relative one makes a new key every step) stayed, ~115 KB for a day of minutes each.
SNAPSHOTS_KEPT = 32


def _kept_snapshots(snapshots: dict, seq: int | None) -> dict:
    """`snapshots` less those computed before the feed moved (`seq`: they are stale) and the
    oldest finished ones past SNAPSHOTS_KEPT, with room for one more; those still computing are
    always kept, for the identical subscriptions waiting on them."""
    kept = {k: v for k, v in snapshots.items() if v.seq == seq}
    finished = [k for k, v in kept.items() if v.done.is_set()]
    for k in finished[:max(0, len(finished) - SNAPSHOTS_KEPT + 1)]:  # oldest first: dicts keep insertion order
        del kept[k]
    return kept


class _SharedSnapshot:
    """One snapshot computation, awaited by every identical subscription that came meanwhile."""

    def __init__(self, seq: int | None):
        self.seq = seq  # the tailer's change feed position when it started
        self.done = threading.Event()
        self.result: dict | None = None
        self.error: BaseException | None = None
        self._text: str | None = None
        self._lock = threading.Lock()

    def text(self) -> str:
        with self._lock:
            if self._text is None:
                self._text = _dumps(self.result)
            return self._text


class _ShapeState:
    """What the hub keeps of a subscription shape between ticks: the end of its range when last
    pushed (a relative range slides: the windows that entered it since are pushed, holding rows or
    not), and the groups its subscribers were shown (snapshots and points), each with the latest
    window start holding its rows, so a window the watermark passes or that enters the range gets
    a point for each of them, with rows there or not (REST answers every group with rows in the
    range). A group whose rows all slid out of the range is forgotten."""

    __slots__ = ("groups", "lo", "hi", "absent")

    def __init__(self, lo: int, hi: int):
        self.groups: dict[tuple[str, ...], int] = {}
        self.lo = lo
        self.hi = hi
        self.absent = 0  # ticks without a subscriber

    def note(self, marks: dict[tuple[str, ...], int | None], lo: int) -> None:
        for group, last in marks.items():
            held = self.groups.get(group)
            if last is None:  # shown without rows: kept while the range holds the window it was shown at
                last = lo if held is None else held
            self.groups[group] = last if held is None else max(held, last)

    def slide(self, lo: int) -> None:
        if lo > self.lo:
            self.lo = lo
            self.groups = {g: last for g, last in self.groups.items() if last >= lo}


# How long a snapshot waits for a starting tailer to read where the change feed stands (a store
# that does not answer by then is waited on no longer: the snapshot's own read reports it).
TAILER_START_TIMEOUT_S = 10.0


@dataclass
class HubConfig:
    poll_interval_s: float = 0.2
    heartbeat_interval_s: float = 10.0
    queue_size: int = 256
    max_subscriptions: int = 32
    feed_interval_s: float = 0.5
    max_changes_per_tick: int = 50_000
    # With a store that signals commits (PostgreSQL LISTEN/NOTIFY): read the change feed this often
    # even without a notification (a safety net; the signal normally wakes the hub at once).
    fallback_poll_s: float = 5.0
    max_points: int = 11_000
    # Snapshots computed at once (the rest wait their turn): a burst of subscriptions must leave
    # the GIL and the store to REST queries between them. Identical ones are computed once.
    snapshot_concurrency: int = 1
    send_timeout_s: float = 60.0  # a client that accepts nothing for this long is disconnected
    # Messages a client may send: a sustained rate and a burst (a dashboard subscribes to ~10
    # queries at once on connect); past them the connection is closed (1008).
    message_rate: float = 20.0
    message_burst: int = 50
    # The connection's token is checked again this often (the tokens file is re-read at most every
    # second): a revoked one closes the socket (1008).
    token_check_interval_s: float = 0.5


@dataclass
class HubStats:
    ticks: int = 0
    changes: int = 0
    points_messages: int = 0
    last_tick_ms: float = 0.0
    errors: int = 0
    notified: int = 0  # wake-ups by a commit notification (store.change_signal)
    snapshots: int = 0  # snapshots computed (identical subscriptions share one)
    extra: dict = field(default_factory=dict)


class Hub:
    def __init__(self, store: PaneStore, clock: Callable[[], float], config: HubConfig | None = None,
                 feeds: list[Feed] | None = None, point_cache: PointCache | None = None,
                 workers: SnapshotWorkers | None = None,
                 resolve: Callable[[Any, int], Query] | None = None, on_switch: Callable[[], None] | None = None):
        self.store = store
        # A subscription's request resolved against the catalog the served output is built with
        # now (api/ws_routes.py served_query), after a switch changed it; ValueError with the reason
        # when it no longer resolves. `on_switch`: called first, so that catalog is read again
        # (a switch through another replica is otherwise seen only within its refresh interval).
        self.resolve = resolve
        self.on_switch = on_switch
        self.workers = workers  # snapshots computed off this process's GIL (api/ws_workers.py)
        self.point_cache = point_cache  # shared with GET /api/v1/query (store/point_cache.py)
        self.clock = clock
        self.config = config or HubConfig()
        self.feeds: list[Feed] = list(feeds or [])
        self.stats = HubStats()
        self._clients: set[Client] = set()
        self._lock = threading.Lock()  # guards _clients and their subs (event loop <-> tailer)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._token = 0
        self._seq: int | None = None
        # Set once the tailer has read where the change feed stands: a snapshot computed before that
        # could see a commit the tailer then takes as its starting point, and never send.
        self._tailing = threading.Event()
        self._watermarks: dict[str, int] = {}
        self._last_feed_poll = 0.0
        self._signal = None  # the store's commit signal the tailer waits on (None: it polls)
        self._backlog = False  # the last tick stopped at max_changes_per_tick: read on without waiting
        self._snapshots: dict[tuple, _SharedSnapshot] = {}  # computed or computing, shared by identical subscriptions
        self._snapshots_lock = threading.Lock()
        self._snapshot_slots = threading.BoundedSemaphore(max(1, self.config.snapshot_concurrency))
        self._shapes: dict[tuple, _ShapeState] = {}  # shape key -> its state (groups shown)
        self._shapes_lock = threading.Lock()  # snapshot threads <-> tailer

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def listening(self) -> bool:
        """The tailer is woken by the store's commit notifications now (not polling the change feed)."""
        return self._signal is not None and self._signal.listening

    # -- lifecycle (event loop side) --

    def ensure_started(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._loop = asyncio.get_running_loop()
        self._stop.clear()
        self._tailing.clear()
        self._thread = threading.Thread(target=self._run, name="ws-hub-tailer", daemon=True)
        self._thread.start()
        if self.workers is not None:
            self.workers.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None
        if self.workers is not None:
            self.workers.stop()

    def connect(self) -> Client:
        client = Client(self.config.queue_size, self.config.max_subscriptions)
        with self._lock:
            self._clients.add(client)
        return client

    def disconnect(self, client: Client) -> None:
        with self._lock:
            self._clients.discard(client)
            client.subs.clear()

    def subscribe(self, client: Client, sub_id: str, query: Query, request: Any = None) -> Subscription:
        with self._lock:
            old = client.subs.pop(sub_id, None)
            if old is not None:
                client.queue.forget(old)
            if len(client.subs) >= client.max_subscriptions:
                raise ValueError(f"a client may hold at most {client.max_subscriptions} subscriptions")
            self._token += 1
            sub = Subscription(sub_id, query, self._token, request=request)
            client.subs[sub_id] = sub
        return sub

    def unsubscribe(self, client: Client, sub_id: str) -> bool:
        with self._lock:
            sub = client.subs.pop(sub_id, None)
        if sub is not None:
            client.queue.forget(sub)
        return sub is not None

    def snapshot(self, query: Query) -> dict:
        """The subscription's full result now (run it off the event loop: it reads the store)."""
        shared = self._shared_snapshot(query)
        return shared.result if shared.result is not None else json.loads(shared.text())

    def snapshot_message(self, sub_id: str, query: Query) -> QueuedMessage:
        """The snapshot message of a subscription, its result encoded to JSON once for every
        subscription that shares it (50 clients on one view: one computation, one encoding)."""
        shared = self._shared_snapshot(query)
        return QueuedMessage({"type": "snapshot", "id": sub_id, "result": shared.result}, False,
                             '{"type":"snapshot","id":' + _dumps(sub_id) + ',"result":' + shared.text() + "}")

    def _shared_snapshot(self, query: Query) -> _SharedSnapshot:
        """Computed once for identical subscriptions (same shape, range and watermark) while the
        tailer has read no new change: a change the computation did not see is then still ahead of
        the tailer, which sends it to every subscriber registered by then as points. At most
        `snapshot_concurrency` are computed at a time, in the callers' threads."""
        if self._thread is not None:
            self._tailing.wait(TAILER_START_TIMEOUT_S)
        watermark = self.store.watermarks().get(query.stream)
        now_ms = self.now_ms()
        key = (query.shape_key(), query.range_at(now_ms), watermark)
        with self._snapshots_lock:
            seq = self._seq
            shared = self._snapshots.get(key)
            owner = shared is None or seq is None or shared.seq != seq or shared.error is not None
            if owner:
                self._snapshots = _kept_snapshots(self._snapshots, seq)
                shared = self._snapshots[key] = _SharedSnapshot(seq)
        if not owner:
            shared.done.wait()
            if shared.error is None:
                return shared
            return self._shared_snapshot(query)  # its computation failed: try on our own
        try:
            # In a worker process when there is one: the result comes back as its JSON text, ready to send.
            done = None if self.workers is None else self.workers.compute(
                query, now_ms, watermark, self.config.max_points,
                self.point_cache.generation if self.point_cache is not None else 0)
            if done is not None:
                shared._text, marks = done
            else:
                with self._snapshot_slots:
                    shared.result = snapshot_result(self.store, query, now_ms, watermark, self.config.max_points,
                                                    self.point_cache)
                marks = group_marks(query, shared.result["series"])
            self._shown(query, *key[1], marks)
            self.stats.snapshots += 1
        except BaseException as exc:
            shared.error = exc
            raise
        finally:
            shared.done.set()
        return shared

    def _shown(self, query: Query, lo: int, hi: int, marks: dict) -> None:
        """A snapshot or points of this shape, over [lo, hi), showed these groups (group_marks) to
        subscribers."""
        if not (query.group_by or query.relative):
            return
        key = query.shape_key()
        with self._shapes_lock:
            state = self._shapes.get(key)
            if state is None:
                state = self._shapes[key] = _ShapeState(lo, hi)
            state.note(marks, lo)

    @property
    def clients(self) -> int:
        return len(self._clients)

    # -- the tailer thread --

    def _run(self) -> None:
        # On PostgreSQL the store NOTIFYs each commit and one listener per process wakes this thread
        # at once; the change feed is then read when notified (and every fallback_poll_s, in case a
        # notification was lost), while the feeds keep their interval. Without one (SQLite), or while
        # the listener is disconnected, the change feed is read every poll_interval_s.
        try:
            signal = self.store.change_signal()
        except Exception:
            log.exception("websocket hub could not listen for store changes; polling")
            signal = None
        self._signal = signal
        try:
            self._seq = self._last_seq()
            self._watermarks = self.store.watermarks()
        except Exception:
            log.exception("websocket hub could not read the store; retrying")
            self._seq = None
        if self._seq is not None:  # else once read below (snapshots wait for it, up to their timeout)
            self._tailing.set()
        last_read = time.monotonic()
        try:
            while True:
                if signal is None:
                    if self._stop.wait(self.config.poll_interval_s):
                        break
                    read = True
                else:
                    notified = signal.wait(self.config.poll_interval_s)
                    if self._stop.is_set():
                        break
                    self.stats.notified += notified
                    read = (notified or self._backlog or not signal.listening
                            or time.monotonic() - last_read >= self.config.fallback_poll_s)
                try:
                    if self._seq is None:
                        self._seq = self._last_seq()
                        self._watermarks = self.store.watermarks()
                        self._tailing.set()
                    if read:
                        last_read = time.monotonic()
                    self.tick(read_changes=read)
                except Exception:  # keep tailing: one bad tick must not end live updates
                    self.stats.errors += 1
                    log.exception("websocket hub tick failed")
        finally:
            self._signal = None
            if signal is not None:
                signal.close()

    def _last_seq(self) -> int:
        """The change feed's newest seq, found with O(log n) probes of changes_since."""
        lo, step = 0, 1024
        while self.store.changes_since(lo + step, limit=1):
            lo += step
            step *= 2
        hi = lo + step  # no change above hi; is there one above lo?
        if not self.store.changes_since(lo, limit=1):
            return lo
        while hi - lo > 1:  # invariant: a change > lo exists, none > hi
            mid = (lo + hi) // 2
            if self.store.changes_since(mid, limit=1):
                lo = mid
            else:
                hi = mid
        return hi

    def tick(self, read_changes: bool = True) -> None:
        """One pass: read new changes and watermarks (unless told nothing committed), push changed
        points, poll feeds."""
        started = time.perf_counter()
        changed: dict[str, dict[tuple[int, str], None]] = {}
        switched: set[str] = set()
        seq = self._seq or 0
        total = 0
        while read_changes and total < self.config.max_changes_per_tick:
            batch = self.store.changes_since(seq, limit=5000)
            if not batch:
                break
            for c in batch:
                if c.revision == SWITCHED_REVISION:  # the stream's output was switched: reload, not points
                    switched.add(c.stream)
                    continue
                changed.setdefault(c.stream, {})[(c.start_ms, c.dims)] = None
            seq = batch[-1].seq
            total += len(batch)
            if len(batch) < 5000:
                break
        self._seq = seq
        self._backlog = total >= self.config.max_changes_per_tick
        watermarks = self.store.watermarks() if read_changes else self._watermarks
        moved = {s: (self._watermarks.get(s), w) for s, w in watermarks.items() if w != self._watermarks.get(s)}
        self._watermarks = watermarks

        with self._lock:
            subs = [(client, sub) for client in self._clients for sub in client.subs.values()]
        deliveries: list[tuple[Client, QueuedPoints | QueuedMessage]] = []
        if switched:
            deliveries += self._reloads(subs, switched)
            changed = {stream: panes for stream, panes in changed.items() if stream not in switched}
            moved = {stream: move for stream, move in moved.items() if stream not in switched}
        # Changed panes, a moved watermark, or windows that slid into a relative range (each tick).
        deliveries += self._points(subs, changed, moved, watermarks)
        now = time.monotonic()
        if self.feeds and now - self._last_feed_poll >= self.config.feed_interval_s:
            self._last_feed_poll = now
            deliveries += self._broadcasts()
        if deliveries and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._deliver, deliveries)
            except RuntimeError:  # the loop closed: the app is shutting down
                self._stop.set()
        self.stats.ticks += 1
        self.stats.changes += total
        self.stats.last_tick_ms = (time.perf_counter() - started) * 1000

    def _points(self, subs, changed, moved, watermarks):
        dims_cache: dict[str, dict[str, str]] = {}

        def dims_of(text: str) -> dict[str, str]:
            d = dims_cache.get(text)
            if d is None:
                d = dims_cache[text] = json.loads(text)
            return d

        by_shape: dict[tuple, list[tuple[Client, Subscription]]] = {}
        for client, sub in subs:
            by_shape.setdefault(sub.query.shape_key(), []).append((client, sub))
        with self._shapes_lock:  # forget the shapes nobody holds (after two ticks: one may be subscribing)
            for key, state in list(self._shapes.items()):
                state.absent = 0 if key in by_shape else state.absent + 1
                if state.absent > 1:
                    del self._shapes[key]
        now_ms = self.now_ms()
        kept_at = None  # the clock retention is measured at (store/retention_clock.py)
        out = []
        for key, members in by_shape.items():
            rq = members[0][1].query
            state = None
            entered = range(0)
            if rq.group_by or rq.relative:
                lo, hi = rq.range_at(now_ms)
                with self._shapes_lock:
                    state = self._shapes.get(key)
                    if state is None:
                        state = self._shapes[key] = _ShapeState(lo, hi)
                    state.slide(lo)
                    if hi > state.hi:  # these windows slid into the range: pushed whole, rows or not
                        entered = range(max(state.hi, lo), hi, rq.step_ms)
                    groups = list(state.groups) if rq.group_by else []
            if rq.stream not in changed and rq.stream not in moved and not entered:
                continue
            if state is None:
                lo, hi = rq.range_at(now_ms)
                groups = []
            panes = ((start, dims_of(d)) for start, d in changed.get(rq.stream, ()))
            affected = affected_windows(rq, panes, moved.get(rq.stream), lo, hi)
            for t in entered:
                affected[t] = ALL_GROUPS
            if affected:
                watermark = watermarks.get(rq.stream)
                if kept_at is None:  # once a tick, and only when a tick computes
                    kept_at = retention_now_ms(self.store, now_ms)
                series = changed_points(self.store, rq, affected, watermark, self.config.max_points,
                                        self.point_cache, groups, kept_at_ms=kept_at)
            else:
                series = []
            if state is not None:
                with self._shapes_lock:
                    state.hi = max(state.hi, hi)
            if not series:
                continue
            self._shown(rq, lo, hi, {g: t for g, t in group_marks(rq, series).items() if t is not None})
            batch = PointsBatch(series, {"start": lo, "end": hi, "watermark_ms": watermark, "at_ms": self.now_ms()})
            self.stats.points_messages += len(members)
            out += [(client, QueuedPoints(sub, batch)) for client, sub in members]
        return out

    def _reloads(self, subs, switched: set[str]):
        """A switch replaced these streams' output (docs/reprocessing.md): each subscriber of one
        gets a whole new snapshot (groups may have come or gone), marked `"reason": "switched"`,
        of its query resolved again against the definition served now (a changed pane, tier or
        dimension would otherwise go on being read as the replaced output's). One that no longer
        resolves ends, with an error naming why, as a new subscription would be refused."""
        if self.point_cache is not None:
            self.point_cache.clear()  # its fingerprints were of the old rows
        if self.on_switch is not None:
            self.on_switch()
        out = []
        reloading = []
        for client, sub in subs:
            if sub.query.stream not in switched:
                continue
            reason = self._resolve_again(sub)
            if reason is None:
                reloading.append((client, sub))
                continue
            with self._lock:
                ended = client.subs.get(sub.id) is sub
                if ended:
                    del client.subs[sub.id]
            if ended:  # else unsubscribed or replaced meanwhile: nothing to say
                out.append((client, QueuedMessage(error(
                    f"stream {sub.query.stream!r} was switched to another definition and this subscription's"
                    f" query no longer resolves against it: {reason}; the subscription has ended", sub.id),
                    False, ends=sub)))
        reloaded = {sub.query.shape_key() for _, sub in reloading}
        with self._shapes_lock:  # the groups shown were the old rows': the reloads show the new ones
            for key in reloaded:
                self._shapes.pop(key, None)
        for client, sub in reloading:
            result = self.snapshot(sub.query)
            self._shown(sub.query, result["start"], result["end"], group_marks(sub.query, result["series"]))
            out.append((client, QueuedMessage({"type": "snapshot", "id": sub.id, "reason": "switched",
                                               "result": result}, False, sub=sub)))
        return out

    def _resolve_again(self, sub: Subscription) -> str | None:
        """`sub.query` resolved again from its request (kept as it is without one); why not, if not."""
        if self.resolve is None or sub.request is None:
            return None
        try:
            sub.query = self.resolve(sub.request, self.now_ms())
        except ValueError as exc:  # api.ws_protocol.ProtocolError, with its reason
            return getattr(exc, "reason", None) or str(exc)
        return None

    def _broadcasts(self):
        out = []
        with self._lock:
            clients = list(self._clients)
        for feed in self.feeds:
            try:
                messages = feed.poll()
            except Exception:
                self.stats.errors += 1
                log.exception("feed %r failed", getattr(feed, "topic", feed))
                continue
            for msg in messages:
                text = _dumps(msg)
                out += [(c, QueuedMessage(msg, True, text)) for c in clients if feed.topic in c.topics]
        return out

    def _deliver(self, deliveries) -> None:
        for client, item in deliveries:
            if isinstance(item, QueuedMessage) and item.ends is not None:  # ended by the tailer: drop what it queued
                client.queue.forget(item.ends)
            if item.sub is not None and client.subs.get(item.sub.id) is not item.sub:
                continue  # unsubscribed (or replaced) meanwhile
            client.queue.put(item)
