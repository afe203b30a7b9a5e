"""A worker records its environment at start; the API's query answers it."""

from __future__ import annotations

from importlib import metadata

from sqlalchemy import delete

from persistence.environments import latest_environments
from persistence.models import WorkerEnvironmentRow
from worker.environment import record
from worker.execution import WorkerContext


def test_a_started_worker_records_its_libraries_for_each_queue(context: WorkerContext) -> None:
    with context.engine.begin() as conn:
        conn.execute(delete(WorkerEnvironmentRow))
    context.settings.queues = "cpu,gpu"
    context.settings.worker_name = "host-under-test"
    try:
        record(context, check=False)
        with context.sessions() as session:
            found = latest_environments(session)
    finally:
        with context.engine.begin() as conn:
            conn.execute(delete(WorkerEnvironmentRow))
    assert [(w.queue, w.hostname) for w in found.workers] == [
        ("cpu", "host-under-test"),
        ("gpu", "host-under-test"),
    ]
    environment = found.workers[0].environment
    assert environment.torch == metadata.version("torch")
    versions = {lib.name: lib.version for lib in environment.libraries}
    assert versions["torch"] == metadata.version("torch")
    assert versions["pydantic"] == metadata.version("pydantic")
