"""`/metrics` after real jobs: API (uvicorn) and a Celery worker with the real sandbox on
PostgreSQL and Redis. The worker records its stages and targets where the API, which never
imports torch, serves them; its presence makes it idle or busy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

from tests.integration.conftest import Stack, api_and_worker, slow_model, wait_until
from tests.service.conftest import MODELS, truncate

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, redis_prefix: str
) -> Iterator[Stack]:
    """API and one worker, on a database without earlier jobs, worker rows or totals."""
    engine = create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://"))
    truncate(engine)
    engine.dispose()
    yield from api_and_worker(tmp_path_factory.mktemp("metrics"), pg_url, redis_prefix + "m:")


def scrape(stack: Stack) -> Samples:
    answer = stack.http.get("/metrics")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_showing(stack: Stack, name: str, expected: float, **labels: str) -> Samples:
    """The first scrape whose snapshot (refreshed every 0.2 s here) shows `name` at
    `expected`: the change it waits for was the last, so the rest shows too."""

    def shown() -> Samples | None:
        samples = scrape(stack)
        return samples if value(samples, name, **labels) == expected else None

    found: Samples = wait_until(shown, 10)
    return found


def test_metrics_after_real_jobs(stack: Stack, tmp_path: Path) -> None:
    idle = wait_until(
        lambda: value(scrape(stack), "torchport_workers", queue="cpu", state="idle") == 1, 120
    )
    assert idle

    model = tmp_path / "metrics_small.py"
    model.write_bytes((MODELS / "service_small.py").read_bytes() + b"\n# metrics\n")
    job = stack.wait_done(stack.submit(model, targets=["onnx"])["id"], timeout=300)
    assert job["status"] == "succeeded", job["error"]
    report = json.loads(stack.http.get(f"/v1/exports/{job['id']}/artifacts/report.json").content)
    failed = stack.wait_done(stack.submit(MODELS / "load_no_model.py")["id"])
    assert failed["error"]["code"] == "model_not_found"
    assert stack.submit(model, targets=["onnx"])["cache_hit"] is True

    samples = scrape_showing(stack, "torchport_cache_hits_total", 1)
    duration = "torchport_job_duration_seconds"
    assert value(samples, f"{duration}_count", outcome="succeeded", code="") == 1
    assert value(samples, f"{duration}_count", outcome="failed", code="model_not_found") == 1
    ran = [s for s in report["stages"] if s["status"] != "skipped"]
    assert {s["name"] for s in ran} >= {"loading", "tracing", "verifying", "converting"}
    for stage in ran:
        name = stage["name"]
        # Two jobs reached loading; only the successful one went further.
        runs = value(samples, "torchport_stage_duration_seconds_count", stage=name)
        assert runs == (2 if name == "loading" else 1), name
        total = value(samples, "torchport_stage_duration_seconds_sum", stage=name)
        assert total >= stage["duration_s"], name
    result = report["targets"]["onnx"]["status"]
    assert value(samples, "torchport_target_conversions_total", target="onnx", result=result) == 1
    assert value(samples, "torchport_cache_hits_total") == 1
    assert value(samples, "torchport_queue_depth", queue="cpu") == 0

    slow = stack.submit(slow_model(tmp_path, 30))["id"]
    stack.wait_running(slow)
    behind = slow_model(tmp_path, 31)
    behind.write_bytes(behind.read_bytes() + b"\n# another job\n")
    waiting = stack.submit(behind)  # behind it: queued
    samples = wait_until(
        lambda: (
            (s := scrape(stack))
            and value(s, "torchport_workers", queue="cpu", state="busy") == 1
            and value(s, "torchport_queue_depth", queue="cpu") == 1  # a snapshot after the submit
            and s
        ),
        10,
    )
    assert value(samples, "torchport_workers", queue="cpu", state="idle") == 0
    assert value(samples, "torchport_queue_depth", queue="cpu") == 1
    assert value(samples, "torchport_queue_oldest_age_seconds", queue="cpu") > 0
    for job_id in (waiting["id"], slow):
        assert stack.http.delete(f"/v1/exports/{job_id}").status_code in (200, 202)
    assert stack.wait_done(slow)["status"] == "canceled"
    samples = scrape_showing(stack, f"{duration}_count", 2, outcome="canceled", code="canceled")
    assert value(samples, f"{duration}_count", outcome="canceled", code="canceled") == 2
    assert value(samples, "torchport_queue_depth", queue="cpu") == 0
