"""Pure security logic (api/security/): scopes, token hashing and lookup, origins, body media
types, the route policy, and the token registry's reload over a real file with an injected clock."""

from __future__ import annotations

import json

import pytest

from api.security.media import unsupported_body
from api.security.middleware import Denied, authorize, bearer
from api.security.origins import normalize_origin, origin_allowed
from api.security.policy import required_scope
from api.security.scopes import Scope, grants, parse_scopes
from api.security.token_file import TokenFileError, TokenRegistry, create_token, read_tokens, revoke_token
from api.security.tokens import TokenRecord, TokenSet, hash_token, new_token
from tests.support.clock import FakeClock


def test_admin_implies_every_scope_and_the_others_only_themselves():
    assert all(grants({Scope.ADMIN}, s) for s in Scope)
    assert grants({Scope.READ}, Scope.READ) and not grants({Scope.READ}, Scope.INGEST)
    assert not grants({Scope.INGEST}, Scope.READ) and not grants({Scope.INGEST, Scope.READ}, Scope.ADMIN)


def test_scopes_parse_repeated_or_comma_separated_and_name_a_bad_one():
    assert parse_scopes(["ingest,read", "READ"]) == {Scope.INGEST, Scope.READ}
    with pytest.raises(ValueError, match="unknown scope 'write'"):
        parse_scopes(["write"])
    with pytest.raises(ValueError, match="at least one scope"):
        parse_scopes([])


def test_tokens_are_random_and_only_their_hash_is_kept():
    a, b = new_token(), new_token()
    assert a != b and a.startswith("sb_") and len(a) > 40
    record = TokenRecord("ci", hash_token(a), frozenset({Scope.READ}))
    assert a not in json.dumps(record.to_dict())
    tokens = TokenSet.of([record, TokenRecord("other", hash_token(b), frozenset({Scope.ADMIN}))])
    assert tokens.lookup(a) is record and tokens.lookup(b).name == "other"
    assert tokens.lookup(a[:-1]) is None and tokens.lookup("") is None


def test_a_token_entry_must_hold_a_hash_never_the_token():
    with pytest.raises(ValueError, match="sha256 must be 64 hex digits"):
        TokenRecord.from_dict({"name": "x", "sha256": new_token(), "scopes": ["read"]})


@pytest.mark.parametrize(("method", "path", "scope"), [
    ("GET", "/healthz", None), ("GET", "/readyz", None), ("GET", "/", None), ("GET", "/static/app.js", None),
    ("GET", "/openapi.json", None), ("POST", "/api/v1/events", Scope.INGEST), ("GET", "/api/v1/query", Scope.READ),
    ("GET", "/metrics", Scope.READ), ("GET", "/api/v1/nope", Scope.READ), ("POST", "/api/v1/alerts/rules", Scope.ADMIN),
    ("DELETE", "/api/v1/alerts/rules/{name}/silence", Scope.ADMIN), ("PUT", "/api/v1/alerts/rules/x", Scope.ADMIN),
])
def test_the_policy_names_the_scope_of_each_route(method, path, scope):
    assert required_scope(method, path) == scope


def test_authorize_is_401_without_or_with_a_bad_token_and_403_with_the_wrong_scope():
    token = new_token()
    tokens = TokenSet.of([TokenRecord("producer", hash_token(token), frozenset({Scope.INGEST}))])
    assert authorize(False, tokens, None, Scope.ADMIN) is None  # open (loopback, no tokens)
    assert authorize(True, tokens, None, None) is None  # an open path
    with pytest.raises(Denied) as missing:
        authorize(True, tokens, None, Scope.READ)
    assert missing.value.status == 401 and missing.value.challenge == 'Bearer realm="sketchboard"'
    with pytest.raises(Denied) as bad:
        authorize(True, tokens, "sb_wrong", Scope.INGEST)
    assert bad.value.status == 401 and 'error="invalid_token"' in bad.value.challenge
    with pytest.raises(Denied) as scope:
        authorize(True, tokens, token, Scope.READ)
    assert scope.value.status == 403 and 'scope="read"' in scope.value.challenge and "producer" in scope.value.detail
    assert authorize(True, tokens, token, Scope.INGEST).name == "producer"


def test_bearer_header_parsing():
    assert bearer({"authorization": "Bearer abc"}) == "abc"
    assert bearer({"authorization": "bearer  abc "}) == "abc"
    assert bearer({"authorization": "Basic abc"}) == ""  # present but unusable: 401 invalid_token
    assert bearer({}) is None


@pytest.mark.parametrize(("origin", "host", "allowed", "ok"), [
    (None, "127.0.0.1:8000", frozenset(), True),  # not a browser
    ("http://127.0.0.1:8000", "127.0.0.1:8000", frozenset(), True),
    ("HTTP://LOCALHOST:8000", "localhost:8000", frozenset(), True),
    ("https://sb.example.com", "sb.example.com", frozenset(), True),  # behind a TLS proxy: default port
    ("http://evil.example", "127.0.0.1:8000", frozenset(), False),
    ("http://127.0.0.1:9999", "127.0.0.1:8000", frozenset(), False),  # another port is another origin
    ("null", "127.0.0.1:8000", frozenset(), False),
    ("http://grafana.example:3000", "127.0.0.1:8000", frozenset({"http://grafana.example:3000"}), True),
    ("http://grafana.example:3000/path", "127.0.0.1:8000", frozenset({"http://grafana.example:3000"}), False),
])
def test_origin_matching(origin, host, allowed, ok):
    assert origin_allowed(origin, host, allowed) is ok


