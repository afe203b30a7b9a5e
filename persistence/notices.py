"""Job notices: "job X has new events", published on Redis after each commit that adds one.

The database stays the record of every event; a notice only wakes the event streams that
follow the job (service.streams), so an event reaches a following client within
milliseconds and open streams do not poll the database. Notices are best effort: a stream
that misses one still reloads every `events_safety_reload_s`.

Every writer of stage events (the API, the workers, the reaper) builds its sessions with
`make_session_factory`, and `publish_after_commit` hooks a publisher onto them: the ids of
the jobs whose `StageEventRow`s a session flushed are published when it commits, and
forgotten when it rolls back. With the embedded filesystem broker there is no Redis: the
API process, the workers and the reaper are on one machine and share the data directory,
so notices travel as datagrams to a UNIX socket in it (`LocalPublisher`, `local_socket`),
which the API process's hub listens on. Where that socket cannot be made (a data
directory path too long for a socket address), streams poll, as with a Redis that does
not answer.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from persistence.models import StageEventRow

logger = logging.getLogger(__name__)

CHANNEL = "torchport:jobs"
"""The pub/sub channel (after the deployment's key prefix); each message is one job id."""

_PENDING = "torchport.notices"
"""Where a session keeps the job ids it will publish on commit (`Session.info`)."""


LOCAL_SOCKET = "notices.sock"
"""The embedded broker's notice socket, in the data directory (mode 0700 there)."""

MAX_SOCKET_PATH = 107
"""Longest path a UNIX socket address holds (sun_path is 108 bytes with its NUL)."""

MAX_NOTICE_BYTES = 256
"""A notice is one job id; longer datagrams are cut to this and ignored."""


class NoticePublisher(Protocol):
    """Sends the ids of jobs with new events to whoever follows them; never raises."""

    def publish(self, job_ids: set[str]) -> None: ...


def is_redis(url: str) -> bool:
    """Whether a broker URL is a Redis server (notices travel on it)."""
    return url.startswith(("redis://", "rediss://", "unix://"))


def is_embedded(url: str) -> bool:
    """Whether a broker URL is the embedded folder broker (notices travel on a local
    socket: every process is on one machine)."""
    return url.startswith("filesystem://")


def channel(key_prefix: str | None) -> str:
    """The channel of a deployment (its broker key prefix first)."""
    return f"{key_prefix or ''}{CHANNEL}"


class Publisher:
    """Publishes job ids on the deployment's channel; never raises."""

    def __init__(self, url: str, key_prefix: str | None) -> None:
        import redis

        self.channel = channel(key_prefix)
        self._client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        self._errors = (redis.RedisError, OSError)
        self._warned_at = 0.0

    def publish(self, job_ids: set[str]) -> None:
        """One message per job id; a Redis that does not answer is logged (once a minute)."""
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for job_id in sorted(job_ids):
                    pipe.publish(self.channel, job_id)
                pipe.execute()
        except self._errors as exc:
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                logger.warning("job notices: Redis did not answer (%s); streams poll", exc)


def fits_socket_address(path: Path) -> bool:
    """Whether a UNIX socket can be bound at `path` (its address holds 107 bytes)."""
    return len(str(path).encode()) <= MAX_SOCKET_PATH


def local_socket(data_dir: Path) -> Path | None:
    """Where the embedded broker's notices go: `<data_dir>/notices.sock`, or None when
    the path is too long for a socket address (streams then poll)."""
    path = data_dir.expanduser().absolute() / LOCAL_SOCKET
    return path if fits_socket_address(path) else None


class LocalPublisher:
    """Notices as datagrams to the API process's socket (the embedded broker: one machine).

    Non-blocking: with no listener (the API is down) or a full queue a notice is dropped,
    and streams find the events at their next reload, as with a lost Redis message."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.setblocking(False)

    def publish(self, job_ids: set[str]) -> None:
        for job_id in sorted(job_ids):
            try:
                self._socket.sendto(job_id.encode()[:MAX_NOTICE_BYTES], self.path)
            except OSError:  # no listener (ENOENT, ECONNREFUSED), a full queue (EAGAIN)
                return


def make_publisher(
    broker_url: str, key_prefix: str | None, data_dir: Path | None = None
) -> NoticePublisher | None:
    """A publisher on Redis when the broker is Redis; with the embedded broker, one to the
    data directory's notice socket (None without `data_dir` or when it cannot have one);
    None for any other broker (streams poll)."""
    if is_redis(broker_url):
        return Publisher(broker_url, key_prefix)
    if not is_embedded(broker_url) or data_dir is None:
        return None
    path = local_socket(data_dir)
    return LocalPublisher(path) if path is not None else None


def publish_after_commit(sessions: sessionmaker[Session], publisher: NoticePublisher) -> None:
    """Publish, after each commit of a session from `sessions`, the jobs it added events to."""

    def flushed(session: Session, context: Any) -> None:
        for row in session.new:
            if isinstance(row, StageEventRow):
                session.info.setdefault(_PENDING, set()).add(row.job_id)

    def committed(session: Session) -> None:
        pending = session.info.pop(_PENDING, None)
        if pending:
            publisher.publish(pending)

    def rolled_back(session: Session) -> None:
        session.info.pop(_PENDING, None)

    # In after_flush, `session.new` still lists the rows the flush inserted.
    event.listen(sessions, "after_flush", flushed)
    event.listen(sessions, "after_commit", committed)
    event.listen(sessions, "after_rollback", rolled_back)
