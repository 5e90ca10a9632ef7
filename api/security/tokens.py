"""API tokens: made once, kept only as hashes, looked up in constant time. Pure.

A token is 32 random bytes (URL-safe base64 after the `sb_` prefix, so it is recognisable in a
leaked config or log). Only its SHA-256 is kept: a token has 256 bits of entropy, so a fast
hash cannot be brute-forced and a slow password KDF would only add latency to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from api.security.scopes import Scope, parse_scopes

PREFIX = "sb_"
NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_HASH_RE = re.compile(r"^[0-9a-f]{64}$")


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class TokenRecord:
    name: str
    sha256: str
    scopes: frozenset[Scope]
    created_ms: int | None = None

    @classmethod
    def from_dict(cls, raw: dict) -> TokenRecord:
        """From the tokens file or the `tokens` setting; ValueError says which field is wrong."""
        if not isinstance(raw, dict):
            raise ValueError(f"a token entry must be an object with name, sha256 and scopes, got {raw!r}")
        name, digest = raw.get("name"), str(raw.get("sha256", "")).lower()
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"token name {name!r}: 1-64 characters of A-Z a-z 0-9 _ . : -")
        if not _HASH_RE.match(digest):
            raise ValueError(f"token {name!r}: sha256 must be 64 hex digits (the hash, never the token itself)")
        scopes = raw.get("scopes")
        return cls(name, digest, parse_scopes(scopes if isinstance(scopes, list) else [scopes or ""]),
                   raw.get("created_ms"))

    def to_dict(self) -> dict:
        return {"name": self.name, "sha256": self.sha256, "scopes": sorted(s.value for s in self.scopes),
                "created_ms": self.created_ms}


@dataclass(frozen=True)
class TokenSet:
    records: tuple[TokenRecord, ...] = field(default_factory=tuple)

    @classmethod
    def of(cls, records: Iterable[TokenRecord]) -> TokenSet:
        return cls(tuple(records))

    def __len__(self) -> int:
        return len(self.records)

    def lookup(self, presented: str) -> TokenRecord | None:
        """The record whose hash matches. Every record is compared, each with
        hmac.compare_digest, so the time taken says nothing about how close a guess came
        nor which record matched."""
        digest = hash_token(presented)
        found = None
        for record in self.records:
            if hmac.compare_digest(digest, record.sha256):
                found = record
        return found
