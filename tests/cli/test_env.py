"""`torchport env`: the local environment as the jobs see it, or a server's."""

from __future__ import annotations

import dataclasses
from importlib import metadata

import pytest

from engine.environment import target_requirements
from engine.targets.registry import TARGETS
from schemas import EnvironmentDescription
from torchport.cli import main


def test_env_json_lists_torch_with_its_version_and_that_it_imports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["env", "--json"]) == 0
    described = EnvironmentDescription.model_validate_json(capsys.readouterr().out)
    torch = next(lib for lib in described.libraries if lib.name == "torch")
    assert torch.version == metadata.version("torch") == described.torch
    assert torch.model_library and torch.imports is True and torch.error is None
    assert described.check_duration_s is not None


def test_env_without_checks_still_lists_every_distribution(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["env", "--json", "--no-check"]) == 0
    described = EnvironmentDescription.model_validate_json(capsys.readouterr().out)
    versions = {lib.name: lib.version for lib in described.libraries}
    assert versions["rich"] == metadata.version("rich")
    assert all(lib.imports is None for lib in described.libraries if lib.version is not None)


def test_env_table_names_the_model_libraries(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "transformers" in out and metadata.version("torch") in out


def test_env_of_an_unreachable_server_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "--server", "http://127.0.0.1:9", "--json"]) == 2
    assert "unavailable" in capsys.readouterr().err


def test_env_says_whether_each_target_works(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "torchport-no-such-compiler")
    assert main(["env", "--json"]) == 0
    described = EnvironmentDescription.model_validate_json(capsys.readouterr().out)
    found = {t.name: t for t in described.targets}
    assert list(found) == ["onnx", "aoti", "executorch"]
    assert (found["aoti"].works, found["aoti"].missing) == (False, ["torchport-no-such-compiler"])
    for name in ("onnx", "executorch"):
        absent = target_requirements.missing(name)
        assert found[name].missing == absent
        # installed here: imported in a fresh interpreter as the jobs would
        assert found[name].works is (not absent), found[name].error


def test_env_without_checks_does_not_claim_an_import_works(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    row = dataclasses.replace(TARGETS["executorch"], requires=("torchport_no_such_module",))
    monkeypatch.setitem(TARGETS, "executorch", row)
    assert main(["env", "--json", "--no-check"]) == 0
    described = EnvironmentDescription.model_validate_json(capsys.readouterr().out)
    found = {t.name: (t.works, t.missing) for t in described.targets}
    assert found["executorch"] == (False, ["torchport_no_such_module"])
    if not target_requirements.missing("onnx"):
        assert found["onnx"] == (None, [])  # found, but whether it imports was not checked
    assert main(["env", "--no-check"]) == 0
    assert "torchport_no_such_module missing" in capsys.readouterr().out
