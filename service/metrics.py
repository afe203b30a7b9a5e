"""Prometheus metrics of the API: request counts and latencies, and what operators alert
and scale on — jobs by status, queue depth and the age of the oldest queued job, worker
processes busy and idle, job and stage durations, target conversions, cache hits.

Everything but the request metrics is read from the database, so it is the same from
every API replica, whatever process ran or ended a job (docs/service.md, *Metrics*). It
is read into a snapshot by the app's background task every
`TORCHPORT_METRICS_REFRESH_INTERVAL_S` (`Metrics.refresh`), never at scrape time: a scrape
renders memory only, so scrapes cannot load the database nor slow the API, however many
arrive. A refresh makes bounded queries only — the queued jobs through an index, the
workers' rows, the workers of running jobs, and the totals finished jobs left
(`persistence.job_metrics`).

Every label value is the trusted side's own: job statuses, queues, HTTP methods and the
contract's error codes, stages, target names and results; any other value, whoever wrote
it, is counted as `other`. So the series are a fixed set, whatever jobs or clients send.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from datetime import datetime, timedelta
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from persistence import job_metrics
from persistence.job_metrics import OTHER
from persistence.models import Job, utcnow
from persistence.queue import EXPORT_QUEUES
from persistence.worker_processes import by_queue
from schemas import JobStatus

logger = logging.getLogger(__name__)

HTTP_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))
"""The `method` label's values (and `other`): a client may send any token as a method."""
JOB_STATUSES: tuple[str, ...] = get_args(JobStatus)
RENDER_TTL_S = 1.0
"""How long one rendering of `/metrics` answers every scrape: parallel scrapes cost one."""

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


def _fold(value: str, allowed: Collection[str]) -> str:
    return value if value in allowed else OTHER


