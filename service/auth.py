"""API keys (only their SHA-256 is stored), bearer authentication and per-key rate limits."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from persistence.models import ApiKey, utcnow
from service.errors import NotFound, RateLimited, Unauthorized

logger = logging.getLogger(__name__)

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
        webhook_secret=secrets.token_urlsafe(32),
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


class RateLimiter:
    """A token bucket per identity: `per_minute` tokens a minute, refilled continuously, at
    most `capacity` (default `per_minute`) held."""

    def __init__(self, per_minute: int, capacity: int | None = None) -> None:
        self.capacity = float(capacity or per_minute)
        self.rate = per_minute / 60.0
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, identity: str, cost: float = 1.0) -> float | None:
        """Take `cost` tokens of `identity`'s bucket if it holds one (`cost` 0 only looks);
        None when it did, else the seconds until one token is back."""
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(identity, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - last) * self.rate)
            if tokens < 1.0:
                self._buckets[identity] = (tokens, now)
                return (1.0 - tokens) / self.rate
            self._buckets[identity] = (tokens - cost, now)
            return None

    def check(self, identity: str) -> None:
        """Take one token for `identity`.

        Raises:
            RateLimited: the bucket is empty; `Retry-After` says when one token is back.
        """
        _check(self, identity)


class Limiter(Protocol):
    """What the API needs of a rate limiter."""

    def take(self, identity: str, cost: float = 1.0) -> float | None:
        """Take `cost` tokens of `identity`'s bucket, or say how long until one is back."""
        ...

    def check(self, identity: str) -> None:
        """Take one request of `identity`'s budget, or raise RateLimited."""
        ...


def _check(limiter: Limiter, identity: str) -> None:
    wait = limiter.take(identity)
    if wait is not None:
        raise RateLimited("too many requests for this API key", retry_after_s=wait)


_TOKEN_BUCKET = """
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or capacity
local at = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - at) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - cost
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) + 1)
return {allowed, tostring((1 - tokens) / rate)}
"""


class RedisRateLimiter:
    """The same token buckets, kept in Redis under `<key_prefix>torchport:<name>:<identity>`
    (one Lua script per request, on Redis's clock), so every API replica draws from one
    bucket. If Redis does not answer, this process's own bucket stands in (and a warning
    is logged)."""

    def __init__(
        self,
        url: str,
        per_minute: int,
        *,
        key_prefix: str = "",
        capacity: int | None = None,
        name: str = "ratelimit",
    ) -> None:
        import redis

        self._local = RateLimiter(per_minute, capacity)
        self.capacity = self._local.capacity
        self.rate = self._local.rate
        self.key_prefix = f"{key_prefix}torchport:{name}:"
        self._client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._script = self._client.register_script(_TOKEN_BUCKET)
        self._errors = (redis.RedisError, OSError)

    def take(self, identity: str, cost: float = 1.0) -> float | None:
        """Take `cost` tokens of `identity`'s shared bucket (`cost` 0 only looks); None
        when it did, else the seconds until one token is back."""
        try:
            allowed, retry_after = self._script(
                keys=[self.key_prefix + identity], args=[self.capacity, self.rate, cost]
            )
        except self._errors:
            logger.warning("rate limits: Redis did not answer; limiting per process")
            return self._local.take(identity, cost)
        return None if int(allowed) else float(retry_after)

    def check(self, identity: str) -> None:
        """Take one token for `identity` from the shared bucket.

        Raises:
            RateLimited: the bucket is empty; `Retry-After` says when one token is back.
        """
        _check(self, identity)


def make_rate_limiter(
    broker_url: str,
    per_minute: int,
    *,
    key_prefix: str | None,
    capacity: int | None = None,
    name: str = "ratelimit",
) -> Limiter:
    """Limits shared through Redis when Redis is the broker; per process otherwise (the
    embedded filesystem broker: one API process). `name` tells the buckets of one limit
    from another's in Redis."""
    if broker_url.startswith(("redis://", "rediss://", "unix://")):
        return RedisRateLimiter(
            broker_url, per_minute, key_prefix=key_prefix or "", capacity=capacity, name=name
        )
    return RateLimiter(per_minute, capacity)


def is_loopback(host: str | None) -> bool:
    """Whether a client address is this machine (None: a Unix socket). Names that are not
    addresses count as remote."""
    if host is None:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
