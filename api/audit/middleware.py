"""Records every successful change made through the API, with the token that made it.

A middleware rather than a line in each route: routes added later (dashboards, reprocessing)
are audited without anyone remembering to, and the body recorded is the one the route read.
It sits inside the security middleware, which puts the caller's token in the scope's state."""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from api.audit.entries import MAX_DETAIL_BYTES, actor, audited, detail

log = logging.getLogger("sketchboard.api")


class AuditMiddleware:
    def __init__(self, app, store, clock: Callable[[], float]):
        self.app, self.store, self.clock = app, store, clock

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not audited(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        body = bytearray()

        async def receive_copy():
            message = await receive()
            if message["type"] == "http.request" and len(body) <= MAX_DETAIL_BYTES:
                body.extend(message.get("body", b""))
            return message

        async def record_then_send(message):
            # Recorded before the status goes out: a client that saw its change answered finds it in
            # the log, and changes sent one after another are logged in the order they were answered.
            if message["type"] == "http.response.start" and 200 <= message["status"] < 300:
                token = scope.get("state", {}).get("token")
                client = scope.get("client")
                try:
                    await run_in_threadpool(
                        self.store.record, int(self.clock() * 1000), actor(token.name if token else None),
                        f"{scope['method']} {scope['path']}", target=scope["path"],
                        client=client[0] if client else None, status=message["status"], detail=detail(bytes(body)))
                except Exception:
                    # The change is made: its answer still goes out (a 500 would have the client retry
                    # a change already made), and the lost entry is said loudly here.
                    log.exception("the audit log could not record %s %s (answered %d)", scope["method"],
                                  scope["path"], message["status"])
            await send(message)

        await self.app(scope, receive_copy, record_then_send)