class _Families(Collector):
    """Families read once, for `generate_latest` to render."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def job_counts(session: Session) -> GaugeMetricFamily:
    """`torchport_jobs{status}`: jobs in the database by status."""
    family = GaugeMetricFamily("torchport_jobs", "Jobs by status.", labels=["status"])
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    counts = dict.fromkeys(JOB_STATUSES, 0)
    for status, n in rows:
        key = _fold(str(status), JOB_STATUSES)
        counts[key] = counts.get(key, 0) + int(n)
    for status, n in sorted(counts.items()):
        family.add_metric([status], n)
    return family


def queue_families(
    session: Session, now: datetime, heartbeat_timeout: timedelta
) -> list[GaugeMetricFamily]:
    """`torchport_queue_depth{queue}`, `torchport_queue_oldest_age_seconds{queue}` (one
    query on `ix_jobs_status_queue_created`, reading only the queued jobs) and
    `torchport_workers{queue, state}` (worker processes seen within the heartbeat timeout,
    `busy` or `idle`)."""
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
    queued = session.execute(
        select(Job.queue, func.count(), func.min(Job.created_at))
        .where(Job.status == "queued")
        .group_by(Job.queue)
    ).all()
    processes = by_queue(session, now - heartbeat_timeout)
    waiting: dict[str, int] = defaultdict(int)
    oldest: dict[str, datetime] = {}
    for queue, n, first in queued:
        key = _fold(str(queue), EXPORT_QUEUES)
        waiting[key] += int(n)
        if first is not None and (key not in oldest or first < oldest[key]):
            oldest[key] = first
    for queue in sorted({*EXPORT_QUEUES, *waiting}):
        depth.add_metric([queue], waiting.get(queue, 0))
        since = oldest.get(queue)
        age.add_metric([queue], 0.0 if since is None else (now - since).total_seconds())
    busy_idle: dict[str, dict[str, int]] = defaultdict(lambda: {"busy": 0, "idle": 0})
    for queue, states in processes.items():
        for state in ("busy", "idle"):
            busy_idle[_fold(queue, EXPORT_QUEUES)][state] += states.get(state, 0)
    for queue in sorted({*EXPORT_QUEUES, *busy_idle}):
        for state in ("busy", "idle"):
            workers.add_metric([queue, state], busy_idle[queue][state])
    return [depth, age, workers]


def total_families(totals: list[job_metrics.Total]) -> list[Metric]:
    """The histograms and counters finished jobs added to (`persistence.job_metrics`),
    each row's labels folded to their fixed sets (rows an earlier release wrote may
    hold values a job chose)."""
    folded: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    for total in totals:
        values = job_metrics.fold(total.family, total.labels)
        folded[(total.family, total.sample, tuple(sorted(values.items())))] += total.value
    families: list[Metric] = list(_histograms(folded))
    for family, (help_text, labels) in _COUNTERS.items():
        counter = CounterMetricFamily(family, help_text, labels=labels)
        for (name, sample, items), value in sorted(folded.items()):
            if name == family and sample == "total":
                counter.add_metric([dict(items).get(k, "") for k in labels], value)
        if not labels and not counter.samples:
            counter.add_metric([], 0.0)
        families.append(counter)
    return families


def _histograms(
    folded: dict[tuple[str, str, tuple[tuple[str, str], ...]], float],
) -> Iterator[HistogramMetricFamily]:
    for family, bounds in job_metrics.HISTOGRAMS.items():
        labels = _HISTOGRAM_LABELS[family]
        series: dict[tuple[str, ...], dict[str, float]] = defaultdict(dict)
        buckets: dict[tuple[str, ...], dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for (name, sample, items), value in folded.items():
            if name != family:
                continue
            values = dict(items)
            key = tuple(values.get(k, "") for k in labels)
            if sample == "bucket":
                buckets[key][float(values["le"])] += value
            else:
                series[key][sample] = series[key].get(sample, 0.0) + value
        histogram = HistogramMetricFamily(family, _HISTOGRAM_HELP[family], labels=labels)
        for key, sums in sorted(series.items()):
            own = buckets[key]
            cumulative = [
                (job_metrics.bound_label(bound), sum(n for le, n in own.items() if le <= bound))
                for bound in bounds
            ]
            histogram.add_metric(list(key), cumulative, sums.get("sum", 0.0))
        yield histogram


class Metrics:
    """The metrics of one app: its request metrics in their own registry (tests build
    many apps) and the snapshot of the database-backed ones."""

    def __init__(self, sessions: sessionmaker[Session], heartbeat_timeout_s: float) -> None:
        self._sessions = sessions
        self._heartbeat_timeout = timedelta(seconds=heartbeat_timeout_s)
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
        self._lock = threading.Lock()
        self._snapshot = b""
        self._body: bytes | None = None
        self._body_at = 0.0

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request. `route` is the route's template (or `unmatched`);
        a method outside `HTTP_METHODS` is counted as `other`."""
        method = _fold(method, HTTP_METHODS)
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def refresh(self) -> int:
        """Read the database-backed metrics into the snapshot scrapes are answered from,
        then fold the totals' rows whose labels are outside their fixed sets
        (`job_metrics.compact`); returns how many were folded."""
        now = utcnow()
        with self._sessions() as session:
            families: list[Metric] = [job_counts(session)]
            families += queue_families(session, now, self._heartbeat_timeout)
            totals = job_metrics.read_totals(session)
        families += total_families(totals)
        snapshot = generate_latest(_Families(families))
        folded = 0
        if stray := [total for total in totals if not job_metrics.is_folded(total)]:
            try:  # the snapshot holds them folded already: it is right either way
                folded = job_metrics.compact(self._sessions, stray)
            except Exception:
                logger.exception("folding %d totals failed; trying again later", len(stray))
        with self._lock:
            self._snapshot = snapshot
            self._body = None
        return folded

    def render(self) -> bytes:
        """The Prometheus text of this process's request metrics and the snapshot: memory
        only, no database; one rendering answers every scrape for `RENDER_TTL_S`."""
        now = time.monotonic()
        with self._lock:
            if self._body is not None and now - self._body_at < RENDER_TTL_S:
                return self._body
            snapshot = self._snapshot
        body = generate_latest(self.registry) + snapshot
        with self._lock:
            self._body, self._body_at = body, now
        return body
