"""Totals of finished jobs for `/metrics`: job durations by outcome and error code, stage
durations, target conversions, cache hits.

A job ends in one of several processes — a worker (`lifecycle.finish`, `fail_job`), the
API's reaper (a lost worker), the API itself (a queued job canceled, a cache hit) — and
the API, which serves `/metrics`, never imports the worker or torch. So the process that
ends a job adds what it observed to the table `metric_totals` in the very transaction
that ends the job: a job is counted once, whatever process or replica ended it, and every
API replica reads the same totals into its metrics snapshot (one small table: a row per
sample, bounded by the label values, never by the number of jobs).

Label values come from the contract's fixed sets (job statuses, error codes, stages, target
names and results), never from what a job wrote: a value outside its set is counted as
`other` (`fold`), so a report naming thousands of invented targets adds to one series.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import get_args

from sqlalchemy import delete, select, tuple_
from sqlalchemy.orm import Session, sessionmaker

from persistence.database import transaction, upsert
from persistence.models import MetricTotal
from schemas import ERROR_CODES, STAGES, ReportDocument, TargetName, TargetResult

JOB_DURATION = "torchport_job_duration_seconds"
"""Histogram {outcome, code}: submission to end of each finished job (cache hits aside)."""
STAGE_DURATION = "torchport_stage_duration_seconds"
"""Histogram {stage}: each stage a worker ran, from the job's report."""
TARGET_CONVERSIONS = "torchport_target_conversions"
"""Counter {target, result}: each deployment target of a job's report."""
CACHE_HITS = "torchport_cache_hits"
"""Counter: submissions answered from the cache."""

INF = math.inf
JOB_BUCKETS: tuple[float, ...] = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, INF)
STAGE_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, INF,
)  # fmt: skip
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    JOB_DURATION: JOB_BUCKETS,
    STAGE_DURATION: STAGE_BUCKETS,
}


def bound_label(bound: float) -> str:
    """A bucket's upper bound as Prometheus writes `le` (`0.5`, `10.0`, `+Inf`)."""
    return "+Inf" if bound == INF else repr(float(bound))


OTHER = "other"
"""The label value every value outside its label's fixed set is counted under."""
LABEL_VALUES: dict[str, frozenset[str]] = {
    "outcome": frozenset(("succeeded", "failed", "canceled")),
    "code": frozenset(("", *ERROR_CODES)),
    "stage": frozenset(STAGES),
    "target": frozenset(get_args(TargetName)),
    "result": frozenset(get_args(TargetResult.model_fields["status"].annotation)),
}
"""The values each label of the totals may take (the contract's own sets)."""
_BOUND_LABELS = {family: {bound_label(b) for b in bounds} for family, bounds in HISTOGRAMS.items()}


def fold(family: str, labels: Mapping[str, str]) -> dict[str, str]:
    """The labels a sample is counted under: each value outside its label's fixed set is
    `other`, and a bucket bound the family does not have is its last bucket, `+Inf`."""
    folded: dict[str, str] = {}
    for name, value in labels.items():
        if name == "le":
            folded[name] = value if value in _BOUND_LABELS.get(family, ()) else "+Inf"
        else:
            folded[name] = value if value in LABEL_VALUES.get(name, ()) else OTHER
    return folded


def _labels(values: Mapping[str, str]) -> str:
    return json.dumps(dict(values), sort_keys=True, separators=(",", ":"))


@dataclass
class Tally:
    """Additions to the totals, gathered before they are written in one statement."""

    additions: dict[tuple[str, str, str], float] = field(default_factory=lambda: defaultdict(float))

    def count(self, family: str, labels: Mapping[str, str], amount: float = 1.0) -> None:
        """Add to a counter (labels folded to their fixed sets)."""
        self.add(family, "total", labels, amount)

    def observe(self, family: str, labels: Mapping[str, str], value: float) -> None:
        """Add one observation to a histogram: its count, its sum and its own bucket."""
        bound = next(b for b in HISTOGRAMS[family] if value <= b)
        self.add(family, "count", labels, 1)
        self.add(family, "sum", labels, value)
        self.add(family, "bucket", {**labels, "le": bound_label(bound)}, 1)

    def add(self, family: str, sample: str, labels: Mapping[str, str], amount: float) -> None:
        """Add to one sample, its labels folded to their fixed sets (`fold`)."""
        self.additions[(family, sample, _labels(fold(family, labels)))] += amount


