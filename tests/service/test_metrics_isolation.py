"""`/metrics` against tenants (issue 33, items 4 and 5), on real PostgreSQL and Redis.

Found by an attack run: each key a job wrote into its `report.targets` became a label
value of the persisted totals (3,000 series per job, kept for good), anyone could send
invented HTTP methods to add request series, and `/metrics` needed no key while every
scrape scanned the database (8 parallel anonymous scrapes slowed another tenant's
`GET` of its job from 12 ms to 677 ms). Values and codes, not wording.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event, func, select

from persistence import worker_processes
from persistence.database import transaction
from persistence.lifecycle import claim, finish
from persistence.models import MetricTotal
from schemas import ErrorBody
from service.app import build_state, create_app
from service.auth import create_key
from service.deps import AppState
from tests.service.conftest import LOOPBACK_CLIENT, _truncate, make_settings
from tests.service.test_exports import submit
from tests.service.test_metrics import report

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
CONVERSIONS = "torchport_target_conversions_total"
TOKEN = "mt-" + "7" * 40
FIXED = {
    "target": {"onnx", "aoti", "executorch", "other"},
    "result": {"succeeded", "failed", "skipped", "other"},
    "queue": {"cpu", "gpu", "other"},
    "method": {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"},
}


def parse(text: str) -> Samples:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def label_values(samples: Samples, label: str) -> set[str]:
    return {dict(labels)[label] for _, labels in samples if label in dict(labels)}


def scrape_until(
    client: TestClient, ready: Callable[[Samples], bool], timeout: float = 15.0
) -> Samples:
    """Scrape until the snapshot shows what `ready` waits for (it is refreshed
    every `TORCHPORT_METRICS_REFRESH_INTERVAL_S`)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get("/metrics")
        assert answer.status_code == 200
        samples = parse(answer.text)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


@contextmanager
def app(
    tmp_path: Path,
    pg_url: str,
    redis_prefix: str,
    address: tuple[str, int] = LOOPBACK_CLIENT,
    *,
    tenant: bool = False,
    **overrides: Any,
) -> Iterator[tuple[AppState, TestClient, str]]:
    """An app with these settings; `tenant`: an API key exists before it starts, and its
    secret is the third item."""
    settings = make_settings(tmp_path, pg_url, redis_prefix, **overrides)
    state = build_state(settings)
    _truncate(state)
    secret = ""
    if tenant:
        with transaction(state.sessions) as session:
            secret = create_key(session, "tenant").secret
    try:
        with TestClient(create_app(state=state), client=address) as client:
            yield state, client, secret
    finally:
        _truncate(state)
        state.engine.dispose()


@pytest.fixture
def fast(tmp_path: Path, pg_url: str, redis_prefix: str) -> Iterator[tuple[AppState, TestClient]]:
    """An app whose metrics snapshot is refreshed every 50 ms."""
    with app(tmp_path, pg_url, redis_prefix, metrics_refresh_interval_s=0.05) as (state, client, _):
        yield state, client


def _finish_with_targets(state: AppState, client: TestClient, name: str, targets: dict) -> None:
    job_id = submit(client, model=(f"{name}.py", f"model = '{name}'\n".encode())).json()["id"]
    assert claim(state.sessions, job_id, "w") is not None
    done = report(("loading", 0.1), targets=targets)
    assert finish(
        state.sessions, job_id, "w", status="succeeded", error=None, artifacts=[], report=done
    )


def test_job_written_target_names_never_become_label_values(
    fast: tuple[AppState, TestClient],
) -> None:
    state, client = fast
    sizes = []
    for job in range(2):
        invented = {f"t{job}-{i}": "succeeded" for i in range(3000)}
        # A name too long for the totals' key column must not fail the job's end either.
        invented |= {"x" * 300 + str(job): "failed", "onnx": "succeeded"}
        _finish_with_targets(state, client, f"job{job}", invented)
        wanted = 2 * (job + 1)
        samples = scrape_until(
            client,
            lambda s, n=wanted: value(s, CONVERSIONS, target="onnx", result="succeeded") == n,
        )
        conversions = {k: v for k, v in samples.items() if k[0] == CONVERSIONS}
        assert label_values(conversions, "target") <= FIXED["target"]
        assert label_values(conversions, "result") <= FIXED["result"]
        sizes.append(len(samples))
    assert value(samples, CONVERSIONS, target="other", result="succeeded") == 6000
    assert value(samples, CONVERSIONS, target="other", result="failed") == 2
    # Whatever jobs write, the same series: a second hostile job adds none.
    assert sizes[0] == sizes[1]
    with state.sessions() as session:
        rows = session.scalar(
            select(func.count())
            .select_from(MetricTotal)
            .where(MetricTotal.family == "torchport_target_conversions")
        )
    assert rows is not None and rows <= len(FIXED["target"]) * len(FIXED["result"])


def test_totals_persisted_with_invented_labels_fold_into_other(
    fast: tuple[AppState, TestClient],
) -> None:
    """Totals an earlier release wrote with job-chosen labels are served as `other` and
    folded in the table, so they stop costing every refresh."""
    state, client = fast
    with transaction(state.sessions) as session:
        session.add_all(
            MetricTotal(
                family="torchport_target_conversions",
                sample="total",
                labels=json.dumps({"result": "succeeded", "target": f"legacy-{i}"}, sort_keys=True),
                value=2.0,
            )
            for i in range(2000)
        )
    samples = scrape_until(
        client, lambda s: value(s, CONVERSIONS, target="other", result="succeeded") == 4000
    )
    assert label_values(samples, "target") <= FIXED["target"]
    with state.sessions() as session:
        assert (session.scalar(select(func.count()).select_from(MetricTotal)) or 0) <= 12


