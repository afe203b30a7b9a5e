"""Rate limits: requests per API key, and failed authentications per client address.

The `limits` package counts them with its moving window (each event counts for one window;
at most `amount` events in any window), kept in Redis when Redis is the broker, so every API
replica draws from one count (keys `<TORCHPORT_BROKER_KEY_PREFIX>torchport:<name>/<identity>/…`,
limits' own layout), else in this process's memory (the embedded broker: one API process).

What stays ours, as no library does it for us: the fallback to this process's own count
when Redis does not answer (limits raises; a rate limit must not take the API down with
Redis, so each process then limits alone and logs a warning), and the answer to a refusal:
`RateLimited` with the seconds until the oldest event of the window leaves it
(`Retry-After`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from limits import RateLimitItem, RateLimitItemPerSecond
from limits.errors import StorageError
from limits.storage import MemoryStorage, RedisStorage
from limits.strategies import MovingWindowRateLimiter

from service.errors import RateLimited

logger = logging.getLogger(__name__)

REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""Broker URLs whose Redis also holds the counts."""


class RateLimit:
    """At most `amount` events per identity in any `window_s` seconds."""

    def __init__(
        self,
        amount: int,
        window_s: int,
        *,
        name: str,
        redis_url: str | None = None,
        key_prefix: str = "",
    ) -> None:
        self.item: RateLimitItem = RateLimitItemPerSecond(amount, window_s, namespace=name)
        self._local = MovingWindowRateLimiter(MemoryStorage())
        self._shared: MovingWindowRateLimiter | None = None
        if redis_url is not None:
            storage = RedisStorage(
                redis_url,
                key_prefix=f"{key_prefix}torchport",
                wrap_exceptions=True,
                socket_timeout=0.5,
                socket_connect_timeout=0.5,
            )
            self._shared = MovingWindowRateLimiter(storage)

    @property
    def shared(self) -> bool:
        """Whether the counts are in Redis, for every replica."""
        return self._shared is not None

    def _limiter(self) -> MovingWindowRateLimiter:
        return self._shared or self._local

    def _retry_after(self, limiter: MovingWindowRateLimiter, identity: str) -> float:
        stats = limiter.get_window_stats(self.item, identity)
        return max(0.001, stats.reset_time - time.time())

    def _ask(
        self, question: Callable[[MovingWindowRateLimiter, str], float | None], identity: str
    ) -> float | None:
        """Ask the shared count, or this process's own when Redis does not answer."""
        try:
            return question(self._limiter(), identity)
        except (StorageError, OSError):
            logger.warning("rate limits: Redis did not answer; limiting per process")
            return question(self._local, identity)

    def hit(self, identity: str) -> float | None:
        """Count one event of `identity`: None when it was within the limit (and counted),
        else the seconds until one more is allowed (and not counted)."""
        return self._ask(self._hit, identity)

    def _hit(self, limiter: MovingWindowRateLimiter, identity: str) -> float | None:
        if limiter.hit(self.item, identity):
            return None
        return self._retry_after(limiter, identity)

    def blocked(self, identity: str) -> float | None:
        """Without counting: None when `identity` may have one more event, else the seconds
        until it may."""
        return self._ask(self._blocked, identity)

    def _blocked(self, limiter: MovingWindowRateLimiter, identity: str) -> float | None:
        if limiter.test(self.item, identity):
            return None
        return self._retry_after(limiter, identity)

    def check(self, identity: str) -> None:
        """Count one request of `identity`.

        Raises:
            RateLimited: over the limit; `Retry-After` says when one more is allowed.
        """
        wait = self.hit(identity)
        if wait is not None:
            raise RateLimited("too many requests for this API key", retry_after_s=wait)


def requests_per_key(broker_url: str, per_minute: int, *, key_prefix: str | None) -> RateLimit:
    """`per_minute` requests per API key in any minute; shared through Redis when Redis is
    the broker."""
    return RateLimit(
        per_minute,
        60,
        name="ratelimit",
        redis_url=broker_url if broker_url.startswith(REDIS_SCHEMES) else None,
        key_prefix=key_prefix or "",
    )


def auth_failures_per_address(
    broker_url: str, burst: int, per_minute: int, *, key_prefix: str | None
) -> RateLimit:
    """`burst` failed authentications per client address, each counted for
    `burst / per_minute` minutes (at least a second): `per_minute` a minute on average."""
    return RateLimit(
        burst,
        max(1, math.ceil(60 * burst / per_minute)),
        name="authfail",
        redis_url=broker_url if broker_url.startswith(REDIS_SCHEMES) else None,
        key_prefix=key_prefix or "",
    )
