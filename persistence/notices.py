"""Job notices: "job X has new events", published on Redis after each commit that adds one.

The database stays the record of every event; a notice only wakes the event streams that
follow the job (service.streams), so an event reaches a following client within
milliseconds and open streams do not poll the database. Notices are best effort: a stream
that misses one still reloads every `events_safety_reload_s`.

Every writer of stage events (the API, the workers, the reaper) builds its sessions with
`make_session_factory`, and `publish_after_commit` hooks a publisher onto them: the ids of
the jobs whose `StageEventRow`s a session flushed are published when it commits, and
forgotten when it rolls back. With the embedded filesystem broker there is no Redis and
nothing is published: streams poll (one API process, one worker, one machine).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from persistence.models import StageEventRow

logger = logging.getLogger(__name__)

CHANNEL = "torchport:jobs"
"""The pub/sub channel (after the deployment's key prefix); each message is one job id."""

_PENDING = "torchport.notices"
"""Where a session keeps the job ids it will publish on commit (`Session.info`)."""


def is_redis(url: str) -> bool:
    """Whether a broker URL is a Redis server (the only broker notices travel on)."""
    return url.startswith(("redis://", "rediss://", "unix://"))


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


def make_publisher(broker_url: str, key_prefix: str | None) -> Publisher | None:
    """A publisher when the broker is Redis; None for the embedded broker."""
    return Publisher(broker_url, key_prefix) if is_redis(broker_url) else None


def publish_after_commit(sessions: sessionmaker[Session], publisher: Publisher) -> None:
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
