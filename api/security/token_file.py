"""The tokens file (JSON, hashes only) and the registry the middleware asks on each request.

The file is what `sketchboard token create/list/revoke` edit; the running API re-reads it when
it changes (checked at most once a second), so a revoked token stops working without a restart.
Tokens can also come from the `tokens` setting (hashes in YAML or SKETCHBOARD_TOKENS), for
deployments that configure by environment (compose)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from api.security.scopes import Scope
from api.security.tokens import NAME_RE, TokenRecord, TokenSet, hash_token, new_token

log = logging.getLogger("sketchboard.security")


class TokenFileError(ValueError):
    pass


def read_tokens(path: Path) -> list[TokenRecord]:
    """The file's records; [] when it does not exist. TokenFileError says what is wrong."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise TokenFileError(f"{path}: {exc}") from exc
    entries = raw.get("tokens") if isinstance(raw, dict) else None
    if not isinstance(entries, list):
        raise TokenFileError(f'{path}: expected {{"tokens": [...]}}')
    try:
        return [TokenRecord.from_dict(entry) for entry in entries]
    except ValueError as exc:
        raise TokenFileError(f"{path}: {exc}") from exc


def write_tokens(path: Path, records: Iterable[TokenRecord]) -> None:
    """Atomically (a reader sees the old file or the new one, never half of one), readable by
    the owner only: hashes are not secrets, but there is no reason to show them around."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"tokens": [r.to_dict() for r in records]}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".tokens.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_token(path: Path, name: str, scopes: frozenset[Scope], now_ms: int) -> str:
    """Add a token to the file and return it: the only moment it exists in clear."""
    if not NAME_RE.match(name):
        raise TokenFileError(f"token name {name!r}: 1-64 characters of A-Z a-z 0-9 _ . : -")
    records = read_tokens(path)
    if any(r.name == name for r in records):
        raise TokenFileError(f"a token named {name!r} exists already (revoke it first, or pick another name)")
    token = new_token()
    write_tokens(path, [*records, TokenRecord(name, hash_token(token), scopes, now_ms)])
    return token


def revoke_token(path: Path, name: str) -> None:
    records = read_tokens(path)
    kept = [r for r in records if r.name != name]
    if len(kept) == len(records):
        raise TokenFileError(f"no token named {name!r} in {path}")
    write_tokens(path, kept)  # an empty file still means "tokens required" (see TokenRegistry)


class TokenRegistry:
    """The tokens in force and whether the API requires one.

    A token is required when the service is bound beyond loopback (`force`), when the settings
    list tokens, or when the tokens file exists, even empty: revoking the last token must lock
    the service, not open it again. Delete the file to go back to open (loopback only)."""

    def __init__(self, static: Iterable[TokenRecord] = (), path: Path | None = None, *, force: bool = False,
                 reload_every_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._static = tuple(static)
        self._path = path
        self._force = force
        self._every = reload_every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._checked_at: float | None = None
        self._stamp: tuple | None = None
        self._file: tuple[TokenRecord, ...] = ()
        self._file_exists = False
        self._refresh()

    @classmethod
    def open(cls) -> TokenRegistry:
        """No tokens, nothing required: the loopback default (and the tests' apps)."""
        return cls()

    def _refresh(self) -> None:
        if self._path is None:
            return
        try:
            st = self._path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp and self._checked_at is not None:
            return
        self._stamp = stamp
        self._file_exists = stamp is not None
        try:
            self._file = tuple(read_tokens(self._path))
        except TokenFileError as exc:
            # Fail closed: a broken file must not open the service. Every token is refused
            # until it is fixed, and the log says why.
            log.error("tokens file unreadable, refusing every token until it is fixed: %s", exc)
            self._file, self._file_exists = (), True

    def state(self) -> tuple[bool, TokenSet]:
        now = self._clock()
        with self._lock:
            if self._checked_at is None or now - self._checked_at >= self._every:
                self._refresh()
                self._checked_at = now
            records = self._static + self._file
            return (self._force or bool(self._static) or self._file_exists), TokenSet.of(records)

    @property
    def required(self) -> bool:
        return self.state()[0]

    def count(self) -> int:
        return len(self.state()[1])
