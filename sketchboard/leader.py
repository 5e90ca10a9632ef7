"""What only one API replica runs at a time: the alert evaluator (with its webhook notifier)
and the lag sampler, started when this replica takes the leader lease (store/lease.py) and
stopped when it loses it. Every replica serves REST and websocket clients either way.

Why these: two evaluators would both save each evaluation and both notify (the receiver
would get every notification twice); two samplers would write the same samples. What they
need to carry on is in the store (alert instances, history, what the webhook delivered, lag
samples), so a new leader continues where the previous one stopped."""

from __future__ import annotations

import logging
import os
import socket

from sketchboard.settings import Settings
from store.lease import Leadership, LeaseStore

log = logging.getLogger("sketchboard.leader")

LEASE_NAME = "api-leader"
# How long after the leader stops another replica takes over, at worst, in lease ttls: the
# last renewal seen up to one renew interval (ttl/5) late, a ttl, one more renew interval.
TAKEOVER_TTLS = 1.4


def replica_id(settings: Settings) -> str:
    """This process's name in the lease: a restarted process is a new holder."""
    return settings.replica_id or f"{socket.gethostname()}:{settings.port}:{os.getpid()}"


def build_leadership(settings: Settings, store) -> Leadership:
    """The lease this API process contends for (not started: `sketchboard api` starts it); what it
    runs while leading is attached with `lead(...)`."""
    ttl_s = settings.leader_lease_ttl / 1000
    if ttl_s * TAKEOVER_TTLS * 1000 > settings.alert_eval_interval:
        log.warning("leader_lease_ttl %.1f s: a replica takes over up to %.1f s after the leader stops, longer"
                    " than alert_eval_interval (%.1f s)", ttl_s, ttl_s * TAKEOVER_TTLS,
                    settings.alert_eval_interval / 1000)
    return Leadership(LeaseStore(store.side_db()), LEASE_NAME, replica_id(settings), ttl_s=ttl_s)


def lead(leadership: Leadership, *, alerts=None, sampler=None) -> Leadership:
    """Run the alert service and the lag sampler only while this replica leads; each also asks
    the lease right before each write (a round still running when the lease lapsed writes nothing)."""
    if sampler is not None:
        sampler.active = leadership.leading
    if alerts is not None:
        alerts.active = leadership.leading

    def gain() -> None:
        if sampler is not None:
            sampler.start()
        if alerts is not None:
            alerts.resume()

    def lose() -> None:
        if alerts is not None:
            alerts.pause()
        if sampler is not None:
            sampler.stop()

    leadership.on_gain, leadership.on_lose = gain, lose
    return leadership


def stand_down(leadership: Leadership, *, alerts=None) -> None:
    """Shut the leader's work down and hand the lease over, in an order that lets the webhook flush
    what it has queued: a notifier sends only while this replica leads, so the lease is kept, and
    renewed, while it flushes, and released last. First the evaluator stops (nothing new is queued;
    a lease regained meanwhile starts nothing again); then the alert service stops, its notifiers
    flushing for at most their shutdown timeout (`alert_webhook_shutdown_timeout`) while the lease
    thread goes on renewing: a slow receiver is not cut off at the lease's ttl. What the timeout
    leaves unsent stays unsent in the store's memory of what was delivered, so the next leader
    sends it. Then the lease thread stops and the lease is released, so that another replica takes
    over at once. (A lease lost meanwhile, the store away, stops the flush as any loss does: the
    notifier asks the lease before each attempt.)"""
    leadership.on_gain = lambda: None  # shutting down: a lease regained during the flush starts nothing
    if alerts is not None:
        alerts.stop()
    leadership.stop()
