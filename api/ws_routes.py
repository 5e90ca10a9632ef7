"""WS /api/v1/ws: subscribe to queries and topics, receive snapshots, changed points,
corrections, lag and pipeline status. Per connection: one reader loop, one sender task and one
snapshot task; the hub (api/ws_hub.py) does the tailing and the per-client queueing.

The reader counts each message against the client's rate limit as it comes, and waits neither
for a snapshot nor for a message's handling (the handler task takes them from a bounded inbox in
order). When it waited, a slow run of snapshots, or subscribes each waiting on the thread pool
behind them (a 24-panel dashboard's range changes on a busy machine), held back the messages sent
meanwhile, and they were then counted all at once: a page keeping well within the limit was closed
with 1008 for the server's own slowness."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, HTTPException, WebSocket, WebSocketDisconnect
from starlette.concurrency import run_in_threadpool

from api.context import ApiContext
from api.security.middleware import WS_PROTOCOL, refused_now
from api.security.policy import websocket_scope
from api.security.ratelimit import RateLimiter
from api.ws_hub import Client, Hub, QueueClosed, QueuedMessage, Subscription
from api.ws_protocol import (Ping, ProtocolError, QueryIn, Subscribe, Topics, Unsubscribe, error, parse_message,
                             resolve_query)
from query import Query
from store.retention_clock import retention_now_ms
from store.rollup import RollupError

log = logging.getLogger("sketchboard.ws")


def router(ctx: ApiContext, hub: Hub) -> APIRouter:
    r = APIRouter()

    @r.websocket("/api/v1/ws")
    async def ws(websocket: WebSocket) -> None:
        # A browser that sent its token as a subprotocol offered "sketchboard" too and fails the
        # handshake unless one offered protocol is selected (api/security/middleware.py).
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=WS_PROTOCOL if WS_PROTOCOL in offered else None)
        hub.ensure_started()
        client = hub.connect()
        messages = RateLimiter(hub.config.message_rate, hub.config.message_burst, max_keys=1)
        sender = asyncio.create_task(_send_loop(websocket, client, hub))
        watcher = asyncio.create_task(_token_watch(websocket, client, ctx, hub))
        snapshots = SnapshotJobs()
        computer = asyncio.create_task(snapshots.run(client))
        # Bounded: a handler that far behind makes the reader wait (and the messages then wait
        # in the socket), rather than hold every message a client sends in memory.
        inbox: asyncio.Queue[str] = asyncio.Queue(maxsize=2 * hub.config.message_burst)
        handler = asyncio.create_task(_handle_inbox(inbox, client, hub, ctx, snapshots))
        try:
            while True:
                receive = asyncio.ensure_future(websocket.receive())
                if not await _unless_ended(receive, sender, handler):
                    break
                try:
                    message = receive.result()
                except (WebSocketDisconnect, RuntimeError):
                    break
                if message["type"] == "websocket.disconnect":
                    break
                if messages.take("client") > 0:
                    # A client flooding the hub with subscribe/ping messages costs every other
                    # client: it is closed rather than throttled (a well-behaved one never gets here).
                    with contextlib.suppress(Exception):
                        await websocket.close(code=1008, reason=f"over {hub.config.message_rate:g} messages/s")
                    break
                text = message.get("text")
                if text is None:
                    _reply(client, error("binary frames are not accepted: send JSON text frames"))
                    continue
                if not await _unless_ended(asyncio.ensure_future(inbox.put(text)), sender, handler):
                    break
        finally:
            for task in (handler, computer, watcher, sender):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
            hub.disconnect(client)

    return r


def served_query(ctx: ApiContext, request: QueryIn, now_ms: int) -> Query:
    """A live subscription's query resolved again after a switch (Hub.resolve): against the catalog
    the served output is built with now, or, with `version`, that version's while it is still the
    served one (another one's output is not followed live: subscribe again for its snapshot).
    ProtocolError with the reason a new subscription would be refused with."""
    catalog = ctx.served_catalog()
    if request.version is not None:
        from api.query_routes import versioned_output

        try:
            store, catalog = versioned_output(ctx, request.metric, request.version)
        except HTTPException as exc:
            raise ProtocolError(str(exc.detail)) from None
        if store is not ctx.store:
            raise ProtocolError(f"version {request.version!r} is no longer the served output (subscribe again"
                                " for a snapshot of it)")
    return resolve_query(request, catalog, now_ms, ctx.query_max_points, retention_now_ms(ctx.store, now_ms))


def _reply(client: Client, msg: dict) -> None:
    client.queue.put(QueuedMessage(msg, droppable=False))


class SnapshotJobs:
    """A connection's snapshots to compute, one at a time, oldest first, apart from its reader.
    Keyed by subscription id: a newer subscribe of an id replaces its waiting job (only the newest
    query of an id is answered), so at most one job per id waits, whatever the client sends."""

    def __init__(self):
        self._jobs: dict[str, tuple[Callable[[], Awaitable[None]], bool]] = {}  # id -> (job, of a version)
        self._ready = asyncio.Event()

    def add(self, sub_id: str, job: Callable[[], Awaitable[None]], *, version: bool = False) -> None:
        self.drop(sub_id)  # and to the end: after the jobs of subscriptions sent before it
        self._jobs[sub_id] = (job, version)
        self._ready.set()

    def drop(self, sub_id: str) -> None:
        self._jobs.pop(sub_id, None)

    def versions_waiting(self) -> int:
        """Snapshots of outputs not served that wait (a live one waits only for a subscription,
        which max_subscriptions bounds)."""
        return sum(version for _, version in self._jobs.values())

    async def run(self, client: Client) -> None:
        while True:
            await self._ready.wait()
            if not self._jobs:
                self._ready.clear()
                continue
            sub_id = next(iter(self._jobs))
            job, _ = self._jobs.pop(sub_id)
            try:
                await job()
            except Exception:  # one failed snapshot is answered with an error, the connection stays
                log.exception("snapshot of subscription %r failed", sub_id)
                _reply(client, error("its snapshot could not be computed (the server's log says why)", sub_id))


async def _unless_ended(step: asyncio.Future, sender: asyncio.Task, handler: asyncio.Task) -> bool:
    """True once `step` (a read, a put into the inbox) is done; False, with `step` cancelled, when
    the sender gave up first (the client gone or too slow). The handler's exception, if it failed,
    is raised here, as when the reader handled each message itself."""
    done, _ = await asyncio.wait({step, sender, handler}, return_when=asyncio.FIRST_COMPLETED)
    if step in done and not handler.done():
        return True
    step.cancel()
    with contextlib.suppress(BaseException):
        await step
    if handler.done():
        handler.result()
    return False


async def _handle_inbox(inbox: asyncio.Queue[str], client: Client, hub: Hub, ctx: ApiContext,
                        snapshots: SnapshotJobs) -> None:
    """The connection's messages handled one at a time, in the order they came."""
    while True:
        text = await inbox.get()
        await _handle(text, client, hub, ctx, snapshots)


async def _handle(text: str, client: Client, hub: Hub, ctx: ApiContext, snapshots: SnapshotJobs) -> None:
    try:
        msg = parse_message(text)
    except ProtocolError as exc:
        _reply(client, error(exc.reason, exc.id))
        return
    if isinstance(msg, Ping):
        # The heartbeat interval: the page pings on open and closes a socket silent for a few of them.
        # The message limits: the page paces what it sends to stay within them (past them it is closed).
        _reply(client, {"type": "pong", "at_ms": hub.now_ms(),
                        "heartbeat_interval_ms": round(hub.config.heartbeat_interval_s * 1000),
                        "message_rate": hub.config.message_rate, "message_burst": hub.config.message_burst})
    elif isinstance(msg, Topics):
        client.topics = set(msg.topics)
        _reply(client, {"type": "topics", "topics": sorted(client.topics)})
    elif isinstance(msg, Unsubscribe):
        snapshots.drop(msg.id)
        if hub.unsubscribe(client, msg.id):
            _reply(client, {"type": "unsubscribed", "id": msg.id})
        else:
            _reply(client, error(f"no subscription with id {msg.id!r}", msg.id))
    elif isinstance(msg, Subscribe):
        # A subscribe for an id in use replaces that subscription: the old one ends here, before the
        # new one is checked, so a refused one leaves no subscription under the id (the error says so).
        snapshots.drop(msg.id)
        replaced = hub.unsubscribe(client, msg.id)

        def refuse(reason: str) -> None:
            if replaced:
                reason += f" (the subscription previously under id {msg.id!r} has ended)"
            _reply(client, error(reason, msg.id))

        catalog = await run_in_threadpool(ctx.served_catalog)  # the served output's (api/served_catalog.py)
        if msg.query.version is not None:
            from api.query_routes import versioned_output

            try:
                store, catalog = await run_in_threadpool(versioned_output, ctx, msg.query.metric, msg.query.version)
            except HTTPException as exc:
                refuse(str(exc.detail))
                return
            if store is not ctx.store:  # an output not served: a snapshot of it, no live points
                if snapshots.versions_waiting() >= client.max_subscriptions:
                    # Not a subscription, so not bounded by max_subscriptions: bounded here instead.
                    refuse(f"at most {client.max_subscriptions} snapshots of other versions may wait at once")
                    return
                snapshots.add(msg.id, lambda: _version_snapshot(client, ctx, hub, msg, store, catalog, refuse),
                              version=True)
                return
        try:
            now = hub.now_ms()
            kept_at = await run_in_threadpool(retention_now_ms, ctx.store, now)
            query = resolve_query(msg.query, catalog, now, ctx.query_max_points, kept_at)
            sub = hub.subscribe(client, msg.id, query, request=msg.query)
        except (ProtocolError, ValueError) as exc:
            refuse(getattr(exc, "reason", str(exc)))
            return
        snapshots.add(msg.id, lambda: _live_snapshot(client, hub, sub, refuse))


async def _live_snapshot(client: Client, hub: Hub, sub: Subscription, refuse) -> None:
    sub_id = sub.id
    if client.subs.get(sub_id) is not sub:
        return  # unsubscribed or replaced before its turn
    try:
        message = await run_in_threadpool(hub.snapshot_message, sub_id, sub.query)
    except Exception as exc:
        # The reader goes on meanwhile: the id may hold a newer subscription by now, which stays.
        if client.subs.get(sub_id) is sub:
            hub.unsubscribe(client, sub_id)
            if isinstance(exc, RollupError):
                refuse(str(exc))
            else:
                log.exception("snapshot of subscription %r failed", sub_id)
                refuse("its snapshot could not be computed (the server's log says why)")
        return
    if client.subs.get(sub_id) is not sub:
        return  # unsubscribed or replaced while the snapshot was computed
    client.queue.put(message)
    client.queue.release(sub)


async def _send_loop(websocket: WebSocket, client: Client, hub: Hub) -> None:
    config = hub.config
    while True:
        try:
            text = await client.queue.get(config.heartbeat_interval_s)
        except QueueClosed as closed:
            log.info("websocket client closed: %s", closed.reason)
            with contextlib.suppress(Exception):
                await websocket.close(code=1008, reason=closed.reason[:120])
            return
        if text is None:
            text = '{"type":"heartbeat","at_ms":%d}' % hub.now_ms()
        try:
            await asyncio.wait_for(websocket.send_text(text), config.send_timeout_s)
        except TimeoutError:
            log.info("websocket client accepted nothing for %.0f s: closing", config.send_timeout_s)
            with contextlib.suppress(Exception):
                await websocket.close(code=1008, reason="too slow")
            return
        except Exception:  # the connection is gone
            return


async def _token_watch(websocket: WebSocket, client: Client, ctx: ApiContext, hub: Hub) -> None:
    """The token the handshake was accepted with, checked again every token_check_interval_s against
    the same token store as every request's: once it would be refused (revoked, its scope gone, or
    a token now required), the queue is closed and the sender closes the socket with 1008 and why."""
    record = websocket.scope.get("state", {}).get("token")
    needed = websocket_scope(websocket.scope["path"])
    while True:
        await asyncio.sleep(hub.config.token_check_interval_s)
        reason = refused_now(ctx.security, record, needed)
        if reason is not None:
            client.queue.close(reason)
            return


async def _version_snapshot(client, ctx, hub, msg, store, catalog, refuse) -> None:
    """A subscription to an output that is not served (a run's or a previous one): its snapshot,
    marked `"live": false`: the hub follows only the served output's change feed, and such an
    output changes only while its run is going (subscribe again to refresh it)."""
    from api.ws_compute import snapshot_result

    try:
        now = hub.now_ms()
        kept_at = await run_in_threadpool(retention_now_ms, store, now)
        query = resolve_query(msg.query, catalog, now, ctx.query_max_points, kept_at)
        result = await run_in_threadpool(lambda: snapshot_result(store, query, hub.now_ms(),
                                                                 store.watermarks().get(query.stream),
                                                                 ctx.query_max_points))
    except (ProtocolError, ValueError, RollupError) as exc:
        refuse(getattr(exc, "reason", str(exc)))
        return
    _reply(client, {"type": "snapshot", "id": msg.id, "live": False, "result": result})
