"""Fuzz every operation of the API from its own OpenAPI document (schemathesis) against the
real app: create_app over a real SQLite log and store in tmp_path, with alerts, lag and
health wired (tests/api/conftest.py: wired ctx), called in-process through ASGI. Besides
schemathesis' checks, a request answered 4xx must leave the log, the store and the alert
rules as they were.

Every operation runs on each store backend (SQLite, PostgreSQL: `store_backend`), the side
stores beside the pane store as the service wires them.

Bounded and repeatable: a fixed seed, deterministic generation, no example database, and
SKETCHBOARD_FUZZ_EXAMPLES examples per operation and phase (default 25, ~3 min here for both backends; the
issue's run used 300: `SKETCHBOARD_FUZZ_EXAMPLES=300 pytest tests/api/test_fuzz_openapi.py`).

Random strings alone would hardly ever name a real metric, so most requests would stop at
the 404 and never reach the time and duration parsing behind it. Two fuzz dictionaries fix
that: the catalog's real stream, metric and rule names for the parameters that take them,
and hostile values (huge durations and times, 2^63, infinities, 400 digits) mixed into
every string and integer.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.config import SchemathesisConfig
    from schemathesis.specs.openapi.checks import (
        allow_header_conformance,
        content_type_conformance,
        missing_required_header,
        negative_data_rejection,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
        unsupported_method,
    )

from api.app import create_app
from api.security.config import SecurityConfig
from api.security.scopes import Scope
from api.security.token_file import TokenRegistry
from api.security.tokens import TokenRecord, hash_token
from catalog import load_catalog
from tests.api.conftest import CONFIG, FakeClock, wire

# The app under test requires tokens (as one listening beyond loopback does): schemathesis sends
# this admin token, and its missing_required_header check makes sure a request without it is
# refused with 401.
FUZZ_TOKEN = "sb_fuzz-admin-token-for-the-test-only"
EXAMPLES = int(os.environ.get("SKETCHBOARD_FUZZ_EXAMPLES", "25"))
# Every check schemathesis 4.32 has that applies to this app, but:
# - positive_data_acceptance (a schema-valid request must get 2xx): the grammar of `from`,
#   `to`, `step`, `stat` and the catalog's names is wider than JSON Schema says, so valid-looking
#   requests are rightly refused (a `to` before `from`, a step that is no multiple of the pane,
#   a metric that does not exist); the 400s say why, and are checked for shape instead.
# - ignored_auth: its probes go through schemathesis' requests transport, not the ASGI app;
#   tests/api/test_security.py sends every secured operation without and with a bad token instead.
# - object_level_authorization: there are no per-object owners (a token's scope covers a route).
# - use_after_free, ensure_resource_availability: stateful, they need OpenAPI links and the
#   stateful phase, which pytest's parametrize does not run.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection, unsupported_method, allow_header_conformance,
          missing_required_header]
RULE_NAME = "fuzz_rule"
RULE = {"name": RULE_NAME, "kind": "threshold", "metric": "latency", "stat": "p99", "window": "1m", "threshold": 1}
# A saved dashboard of the same name: `path.name` draws from one dictionary for both.
DASHBOARD = {"name": RULE_NAME, "panels": [{"metric": "latency", "stat": "band", "kind": "area"}]}
# And a pattern defined through the API, for PUT and DELETE /api/v1/patterns/{name}.
PATTERN = {"name": RULE_NAME, "key": "user_id", "steps": [{"name": "fail", "stream": "logins",
                                                            "where": {"outcome": "failure"}}]}

CATALOG = load_catalog(CONFIG)
HOSTILE = [
    "now-99999999999999999999d", "now+99999999999999999999d", "99999999999999999999d", "now-99999999999d",
    "9" * 400, "9" * 400 + "s", "now-" + "9" * 400 + "ms", "1e400", "-1e400", "nan", "inf", "-1",
    "9223372036854775808", "36501d", "0s", "0", "now", "now-1h", "1m", "10s", "2027-01-15T08:00:00Z",
    "1900-01-01T00:00:00Z", "\x00", "\u202e", "p99", "p1e400", "distinct", "first_seen",
]
HOSTILE_INTEGERS = [2**63, 2**63 - 1, 2**64, -(2**63) - 1, -1, 0, 10**400]


def _document() -> dict:
    """The OpenAPI document of a fully wired app. It depends on the catalog and on what is
    wired, not on the data, so a throwaway store serves to build it at collection time (the
    pytest fixtures that hold each test's store do not exist yet then)."""
    with tempfile.TemporaryDirectory() as tmp, wire(Path(tmp), FakeClock()) as ctx:
        return create_app(ctx).openapi()


FUZZ_CONFIG = SchemathesisConfig.from_dict({
    "seed": 23,
    "auth": {"openapi": {"bearer": {"bearer": FUZZ_TOKEN}}},
    # Positive and negative cases. The coverage phase adds each schema's boundary values (2^63
    # for an id declared le=2^63-1), the fuzzing phase random ones.
    "generation": {
        "mode": "all", "max-examples": EXAMPLES, "deterministic": True, "database": "none",
        "dictionaries": {"string": {"dictionary": "hostile", "probability": 0.3},
                         "integer": {"dictionary": "hostile_integers", "probability": 0.3}},
    },
    "dictionaries": {
        "hostile": {"values": HOSTILE},
        "hostile_integers": {"values": HOSTILE_INTEGERS},
        "metrics": {"values": sorted(CATALOG.metrics)},
        "streams": {"values": sorted(CATALOG.streams)},
        "rules": {"values": [RULE_NAME]},
    },
    "parameters": {
        "query.metric": {"dictionary": "metrics", "probability": 0.8},
        "query.stream": {"dictionary": "streams", "probability": 0.8},
        "query.rule": {"dictionary": "rules", "probability": 0.5},
        "path.name": {"dictionary": "rules", "probability": 0.5},
        "body.metric": {"dictionary": "metrics", "probability": 0.8},
        "body.stream": {"dictionary": "streams", "probability": 0.8},
    },
})
schema = schemathesis.openapi.from_dict(_document(), config=FUZZ_CONFIG)


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx, value) -> bytes:
    """NDJSON is text: a string goes as it is, anything else as one JSON text a line."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return "\n".join(json.dumps(line) for line in (value if isinstance(value, list) else [value])).encode()


def _checks(case) -> list:
    """negative_data_rejection does not apply to an NDJSON body: any text is NDJSON whose bad
    lines are rejected one by one in a 200 (the contract); a 'schema-violating' non-string
    value can only reach the wire as such text."""
    if case.operation.path == "/api/v1/events" and case.media_type == "application/x-ndjson":
        return [check for check in CHECKS if check is not negative_data_rejection]
    return CHECKS


@pytest.fixture
def pane_store(store_backend):
    """Every operation fuzzed on each store backend: a text PostgreSQL cannot hold (a NUL) or a
    bound it checks otherwise than SQLite must not turn into a 500 there."""
    return store_backend.create()


@pytest.fixture
def fuzzed_app(wired_ctx):
    """A fresh app and store per operation, with one rule and one dashboard for their routes to find; tokens
    required, FUZZ_TOKEN the one admin token."""
    wired_ctx.security = SecurityConfig(tokens=TokenRegistry(
        [TokenRecord("fuzz", hash_token(FUZZ_TOKEN), frozenset({Scope.ADMIN}))]))
    app = create_app(wired_ctx)
    wired_ctx.alerts.create(RULE)
    wired_ctx.dashboards.create(DASHBOARD)
    wired_ctx.pattern_definitions.create(PATTERN)
    return app


class StateBefore:
    """The state before each of an operation's examples (all examples of one item share its
    fixtures and app, one after the other). Taking it (`state`, ~8 ms) before every request was
    about half the test's time; most requests are refused, and a refused request's state after,
    which the test compares anyway, is the next request's state before, as nothing else writes in
    between (no pipeline, no background task). So it is kept only from a refused request's check
    that found nothing changed to the next request, and taken afresh after any other answer (which
    may have written) or a failure (hypothesis replays and shrinks)."""

    def __init__(self, state):
        self._state = state
        self._known: dict | None = None

    def take(self) -> dict:
        before, self._known = self._known if self._known is not None else self._state(), None
        return before

    def after(self, before: dict) -> dict:
        """The state now; where it is `before`, it is the next request's state before too."""
        now = self._state()
        if now == before:
            self._known = now
        return now


@pytest.fixture
def state_before(state):
    return StateBefore(state)


# One item per operation and backend, each with its own node id (schemathesis 4.32; tests/conftest.py
# fails the collection should two share one), so they run under xdist with the JVM-free tests.
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_from_the_openapi_document(case, fuzzed_app, state_before):
    before = state_before.take()
    response = case.call_and_validate(app=fuzzed_app, checks=_checks(case))
    if 400 <= response.status_code < 500:
        assert state_before.after(before) == before, \
            f"{case.operation.label} answered {response.status_code} but changed the state"
