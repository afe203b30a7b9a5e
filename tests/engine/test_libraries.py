"""engine.environment.libraries and what the pipeline does with it: the upload's `requires`, the
libraries it imported in report.json, the installed environment."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from engine.environment import libraries
from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from schemas import MODEL_LIBRARIES, ExportOptions, ReportDocument

MODELS = Path(__file__).parents[1] / "models"
TORCH_VERSION = metadata.version("torch")


def export(tmp_path: Path, model: str, **options: Any) -> ReportDocument:
    request = ExportRequest(
        upload=Upload(model=MODELS / model),
        options=ExportOptions.model_validate(options),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    run_export(request)
    return ReportDocument.model_validate_json((tmp_path / "out" / "report.json").read_text())


# --- requires -------------------------------------------------------------------------


def test_requirements_are_checked_against_installed_versions() -> None:
    checks = libraries.check_requirements(
        ["torch>=2.9", "torch<1.0", "torchport-no-such-package>=1", f"torch=={TORCH_VERSION}"]
    )
    assert [(c.name, c.installed, c.met) for c in checks] == [
        ("torch", TORCH_VERSION, True),
        ("torch", TORCH_VERSION, False),
        ("torchport-no-such-package", None, False),
        ("torch", TORCH_VERSION, True),
    ]


def test_a_requirement_whose_marker_does_not_apply_is_met() -> None:
    [check] = libraries.check_requirements(['torchport-no-such-package; python_version < "3"'])
    assert check.met and check.installed is None


def test_unmet_requires_fail_in_loading_before_the_upload_runs(tmp_path: Path) -> None:
    report = export(
        tmp_path,
        # would fail to import if it ran: the check comes first
        "env_missing_module.py",
        requires=["torch>=2.9", "torch<1.0", "torchport-no-such-package>=1"],
    )
    assert report.status == "failed" and report.error is not None
    assert report.error.code == "environment_mismatch"
    assert report.error.stage == "loading"
    assert report.error.details["unmet"] == ["torch<1.0", "torchport-no-such-package>=1"]
    assert report.error.details["requirements"] == [
        {"requirement": "torch>=2.9", "name": "torch", "installed": TORCH_VERSION, "met": True},
        {"requirement": "torch<1.0", "name": "torch", "installed": TORCH_VERSION, "met": False},
        {
            "requirement": "torchport-no-such-package>=1",
            "name": "torchport-no-such-package",
            "installed": None,
            "met": False,
        },
    ]
    assert [s.name for s in report.stages] == ["loading"]
    assert not (tmp_path / "out" / "program.pt2").exists()


def test_met_requires_and_the_imported_libraries_are_in_the_report(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    version = metadata.version("transformers")
    report = export(
        tmp_path,
        "env_transformers.py",
        requires=["transformers>=4.40", "torch"],
        verify={"enabled": False},
    )
    assert report.status == "succeeded", report.error
    found = report.environment.libraries
    assert found["transformers"] == version
    assert found["torch"] == TORCH_VERSION
    assert not {"torchport", "engine", "schemas", "json", "os"} & set(found)
    document = json.loads((tmp_path / "out" / "report.json").read_text())
    assert document["environment"]["libraries"]["transformers"] == version


def test_a_plain_torch_upload_lists_torch_alone(tmp_path: Path) -> None:
    report = export(tmp_path, "docs_shared_batch.py", verify={"enabled": False})
    assert report.status == "succeeded", report.error
    assert report.environment.libraries == {"torch": TORCH_VERSION}


def test_a_missing_package_is_named_and_the_hint_points_at_requires(tmp_path: Path) -> None:
    report = export(tmp_path, "env_missing_module.py")
    assert report.error is not None and report.error.code == "model_import_failed"
    assert report.error.details["missing_module"] == "torchport_no_such_package"
    assert report.error.hint is not None and "requires" in report.error.hint
    assert report.environment.libraries == {"torch": TORCH_VERSION}


def test_libraries_imported_before_are_found_through_the_upload_globals(tmp_path: Path) -> None:
    import types

    import numpy

    before = set(sys.modules)  # numpy is already imported: only the globals name it
    upload = types.ModuleType("user_upload")
    upload.np = numpy  # type: ignore[attr-defined]
    upload.ndarray = numpy.ndarray  # type: ignore[attr-defined]
    upload.dumps = json.dumps  # type: ignore[attr-defined]
    found = libraries.imported_libraries(before, modules=[upload], upload_root=tmp_path)
    assert found == {"numpy": metadata.version("numpy"), "torch": TORCH_VERSION}


def test_distributions_named_unlike_their_module_are_found() -> None:
    pytest.importorskip("yaml")
    [dist] = libraries._distributions_of("yaml")
    assert dist.metadata["Name"] == "PyYAML"


# --- the installed environment --------------------------------------------------------


def test_the_environment_lists_the_model_libraries_first_then_everything() -> None:
    described = libraries.describe_environment(check=False)
    names = [lib.name for lib in described.libraries]
    flagged = [lib for lib in described.libraries if lib.model_library]
    assert len(flagged) == len(MODEL_LIBRARIES)
    assert described.libraries[: len(flagged)] == flagged
    assert described.torch == TORCH_VERSION
    torch = described.libraries[0]
    assert (torch.name, torch.version, torch.imports) == ("torch", TORCH_VERSION, None)
    assert "torch" in torch.modules
    installed = {d.metadata["Name"] for d in metadata.distributions()}
    assert {"pydantic", "fastapi"} <= set(names) and {"pydantic", "fastapi"} <= installed
    rest = names[len(flagged) :]
    assert rest == sorted(rest, key=str.lower)


def test_import_checks_report_what_fails_and_why() -> None:
    results = libraries.check_imports(
        {
            "fine": "import json",
            "broken": "raise RuntimeError('operator torchvision::nms does not exist')",
            "missing": "import torchport_no_such_package",
        },
        timeout_s=60,
    )
    assert results["fine"] == libraries.CheckResult(True)
    assert results["broken"].ok is False
    assert results["broken"].error == "RuntimeError: operator torchvision::nms does not exist"
    assert results["missing"].ok is False
    assert results["missing"].error is not None
    assert results["missing"].error.startswith("ModuleNotFoundError")


def test_an_import_check_over_its_time_limit_is_reported_as_such() -> None:
    results = libraries.check_imports(
        {"first": "import json", "slow": "import time; time.sleep(30)", "after": "pass"},
        timeout_s=3,
    )
    assert results["first"].ok is True
    assert results["slow"].ok is False and "did not finish" in (results["slow"].error or "")
    assert results["after"] == libraries.CheckResult(None)


def test_the_checks_run_isolated_from_this_process_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "torchport_shadow.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    results = libraries.check_imports({"shadow": "import torchport_shadow"}, timeout_s=60)
    assert results["shadow"].ok is False