def add(session: Session, tally: Tally) -> None:
    """Add the tally to the totals: one upsert, rows in key order (two jobs ending at once
    lock the rows they share in the same order, so they never deadlock)."""
    if not tally.additions:
        return
    rows = [
        {"family": family, "sample": sample, "labels": labels, "value": value}
        for (family, sample, labels), value in sorted(tally.additions.items())
    ]
    statement = upsert(session, MetricTotal).values(rows)
    session.execute(
        statement.on_conflict_do_update(
            index_elements=["family", "sample", "labels"],
            set_={"value": MetricTotal.value + statement.excluded.value},
        )
    )


def job_ended(
    session: Session,
    *,
    status: str,
    code: str | None,
    created_at: datetime,
    finished_at: datetime,
    report: ReportDocument | None = None,
) -> None:
    """Count a job that ended: its duration by outcome and error code, and from its report
    (when a worker ran it) each stage it ran and each target it was asked for."""
    tally = Tally()
    duration = max(0.0, (finished_at - created_at).total_seconds())
    tally.observe(JOB_DURATION, {"outcome": status, "code": code or ""}, duration)
    if report is not None:
        for stage in report.stages:
            if stage.status != "skipped":
                tally.observe(STAGE_DURATION, {"stage": stage.name}, stage.duration_s)
        for target, result in report.targets.items():
            tally.count(TARGET_CONVERSIONS, {"target": target, "result": result.status})
    add(session, tally)


def cache_hit(session: Session) -> None:
    """Count a submission answered from the cache."""
    tally = Tally()
    tally.count(CACHE_HITS, {})
    add(session, tally)


@dataclass(frozen=True)
class Total:
    """One row of the totals, its labels parsed."""

    family: str
    sample: str
    labels: dict[str, str]
    value: float
    stored_labels: str = ""
    """The labels as the row holds them (its key)."""


def read_totals(session: Session) -> list[Total]:
    """Every row of the totals (a few thousand at most: bounded by the label values; rows
    an earlier release wrote with other values are folded away by `compact`)."""
    rows: Iterable[Sequence[object]] = session.execute(
        select(MetricTotal.family, MetricTotal.sample, MetricTotal.labels, MetricTotal.value)
    ).all()
    return [
        Total(str(family), str(sample), json.loads(str(labels)), float(str(value)), str(labels))
        for family, sample, labels, value in rows
    ]


def is_folded(total: Total) -> bool:
    """Whether a row's labels are already those of its fixed sets (rows an earlier release
    wrote may carry values a job chose)."""
    labels = fold(total.family, total.labels)
    return labels == total.labels and total.stored_labels == _labels(labels)


COMPACT_BATCH = 1000
"""Rows folded per transaction by `compact`."""


def compact(sessions: sessionmaker[Session], stray: Sequence[Total]) -> int:
    """Fold rows whose labels are outside their fixed sets into the rows of their folded
    labels, `COMPACT_BATCH` rows per transaction. Each batch is deleted with `RETURNING`,
    so of two replicas folding the same rows at once only the one that deleted a row adds
    its value. Returns how many rows were folded."""
    folded = 0
    for start in range(0, len(stray), COMPACT_BATCH):
        keys = [(t.family, t.sample, t.stored_labels) for t in stray[start : start + COMPACT_BATCH]]
        with transaction(sessions) as session:
            taken = session.execute(
                delete(MetricTotal)
                .where(tuple_(MetricTotal.family, MetricTotal.sample, MetricTotal.labels).in_(keys))
                .returning(
                    MetricTotal.family, MetricTotal.sample, MetricTotal.labels, MetricTotal.value
                )
            ).all()
            tally = Tally()
            for family, sample, labels, value in taken:
                tally.add(str(family), str(sample), json.loads(str(labels)), float(value))
            add(session, tally)
        folded += len(taken)
    return folded