def test_origins_normalize_default_ports_and_case():
    assert normalize_origin("https://Example.COM") == "https://example.com:443"
    assert normalize_origin("http://[::1]:8000") == "http://[::1]:8000"
    assert normalize_origin("file:///etc/passwd") is None and normalize_origin("http://:80") is None


@pytest.mark.parametrize(("method", "ctype", "body", "refused"), [
    ("POST", "application/json", True, False), ("POST", "application/x-ndjson; charset=utf-8", True, False),
    ("POST", "text/plain", True, True), ("POST", None, True, True), ("POST", "multipart/form-data; b=x", True, True),
    ("PUT", "application/x-www-form-urlencoded", True, True), ("DELETE", None, False, False),
    ("DELETE", "text/plain", False, True), ("GET", "text/plain", True, False),
])
def test_writes_carry_only_json_or_ndjson(method, ctype, body, refused):
    assert (unsupported_body(method, ctype, body) is not None) is refused


def test_token_file_create_list_revoke(tmp_path):
    path = tmp_path / "tokens.json"
    token = create_token(path, "ci", frozenset({Scope.READ}), now_ms=1)
    assert token not in path.read_text() and hash_token(token) in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(TokenFileError, match="exists already"):
        create_token(path, "ci", frozenset({Scope.READ}), now_ms=2)
    assert [r.name for r in read_tokens(path)] == ["ci"]
    revoke_token(path, "ci")
    assert read_tokens(path) == []
    with pytest.raises(TokenFileError, match="no token named 'ci'"):
        revoke_token(path, "ci")


def test_the_registry_rereads_the_file_when_it_changes_and_stays_closed_when_emptied(tmp_path):
    path, clock = tmp_path / "tokens.json", FakeClock(0.0)
    registry = TokenRegistry(path=path, reload_every_s=1.0, clock=clock)
    assert registry.state() == (False, TokenSet())  # no file, no tokens: open
    token = create_token(path, "ci", frozenset({Scope.READ}), now_ms=1)
    assert registry.state()[0] is False  # not re-read within the second
    clock.now = 1.0
    required, tokens = registry.state()
    assert required and tokens.lookup(token).name == "ci"
    revoke_token(path, "ci")
    clock.now = 2.0
    required, tokens = registry.state()
    assert required and tokens.lookup(token) is None  # revoking the last token does not open the service
    path.write_text("{broken")
    clock.now = 3.0
    assert registry.state() == (True, TokenSet())  # a broken file fails closed


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("sketchboard.example.com", False),
])
def test_loopback_addresses(host, loopback):
    from api.security.exposure import exposure_error, is_loopback

    assert is_loopback(host) is loopback
    assert (exposure_error(host, 0) is None) is loopback
    assert exposure_error(host, 1) is None


