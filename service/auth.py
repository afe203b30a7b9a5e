"""API keys (only their SHA-256 is stored) and bearer authentication; the rate limits of
keys and of failed authentications are in `service.rate_limits`."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from persistence.models import ApiKey, utcnow
from persistence.webhook_secrets import new_secret
from service.errors import NotFound, Unauthorized

KEY_PREFIX = "tp_"
CACHE_TTL_S = 2.0
"""How long a key lookup is reused; a revoked key stops working within this time."""


@dataclass(frozen=True)
class Caller:
    """Who is calling: an API key's id, or `None` when the server has no keys."""

    key_id: str | None
    webhook_secret: str | None = None

    @property
    def identity(self) -> str:
        """The name rate limits are counted under."""
        return self.key_id or "anonymous"


@dataclass(frozen=True)
class CreatedKey:
    """A new key; `secret` is shown once and never stored."""

    id: str
    name: str
    secret: str
    webhook_secret: str


def hash_key(secret: str) -> str:
    """The stored form of a key (keys are 256-bit random, so a plain SHA-256 suffices)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def create_key(session: Session, name: str) -> CreatedKey:
    """Create and store a key named `name`; the caller commits."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=secrets.token_hex(8),
        name=name,
        key_hash=hash_key(secret),
        webhook_secret=new_secret(),
        created_at=utcnow(),
    )
    session.add(key)
    session.flush()
    return CreatedKey(id=key.id, name=name, secret=secret, webhook_secret=key.webhook_secret)


def revoke_key(session: Session, key_id: str) -> None:
    """Revoke a key by id; the caller commits.

    Raises:
        NotFound: no key with that id.
    """
    key = session.get(ApiKey, key_id)
    if key is None:
        raise NotFound(f"no API key {key_id!r}", details={"key_id": key_id})
    if key.revoked_at is None:
        key.revoked_at = utcnow()


def list_keys(session: Session) -> list[ApiKey]:
    """All keys, newest first."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at.desc())))


class Authenticator:
    """Resolves `Authorization: Bearer` headers to callers, with a short-lived cache."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._lock = threading.Lock()
        self._keys_checked_at = -1e9
        self._have_keys = False
        self._cache: dict[str, tuple[float, Caller | None]] = {}

    def keys_configured(self) -> bool:
        """Whether any unrevoked key exists (then every call needs one)."""
        now = time.monotonic()
        with self._lock:
            if now - self._keys_checked_at < CACHE_TTL_S:
                return self._have_keys
        with self._sessions() as session:
            count = session.scalar(
                select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))
            )
        with self._lock:
            self._have_keys = bool(count)
            self._keys_checked_at = now
            return self._have_keys

    def authenticate(self, authorization: str | None) -> Caller:
        """The caller for this header.

        Raises:
            Unauthorized: keys are configured and the header is missing, malformed or
                names no valid key.
        """
        if not self.keys_configured():
            return Caller(key_id=None)
        if not authorization:
            raise Unauthorized("this server needs an API key: Authorization: Bearer <key>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("the Authorization header must be `Bearer <key>`")
        digest = hash_key(token)
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(digest)
        if cached is not None and now - cached[0] < CACHE_TTL_S:
            caller = cached[1]
        else:
            caller = self._lookup(digest)
            with self._lock:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[digest] = (now, caller)
        if caller is None:
            raise Unauthorized("invalid or revoked API key")
        return caller

    def _lookup(self, digest: str) -> Caller | None:
        with self._sessions() as session:
            key = session.scalar(
                select(ApiKey).where(ApiKey.key_hash == digest, ApiKey.revoked_at.is_(None))
            )
            if key is None or not hmac.compare_digest(key.key_hash, digest):
                return None
            return Caller(key_id=key.id, webhook_secret=key.webhook_secret)


FORWARDED_HEADERS = (b"forwarded", b"x-forwarded-for", b"x-real-ip")
"""Headers a proxy adds: a request that carries one came through a proxy."""


def from_this_machine(host: str | None, header_names: Iterable[bytes]) -> bool:
    """Whether a request's client is this machine itself: a loopback peer (or a Unix
    socket), and no proxy header (`FORWARDED_HEADERS`, lower-case as ASGI gives them): a
    proxy on this machine serves someone else."""
    return is_loopback(host) and not any(name in FORWARDED_HEADERS for name in header_names)


def is_loopback(host: str | None) -> bool:
    """Whether a client address is this machine (None: a Unix socket). Names that are not
    addresses count as remote."""
    if host is None:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
