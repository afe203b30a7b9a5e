"""The worker's sandbox settings are the sandbox's own: one name, one default and one set of
bounds per limit, written once in `SandboxSettings` and read as `TORCHPORT_SANDBOX_<NAME>`."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.limits import MAX_TIMEOUT_S
from worker.sandbox.settings import SandboxSettings
from worker.settings import WorkerSettings


def test_the_sandbox_settings_are_the_sandboxs_own_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHPORT_SANDBOX_WARM_LIBRARIES", raising=False)  # tests/conftest.py
    field = WorkerSettings.model_fields["sandbox"]
    assert field.annotation is SandboxSettings
    assert WorkerSettings().sandbox == SandboxSettings()
    assert not [name for name in WorkerSettings.model_fields if name.startswith("sandbox_")]


def test_every_sandbox_field_is_a_variable() -> None:
    variables = WorkerSettings.variables()
    for name in SandboxSettings.model_fields:
        assert variables[f"TORCHPORT_SANDBOX_{name.upper()}"] is SandboxSettings.model_fields[name]


def test_the_environment_reaches_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHPORT_SANDBOX_DISK_MB", "123")
    monkeypatch.setenv("TORCHPORT_SANDBOX_MAX_INODES", "456")
    monkeypatch.setenv("TORCHPORT_SANDBOX_SPARES", "false")
    monkeypatch.setenv("TORCHPORT_SANDBOX_USE_BWRAP", "auto")
    monkeypatch.setenv("TORCHPORT_QUEUES", "gpu")
    monkeypatch.setenv("TORCHPORT_CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("TORCHPORT_MAX_ARTIFACT_BYTES", "4096")
    monkeypatch.setenv("TORCHPORT_SANDBOX_WARM_LIBRARIES", '["transformers"]')
    settings = WorkerSettings()
    sandbox = settings.sandbox_settings()
    assert (sandbox.disk_mb, sandbox.max_inodes, sandbox.spares) == (123, 456, False)
    assert sandbox.use_bwrap == "auto"
    assert sandbox.gpu is True
    assert sandbox.cuda_visible_devices == "1"
    assert settings.max_artifact_bytes == 4096
    assert sandbox.warm_libraries == ["transformers"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TORCHPORT_SANDBOX_DISK_MB", "10"),
        ("TORCHPORT_SANDBOX_MAX_MEMORY_MB", "100"),
        ("TORCHPORT_SANDBOX_MAX_TIMEOUT_S", str(MAX_TIMEOUT_S + 1)),
        ("TORCHPORT_SANDBOX_NO_SUCH_LIMIT", "1"),
    ],
)
def test_a_sandbox_setting_out_of_bounds_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as refused:
        WorkerSettings()
    assert refused.value.errors()[0]["loc"][0] == "sandbox"
