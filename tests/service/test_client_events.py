"""The Python client follows a job's server-sent events (parsed by httpx-sse) from a real
uvicorn API on PostgreSQL and Redis, while a worker's stage events arrive; and falls back
to polling when the stream is not one."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import httpx
import pytest

from persistence.lifecycle import claim, finish, record_stage
from schemas import JobPublic, StageEvent
from tests.service.test_event_push import Api, _submit, apis, worker_sessions
from torchport.client import Client, Job, TorchportError

__all__ = ["apis", "worker_sessions"]


def test_events_are_followed_to_the_final_job(apis: list[Api], worker_sessions: object) -> None:
    api = apis[0]
    job_id = _submit(api, api.keys[0])
    key = api.keys[0]["Authorization"].removeprefix("Bearer ")
    with Client(api.url, api_key=key) as client:
        job = client.job(job_id)
        seen: list[StageEvent | JobPublic] = []

        def follow() -> None:
            seen.extend(job.events())

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        deadline = time.monotonic() + 10
        while not seen:  # the queued event: the stream is open
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert claim(worker_sessions, job_id, "w") is not None  # type: ignore[arg-type]
        record_stage(
            worker_sessions,  # type: ignore[arg-type]
            job_id,
            "w",
            stage="tracing",
            status="progress",
            fraction=0.5,
            message="line one\nline two",  # two `data:` lines once encoded
        )
        assert finish(worker_sessions, job_id, "w", status="succeeded", error=None, artifacts=[])  # type: ignore[arg-type]
        follower.join(15)
        assert not follower.is_alive()
    stages = [item for item in seen if isinstance(item, StageEvent)]
    assert [(e.stage, e.status) for e in stages][-2:] == [
        ("tracing", "progress"),
        (None, "succeeded"),
    ]
    progress = next(e for e in stages if e.status == "progress")
    assert (progress.fraction, progress.message) == (0.5, "line one\nline two")
    final = seen[-1]
    assert isinstance(final, JobPublic)
    assert (final.id, final.status) == (job_id, "succeeded")
    assert job.status == "succeeded"  # the job object took the final state


def test_an_error_answer_raises_its_code(apis: list[Api]) -> None:
    api = apis[0]
    job_id = _submit(api, api.keys[0])
    other = api.keys[1]["Authorization"].removeprefix("Bearer ")
    with Client(api.url, api_key=other) as client:
        job = Job(client, JobPublic.model_validate({**_job_body(job_id), "status": "running"}))
        with pytest.raises(TorchportError) as info:
            list(job.events())
    assert (info.value.code, info.value.status_code) == ("not_found", 404)


def _job_body(job_id: str, status: str = "running") -> dict[str, object]:
    return {
        "id": job_id,
        "status": status,
        "options": {},
        "created_at": datetime(2026, 1, 1, tzinfo=UTC).isoformat(),
    }


def test_a_stream_that_is_not_one_falls_back_to_polling() -> None:
    requests: list[tuple[str, str | None]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        requests.append((request.url.path, request.headers.get("accept")))
        if request.url.path.endswith("/events"):  # a proxy answering JSON, not a stream
            return httpx.Response(200, json={"not": "a stream"})
        return httpx.Response(200, json=_job_body("j1", "succeeded"))

    with Client("http://torchport.invalid") as client:
        client._http = httpx.Client(
            base_url="http://torchport.invalid", transport=httpx.MockTransport(answer)
        )
        job = Job(client, JobPublic.model_validate(_job_body("j1")))
        assert job.wait(timeout=5, poll_interval=0.01).status == "succeeded"
    assert requests[0] == ("/v1/exports/j1/events", "text/event-stream")
    assert requests[-1][0] == "/v1/exports/j1"
