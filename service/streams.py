"""What event streams need beyond the database: a wake-up per job, and a limit per key.

`EventHub`: one Redis subscription per API process to the job notices (persistence.notices),
or with the embedded broker the data directory's notice socket, read on the event loop;
each open stream waits on an `asyncio.Event` of its job and reloads from the database only
when woken, or every `events_safety_reload_s` in case a notice was lost. While Redis does
not answer, or where the socket cannot be made, streams poll every
`events_poll_interval_s` as before.

`StreamLimiter`: how many streams one API key may hold open, counted in Redis (a sorted set
per key, one member per stream with its last refresh) so that every API replica counts the
same streams; a replica that dies leaves members that expire after `STREAM_TTL_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from persistence.notices import MAX_NOTICE_BYTES, channel, is_embedded, is_redis, local_socket
from service.errors import RateLimited

logger = logging.getLogger(__name__)

STREAM_TTL_S = 60.0
"""A stream's place in its key's count lapses this long after its last refresh."""

RECONNECT_S = 1.0
"""How long the hub waits before subscribing again after Redis failed."""


class EventHub:
    """Wakes the streams of a job when a notice for it arrives."""

    def __init__(
        self, broker_url: str, key_prefix: str | None, *, data_dir: Path | None = None
    ) -> None:
        self.url = broker_url if is_redis(broker_url) else None
        self.channel = channel(key_prefix)
        self.socket_path = (
            local_socket(data_dir)
            if self.url is None and data_dir is not None and is_embedded(broker_url)
            else None
        )
        self._socket: socket.socket | None = None
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starts = 0
        self.live = False
        """Whether notices arrive (subscribed and answering); streams poll otherwise."""

    async def start(self) -> None:
        """Subscribe (waiting up to 2 s for the subscription, so that the first stream
        cannot miss a notice), then listen in the background. Each app lifespan starts
        and stops it; with several at once on one loop, the last stop ends it."""
        if self.url is None:
            self._bind_local()
            return
        loop = asyncio.get_running_loop()
        if self._task is not None and self._loop is loop and not self._task.done():
            self._starts += 1
            return
        if self._task is not None and self._loop is not None and self._loop is not loop:
            # A lifespan on another event loop (tests) left it running there.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._task.cancel)
        subscribed = asyncio.Event()
        self._loop, self._starts = loop, 1
        self._task = asyncio.create_task(self._listen(subscribed))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(subscribed.wait(), 2.0)

    async def stop(self) -> None:
        if self._socket is not None:
            self._close_local()
            return
        if self._task is None or self._loop is not asyncio.get_running_loop():
            return
        self._starts -= 1
        if self._starts > 0:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self.live = False

    def _bind_local(self) -> None:
        """Listen on the embedded broker's notice socket, read on this event loop."""
        if self.socket_path is None:
            return
        if self._socket is not None:
            self._starts += 1
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)  # left by an API process that died
            sock.bind(str(self.socket_path))
            sock.setblocking(False)
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(sock.fileno(), self._read_local)
        except OSError as exc:
            sock.close()
            logger.warning("job notices: no socket at %s (%s); streams poll", self.socket_path, exc)
            return
        self._socket, self._starts, self.live = sock, 1, True

    def _read_local(self) -> None:
        assert self._socket is not None
        while True:
            try:
                data = self._socket.recv(MAX_NOTICE_BYTES)
            except OSError:  # nothing more to read (BlockingIOError), or closed
                return
            self._wake(data.decode("utf-8", "replace"))

    def _close_local(self) -> None:
        self._starts -= 1
        if self._starts > 0 or self._socket is None:
            return
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._socket.fileno())
        self._socket.close()
        self._socket = None
        self.live = False
        if self.socket_path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.socket_path)

    @contextlib.contextmanager
    def watch(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever a notice for `job_id` arrives (register before loading)."""
        changed = asyncio.Event()
        self._waiters[job_id].add(changed)
        try:
            yield changed
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None:
                waiters.discard(changed)
                if not waiters:
                    del self._waiters[job_id]

    @property
    def open_streams(self) -> int:
        return sum(len(waiters) for waiters in self._waiters.values())

    def _wake(self, job_id: str | None) -> None:
        targets = self._waiters.values() if job_id is None else [self._waiters.get(job_id, ())]
        for waiters in targets:
            for changed in waiters:
                changed.set()

    async def _listen(self, subscribed: asyncio.Event) -> None:
        import redis.asyncio as aioredis
        from redis.exceptions import RedisError

        assert self.url is not None
        while True:
            client = aioredis.Redis.from_url(self.url, socket_connect_timeout=1.0)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                while True:
                    # get_message(timeout) returns None when idle; a dead server raises.
                    message = await pubsub.get_message(timeout=5.0)
                    if message is None:
                        continue
                    if message["type"] == "subscribe":
                        if not self.live:
                            self.live = True
                            subscribed.set()
                            self._wake(None)  # anything missed while down: reload now
                        continue
                    if message["type"] == "message":
                        data = message["data"]
                        self._wake(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                if self.live:
                    logger.warning("job notices: subscription lost (%s); streams poll", exc)
                self.live = False
                subscribed.set()  # start() stops waiting; streams poll meanwhile
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(RECONNECT_S)


_ACQUIRE = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])) + 1)
return 1
"""


class StreamLimiter:
    """At most `limit` open streams per caller identity, across API replicas when the
    broker is Redis (else in this process). Redis errors fall back to this process's count."""

    def __init__(self, broker_url: str, limit: int, *, key_prefix: str | None) -> None:
        self.limit = limit
        self.key_prefix = f"{key_prefix or ''}torchport:streams:"
        self._local: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._client: Any = None
        if is_redis(broker_url):
            import redis

            self._client = redis.Redis.from_url(
                broker_url, socket_timeout=0.5, socket_connect_timeout=0.5
            )
            self._script = self._client.register_script(_ACQUIRE)
            self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)

    def acquire(self, identity: str) -> str:
        """Count one more stream of `identity`; returns its ticket for `refresh`/`release`.

        Raises:
            RateLimited: `identity` has `limit` streams open (details.reason too_many_streams).
        """
        ticket = uuid.uuid4().hex
        if self._client is not None:
            try:
                allowed = self._script(
                    keys=[self.key_prefix + identity],
                    args=[time.time(), STREAM_TTL_S, self.limit, ticket],
                )
            except self._errors:
                logger.warning("stream limits: Redis did not answer; counting per process")
            else:
                if not int(allowed):
                    self._refuse()
                return "r:" + ticket
        with self._lock:
            if self._local[identity] >= self.limit:
                self._refuse()
            self._local[identity] += 1
        return "l:" + ticket

    def refresh(self, identity: str, ticket: str) -> None:
        """Keep a long stream counted (call well within `STREAM_TTL_S`)."""
        if ticket.startswith("r:"):
            with contextlib.suppress(*self._errors):
                self._client.zadd(self.key_prefix + identity, {ticket[2:]: time.time()}, xx=True)

    def release(self, identity: str, ticket: str) -> None:
        """The stream ended."""
        if ticket.startswith("r:"):
            with contextlib.suppress(*self._errors):
                self._client.zrem(self.key_prefix + identity, ticket[2:])
            return
        with self._lock:
            self._local[identity] = max(0, self._local[identity] - 1)

    def _refuse(self) -> None:
        raise RateLimited(
            f"this API key already has {self.limit} event streams open; close one, or poll "
            "GET /v1/exports/{id}",
            retry_after_s=5.0,
            details={"reason": "too_many_streams", "limit": self.limit},
        )