def test_settings_take_token_hashes_and_origins_and_refuse_clear_tokens(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from sketchboard.settings import Settings

    monkeypatch.chdir(tmp_path)
    entry = {"name": "compose", "sha256": hash_token("sb_x"), "scopes": ["ingest"]}
    monkeypatch.setenv("SKETCHBOARD_TOKENS", json.dumps([entry]))
    monkeypatch.setenv("SKETCHBOARD_ALLOWED_ORIGINS", '["https://grafana.example.com"]')
    settings = Settings(data_dir=tmp_path / "d")
    assert settings.tokens == [entry] and settings.tokens_path == tmp_path / "d" / "tokens.json"
    with pytest.raises(ValidationError, match="sha256 must be 64 hex digits"):
        Settings(tokens=[{**entry, "sha256": "sb_x"}])
    with pytest.raises(ValidationError, match="cors_origins: 'grafana' is not an origin"):
        Settings(cors_origins=["grafana"])


def test_rate_limiter_buckets_refill_with_time_and_are_per_key():
    from api.security.ratelimit import RateLimiter, client_key, retry_after

    clock = FakeClock(0.0)
    limiter = RateLimiter(rate=2, burst=4, clock=clock)
    assert [limiter.take("a") for _ in range(4)] == [0, 0, 0, 0]
    assert limiter.take("a") == pytest.approx(0.5)  # one token comes back every 0.5 s
    assert limiter.take("b") == 0  # another key has its own bucket
    clock.now = 0.5
    assert limiter.take("a") == 0 and limiter.take("a") > 0
    clock.now = 100.0
    assert [limiter.take("a") for _ in range(4)] == [0, 0, 0, 0]  # refilled, but never above the burst
    assert limiter.take("a") > 0
    assert retry_after(0.01) == "1" and retry_after(2.2) == "3"
    assert client_key("ci", ("10.0.0.1", 5)) == "token:ci" and client_key(None, ("10.0.0.1", 5)) == "addr:10.0.0.1"


def test_a_cost_above_the_burst_passes_on_a_full_bucket_and_leaves_a_debt():
    from api.security.ratelimit import RateLimiter

    clock = FakeClock(0.0)
    limiter = RateLimiter(rate=10, burst=10, clock=clock)
    assert limiter.take("k", 30) == 0  # one big request is not refused forever
    assert limiter.take("k", 1) == pytest.approx(2.1)  # -20 tokens: 2 s to get back to 0, 0.1 s more for one
    clock.now = 3.0
    assert limiter.take("k", 5) == 0


def test_a_reservation_is_charged_only_when_the_tokens_are_there_and_its_refund_comes_back():
    from api.security.ratelimit import RateLimiter

    clock = FakeClock(0.0)
    limiter = RateLimiter(rate=10, burst=100, clock=clock)
    assert limiter.reserve("k", 80)  # 20 left
    assert not limiter.reserve("k", 30)  # nothing charged: no debt, unlike take
    assert limiter.take("k", 20) == 0 and limiter.take("k", 1) > 0
    limiter.refund("k", 50)  # the reservation's unused part
    assert limiter.take("k", 50) == 0 and limiter.take("k", 1) > 0
    clock.now = 100.0
    limiter.refund("k", 500)
    assert limiter.reserve("k", 100) and not limiter.reserve("k", 1)  # never above the burst
    assert not limiter.reserve("other", 101) and limiter.reserve("other", 100)


def test_the_limiter_forgets_the_least_recently_seen_keys():
    from api.security.ratelimit import RateLimiter

    limiter = RateLimiter(rate=1, burst=1, clock=FakeClock(0.0), max_keys=2)
    for key in ("a", "b", "c"):
        assert limiter.take(key) == 0
    assert limiter.take("a") == 0  # forgotten: full again
    assert limiter.take("c") > 0


def test_what_is_audited_and_how_a_body_is_described():
    from api.audit.entries import MAX_DETAIL_BYTES, actor, audited, detail

    assert audited("POST", "/api/v1/alerts/rules") and audited("DELETE", "/api/v1/alerts/rules/x/silence")
    assert not audited("POST", "/api/v1/events") and not audited("GET", "/api/v1/alerts/rules")
    assert actor(None) == "anonymous" and actor("ops") == "ops"
    assert detail(b'{"duration": "1h"}') == {"duration": "1h"} and detail(b"") is None and detail(b"x{") == "x{"
    big = detail(b"[" + b"1," * MAX_DETAIL_BYTES + b"1]")
    assert big["truncated"] is True and big["bytes"] > MAX_DETAIL_BYTES


def test_the_audit_store_keeps_entries_newest_first_and_prunes_past_retention(store_backend):
    from store.audit import AuditStore

    store = AuditStore(store_backend.side_db(), retention_ms=1000)  # on each store backend
    try:
        first = store.record(10, "ops", "token.create", target="ci", detail={"scopes": ["read"]})
        store.record(20, "ops", "PUT /api/v1/alerts/rules/r", target="/api/v1/alerts/rules/r", client="10.0.0.1",
                     status=200, detail={"name": "r"})
        assert [e.action for e in store.entries()] == ["PUT /api/v1/alerts/rules/r", "token.create"]
        assert store.entries(after_id=first)[0].detail == {"name": "r"}
        store.record(2000, "ops", "token.revoke", target="ci")
        assert [e.action for e in store.entries()] == ["token.revoke"]  # older than 1 s before the newest
    finally:
        store.close()


def test_json_limits_name_the_bound_and_where():
    from ingest.json_limits import JsonLimits, violation

    limits = JsonLimits(max_depth=3, max_string_chars=10, max_int_digits=5)
    assert violation({"a": "x" * 10, "b": 99_999, "c": -1.5, "d": [1, {"e": None}], "f": True}, limits) is None
    assert violation({"a": {"b": [{"c": 1}]}}, limits) == "a.b[0]: nested deeper than max_depth (3)"
    assert violation({"a": ["ok", "x" * 11]}, limits) == "a[1]: string of 11 characters exceeds max_string_chars (10)"
    assert violation({"k" * 11: 1}, limits).startswith("value: a key of 11 characters")
    assert violation({"n": 100_000}, limits) == "n: integer of more than 5 digits exceeds max_int_digits"
    assert violation({"n": [float("inf")]}, limits).startswith("n[0]: number inf is not finite")
    assert violation("x" * 11, limits).startswith("value: string of 11")


@pytest.mark.parametrize(("host", "ok"), [
    ("127.0.0.1:8000", True), ("localhost", True), ("localhost:8000", True), ("[::1]:8000", True), ("[::1]", True),
    ("evil.example", False), ("evil.example:8000", False), ("10.0.0.1:8000", False), ("", False), (None, False),
])
def test_loopback_host_headers(host, ok):
    from api.security.exposure import host_header_is_loopback

    assert host_header_is_loopback(host) is ok
