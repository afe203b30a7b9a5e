"""`GET /v1/environment`: what the workers recorded at start, the latest per queue; and
`requires` refused at submission when it is not a list of requirements."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, func, select

from persistence.environments import record_environment
from persistence.models import Job, WorkerEnvironmentRow
from schemas import EnvironmentDescription, EnvironmentList, LibraryInfo, TargetSupport
from service.deps import AppState
from tests.service.conftest import model_file

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


@pytest.fixture
def clean(state: AppState) -> Iterator[AppState]:
    with state.engine.begin() as conn:
        conn.execute(delete(WorkerEnvironmentRow))
    yield state
    with state.engine.begin() as conn:
        conn.execute(delete(WorkerEnvironmentRow))


def described(
    torch: str, transformers: str | None, *, torchvision_error: str
) -> EnvironmentDescription:
    return EnvironmentDescription(
        python="3.11.7",
        platform="Linux",
        torchport="0.1.0",
        torch=torch,
        libraries=[
            LibraryInfo(name="torch", version=torch, model_library=True, imports=True),
            LibraryInfo(
                name="torchvision",
                version="0.28.0",
                model_library=True,
                imports=False,
                error=torchvision_error,
            ),
            LibraryInfo(
                name="transformers",
                version=transformers,
                model_library=True,
                imports=transformers is not None,
                error=None if transformers else "not installed",
            ),
            LibraryInfo(name="rich", version="14.0.0", modules=["rich"]),
        ],
        described_at=T0,
    )


def test_nothing_recorded_is_an_empty_list(client: TestClient, clean: AppState) -> None:
    answer = client.get("/v1/environment")
    assert answer.status_code == 200
    assert answer.json() == {"workers": []}


def test_the_latest_worker_of_each_queue_is_answered(client: TestClient, clean: AppState) -> None:
    old = described("2.12.0", "5.0.0", torchvision_error="old")
    new = described("2.13.0", "5.23.0", torchvision_error="RuntimeError: no nms")
    gpu = described("2.13.0+cu128", None, torchvision_error="none")
    record_environment(clean.sessions, queue="cpu", hostname="a", environment=old, at=T0)
    record_environment(
        clean.sessions, queue="cpu", hostname="b", environment=new, at=T0 + timedelta(minutes=5)
    )
    record_environment(clean.sessions, queue="gpu", hostname="g", environment=gpu, at=T0)

    answer = client.get("/v1/environment")
    assert answer.status_code == 200
    found = EnvironmentList.model_validate(answer.json())
    assert [(w.queue, w.hostname) for w in found.workers] == [("cpu", "b"), ("gpu", "g")]
    cpu = found.workers[0]
    assert cpu.recorded_at == T0 + timedelta(minutes=5)
    assert cpu.environment == new
    versions = {
        lib.name: (lib.version, lib.imports, lib.error) for lib in cpu.environment.libraries
    }
    assert versions["transformers"] == ("5.23.0", True, None)
    assert versions["torchvision"] == ("0.28.0", False, "RuntimeError: no nms")
    assert found.workers[1].environment.torch == "2.13.0+cu128"


def test_each_targets_support_is_answered_as_the_worker_recorded_it(
    client: TestClient, clean: AppState
) -> None:
    targets = [
        TargetSupport(name="onnx", works=True),
        TargetSupport(name="aoti", works=False, missing=["g++"]),
        TargetSupport(name="executorch", works=False, error="ImportError: no flatc"),
    ]
    recorded = described("2.13.0", "5.23.0", torchvision_error="x").model_copy(
        update={"targets": targets}
    )
    record_environment(clean.sessions, queue="cpu", hostname="a", environment=recorded, at=T0)
    (worker,) = client.get("/v1/environment").json()["workers"]
    assert [
        (t["name"], t["works"], t["missing"], t["error"]) for t in worker["environment"]["targets"]
    ] == [
        ("onnx", True, [], None),
        ("aoti", False, ["g++"], None),
        ("executorch", False, [], "ImportError: no flatc"),
    ]


def test_a_worker_starting_again_replaces_its_row(client: TestClient, clean: AppState) -> None:
    first = described("2.12.0", "5.0.0", torchvision_error="x")
    again = described("2.13.0", "5.23.0", torchvision_error="y")
    record_environment(clean.sessions, queue="cpu", hostname="a", environment=first, at=T0)
    record_environment(
        clean.sessions, queue="cpu", hostname="a", environment=again, at=T0 + timedelta(hours=1)
    )
    with clean.sessions() as session:
        assert session.scalar(select(func.count()).select_from(WorkerEnvironmentRow)) == 1
    [worker] = client.get("/v1/environment").json()["workers"]
    assert worker["environment"]["torch"] == "2.13.0"


@pytest.mark.parametrize(
    "requires", [["transformers>>4"], ["pkg @ https://example.invalid/p.whl"], "transformers"]
)
def test_requires_that_are_not_requirements_are_invalid_requests(
    client: TestClient, state: AppState, requires: object
) -> None:
    answer = client.post(
        "/v1/exports",
        files={"model": model_file()},
        data={"options": json.dumps({"requires": requires})},
    )
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "invalid_request"
    assert {
        e["field"].split(".")[:2] == ["options", "requires"] for e in body["details"]["errors"]
    } == {True}
    with state.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_valid_requires_are_kept_on_the_job(client: TestClient, state: AppState) -> None:
    answer = client.post(
        "/v1/exports",
        files={"model": model_file()},
        data={"options": json.dumps({"requires": ["transformers>=4.40"]})},
    )
    assert answer.status_code == 202
    assert answer.json()["options"]["requires"] == ["transformers>=4.40"]
