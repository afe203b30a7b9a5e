"""Prometheus metrics of the API: request counts and latencies, jobs by status.

Job counts are read from the database at scrape time, so they are right with any number
of API replicas and workers.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from persistence.models import Job


class JobCountCollector(Collector):
    """`torchport_jobs{status}`: jobs in the database by status."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("torchport_jobs", "Jobs by status.", labels=["status"])
        with self._sessions() as session:
            rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
        counts = {status: 0 for status in ("queued", "running", "succeeded", "failed", "canceled")}
        counts.update({status: int(n) for status, n in rows})
        for status, n in sorted(counts.items()):
            family.add_metric([status], n)
        yield family


class Metrics:
    """The metrics of one app, in their own registry (tests build many apps)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "torchport_http_requests",
            "HTTP requests by route, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "torchport_http_request_duration_seconds",
            "HTTP request latency by route.",
            ["route", "method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=self.registry,
        )
        self.submissions = Counter(
            "torchport_submissions",
            "Accepted submissions by outcome (queued, cache_hit, duplicate).",
            ["outcome"],
            registry=self.registry,
        )
        self.registry.register(JobCountCollector(sessions))
