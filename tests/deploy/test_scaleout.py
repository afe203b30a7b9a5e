"""Scale-out: two workers as separate process trees (own sessions, own hostnames) against
one Redis and one PostgreSQL; 40 jobs each run exactly once, spread over both."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from bench.scaleout import Cluster, node_of

JOBS = 40


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_forty_jobs_run_exactly_once_spread_over_two_workers(tmp_path: Path) -> None:
    with Cluster(workers=2, root=tmp_path) as cluster:
        time.sleep(3.0)  # both zygotes warm, so neither worker starts late
        ids = cluster.submit(JOBS)
        cluster.wait(ids, timeout_s=600)
        records = cluster.records()
        trees = {p.pid for p in cluster.processes}

    assert len(trees) == 3  # the API and two workers, each the leader of its own session
    assert sorted(r.id for r in records) == sorted(ids)
    assert Counter(r.status for r in records) == {"succeeded": JOBS}
    assert {r.attempts for r in records} == {1}
    assert {r.running_events for r in records} == {1}
    per_node = Counter(node_of(r.worker) for r in records)
    assert set(per_node) == {"node-a", "node-b"}
    assert min(per_node.values()) >= JOBS // 5