def test_invented_http_methods_and_queues_fold_into_other(
    fast: tuple[AppState, TestClient],
) -> None:
    state, client = fast
    for i in range(60):
        client.request(f"BREW{i}", "/healthz")
        worker_processes.beat(state.sessions, f"host:{i}", "host", [f"queue-{i}"])
    samples = scrape_until(
        client, lambda s: value(s, "torchport_workers", queue="other", state="idle") == 60
    )
    assert label_values(samples, "method") <= FIXED["method"]
    assert label_values(samples, "queue") <= FIXED["queue"]
    brewed = sum(
        n
        for (name, labels), n in samples.items()
        if name == "torchport_http_requests_total" and dict(labels)["method"] == "other"
    )
    assert brewed == 60


def test_a_scrape_reads_a_snapshot_not_the_database(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    # No refresh falls inside the test: the one at start read the database, scrapes must not.
    with app(tmp_path, pg_url, redis_prefix, metrics_refresh_interval_s=3600) as (state, client, _):
        for n in range(5):
            submit(client, model=(f"m{n}.py", f"model = {n}\n".encode()))
        _scrape_without_queries(state, client)


def _scrape_without_queries(state: AppState, client: TestClient) -> None:
    client.get("/metrics")  # the key check's cache is warm
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    event.listen(state.engine, "before_cursor_execute", record)
    try:
        for _ in range(20):
            assert client.get("/metrics").status_code == 200
    finally:
        event.remove(state.engine, "before_cursor_execute", record)
    read = [s for s in statements if any(t in s for t in ("jobs", "metric_totals", "worker"))]
    assert read == []
    assert len(statements) <= 1  # at most the key check, cached for 2 s


def test_the_snapshot_follows_the_database_within_the_refresh_interval(
    fast: tuple[AppState, TestClient],
) -> None:
    _, client = fast
    submit(client)
    samples = scrape_until(client, lambda s: value(s, "torchport_queue_depth", queue="cpu") == 1)
    assert value(samples, "torchport_queue_depth", queue="cpu") == 1
    assert value(samples, "torchport_jobs", status="queued") == 1


def _error(answer: Any) -> ErrorBody:
    return ErrorBody.model_validate(answer.json())


def test_anonymous_scrapes_are_refused_when_keys_are_configured(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    remote = ("198.51.100.20", 40000)
    with app(tmp_path, pg_url, redis_prefix, remote, tenant=True, metrics_token=TOKEN) as (
        _,
        client,
        tenant,
    ):
        for headers in (
            {},
            {"Authorization": f"Bearer {tenant}"},  # a tenant's key is no metrics token
            {"Authorization": "Bearer " + TOKEN[:-1] + "8"},
            {"Authorization": TOKEN},
        ):
            answer = client.get("/metrics", headers=headers)
            assert answer.status_code == 401, headers
            assert _error(answer).code == "unauthorized"
        answer = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200
        assert "torchport_jobs" in {f.name for f in text_string_to_metric_families(answer.text)}
        # Tenants keep their own API: the token opens `/metrics` only.
        listed = client.get("/v1/exports", headers={"Authorization": f"Bearer {TOKEN}"})
        assert listed.status_code == 401


def test_with_keys_and_no_metrics_token_only_this_machine_may_scrape(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    remote = ("198.51.100.21", 40000)
    with app(tmp_path, pg_url, redis_prefix, remote, tenant=True) as (_, client, tenant):
        for headers in ({}, {"Authorization": f"Bearer {tenant}"}):
            answer = client.get("/metrics", headers=headers)
            assert answer.status_code == 403
            assert _error(answer).code == "forbidden"
            assert _error(answer).details["reason"] == "metrics_token_not_set"
    with app(tmp_path, pg_url, redis_prefix, tenant=True) as (_, local, _):
        proxied = local.get("/metrics", headers={"X-Forwarded-For": "127.0.0.1"})
        assert proxied.status_code == 403
        assert _error(proxied).details["reason"] == "metrics_token_not_set"
        assert local.get("/metrics").status_code == 200


def test_a_set_metrics_token_is_needed_even_without_keys(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    with app(tmp_path, pg_url, redis_prefix, metrics_token=TOKEN) as (_, client, _):
        assert client.get("/metrics").status_code == 401
        ok = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200


def test_guessing_the_metrics_token_counts_as_failed_authentication(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    remote = ("198.51.100.22", 40000)
    with app(
        tmp_path,
        pg_url,
        redis_prefix,
        remote,
        tenant=True,
        metrics_token=TOKEN,
        auth_failures_burst=3,
    ) as (_, client, _):
        codes = [
            client.get("/metrics", headers={"Authorization": f"Bearer guess-{i}"}).status_code
            for i in range(4)
        ]
        assert codes == [401, 401, 401, 429]
        blocked = client.get("/metrics", headers={"Authorization": "Bearer guess-4"})
        assert _error(blocked).details["reason"] == "auth_failures"
        # As for API keys, the right token is answered whatever its address's failures.
        ok = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200
