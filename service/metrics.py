"""Prometheus metrics of the API: request counts and latencies, and what operators alert
and scale on — jobs by status, queue depth and the age of the oldest queued job, worker
processes busy and idle, job and stage durations, target conversions, cache hits.

Everything but the request metrics is read from the database at scrape time, so it is the
same from every API replica, whatever process ran or ended a job (docs/service.md,
*Metrics*): bounded queries only — the queued jobs through an index, the workers' rows,
the workers of running jobs, and the totals finished jobs left (`persistence.job_metrics`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from persistence import job_metrics
from persistence.models import Job, utcnow
from persistence.queue import EXPORT_QUEUES
from persistence.worker_processes import by_queue

_HISTOGRAM_HELP = {
    job_metrics.JOB_DURATION: "Finished jobs by outcome and error code: seconds from "
    "submission to end (cache hits are not observed).",
    job_metrics.STAGE_DURATION: "Seconds of each export stage a worker ran, by stage.",
}
_HISTOGRAM_LABELS = {
    job_metrics.JOB_DURATION: ["outcome", "code"],
    job_metrics.STAGE_DURATION: ["stage"],
}
_COUNTERS = {
    job_metrics.TARGET_CONVERSIONS: (
        "Deployment targets of finished jobs by target and result.",
        ["target", "result"],
    ),
    job_metrics.CACHE_HITS: ("Submissions answered from the cache.", []),
}


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


class QueueCollector(Collector):
    """`torchport_queue_depth{queue}`, `torchport_queue_oldest_age_seconds{queue}` (one
    query on `ix_jobs_status_queue_created`, reading only the queued jobs) and
    `torchport_workers{queue, state}` (worker processes seen within the heartbeat timeout,
    `busy` or `idle`)."""

    def __init__(self, sessions: sessionmaker[Session], heartbeat_timeout_s: float) -> None:
        self._sessions = sessions
        self._timeout = timedelta(seconds=heartbeat_timeout_s)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "torchport_queue_depth", "Jobs waiting for a worker, by queue.", labels=["queue"]
        )
        age = GaugeMetricFamily(
            "torchport_queue_oldest_age_seconds",
            "Seconds since the oldest waiting job of the queue was submitted (0: none waits).",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "torchport_workers",
            "Export worker processes alive (seen within the heartbeat timeout) by the queues "
            "they consume, busy running a job or idle.",
            labels=["queue", "state"],
        )
        now = utcnow()
        with self._sessions() as session:
            queued = session.execute(
                select(Job.queue, func.count(), func.min(Job.created_at))
                .where(Job.status == "queued")
                .group_by(Job.queue)
            ).all()
            processes = by_queue(session, now - self._timeout)
        waiting = {queue: (int(n), oldest) for queue, n, oldest in queued}
        for queue in sorted({*EXPORT_QUEUES, *waiting}):
            n, oldest = waiting.get(queue, (0, None))
            depth.add_metric([queue], n)
            age.add_metric([queue], 0.0 if oldest is None else (now - oldest).total_seconds())
        for queue in sorted({*EXPORT_QUEUES, *processes}):
            for state in ("busy", "idle"):
                workers.add_metric([queue, state], processes.get(queue, {}).get(state, 0))
        yield from (depth, age, workers)


class JobTotalsCollector(Collector):
    """The histograms and counters finished jobs added to (`persistence.job_metrics`)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def collect(self) -> Iterator[Metric]:
        with self._sessions() as session:
            totals = job_metrics.read_totals(session)
        yield from self._histograms(totals)
        for family, (help_text, labels) in _COUNTERS.items():
            counter = CounterMetricFamily(family, help_text, labels=labels)
            for total in totals:
                if total.family == family and total.sample == "total":
                    counter.add_metric([total.labels.get(k, "") for k in labels], total.value)
            if not labels and not counter.samples:
                counter.add_metric([], 0.0)
            yield counter

    @staticmethod
    def _histograms(totals: list[job_metrics.Total]) -> Iterator[HistogramMetricFamily]:
        for family, bounds in job_metrics.HISTOGRAMS.items():
            labels = _HISTOGRAM_LABELS[family]
            series: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
            buckets: dict[tuple[str, ...], dict[float, float]] = defaultdict(
                lambda: defaultdict(float)
            )
            for total in (t for t in totals if t.family == family):
                key = tuple(total.labels.get(k, "") for k in labels)
                if total.sample == "bucket":
                    buckets[key][float(total.labels["le"])] += total.value
                else:
                    series[key][total.sample] = total.value
            histogram = HistogramMetricFamily(family, _HISTOGRAM_HELP[family], labels=labels)
            for key, sums in sorted(series.items()):
                own = buckets[key]
                cumulative = [
                    (
                        job_metrics.bound_label(bound),
                        sum(n for le, n in own.items() if le <= bound),
                    )
                    for bound in bounds
                ]
                histogram.add_metric(list(key), cumulative, sums.get("sum", 0.0))
            yield histogram


class Metrics:
    """The metrics of one app, in their own registry (tests build many apps)."""

    def __init__(self, sessions: sessionmaker[Session], heartbeat_timeout_s: float) -> None:
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
        self.registry.register(QueueCollector(sessions, heartbeat_timeout_s))
        self.registry.register(JobTotalsCollector(sessions))
