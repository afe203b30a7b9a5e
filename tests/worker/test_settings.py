"""The worker's sandbox settings are the sandbox's own: one name and one default per limit."""

from __future__ import annotations

import dataclasses

import pytest

from worker.sandbox.settings import SandboxSettings
from worker.settings import WorkerSettings

SANDBOX_FIELDS = {f.name: f for f in dataclasses.fields(SandboxSettings)}
WORKER_SANDBOX = sorted(n for n in WorkerSettings.model_fields if n.startswith("sandbox_"))


@pytest.mark.parametrize("name", WORKER_SANDBOX)
def test_every_sandbox_setting_reaches_the_sandbox(name: str) -> None:
    assert name.removeprefix("sandbox_") in SANDBOX_FIELDS


@pytest.mark.parametrize("name", WORKER_SANDBOX)
def test_defaults_are_the_sandboxs(name: str) -> None:
    sandbox = SANDBOX_FIELDS[name.removeprefix("sandbox_")]
    default = WorkerSettings.model_fields[name].get_default(call_default_factory=True)
    expected = (
        sandbox.default_factory()  # type: ignore[misc]
        if sandbox.default is dataclasses.MISSING
        else sandbox.default
    )
    assert default == expected


def test_the_environment_reaches_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHPORT_SANDBOX_DISK_MB", "123")
    monkeypatch.setenv("TORCHPORT_SANDBOX_MAX_INODES", "456")
    monkeypatch.setenv("TORCHPORT_SANDBOX_SPARES", "false")
    monkeypatch.setenv("TORCHPORT_QUEUES", "gpu")
    monkeypatch.setenv("TORCHPORT_CUDA_VISIBLE_DEVICES", "1")
    sandbox = WorkerSettings().sandbox_settings()
    assert (sandbox.disk_mb, sandbox.max_inodes, sandbox.spares) == (123, 456, False)
    assert sandbox.gpu is True
    assert sandbox.cuda_visible_devices == "1"
