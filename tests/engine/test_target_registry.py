"""The targets' registry (`engine.targets.registry`): one row per target, matching its
module (`engine.targets.interface.Target`), the options' `TargetName`, the CLI and
docs/targets.md; and a target that is only a module plus a row runs through `run_target`."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from engine import targets
from engine.serialize.artifacts import ARTIFACT_NAMES, ENCODER
from engine.targets import registry
from engine.targets.interface import Target
from schemas import ExportOptions
from schemas.options import TargetName
from torchport.commands.upload_options import add_upload_arguments

ROOT = Path(__file__).resolve().parents[2]
HOOKS = (
    "runtime",
    "prepare",
    "convert",
    "loading",
    "load",
    "tolerances",
    "convert_encoder",
    "notes",
)


def test_the_rows_are_the_options_targets_in_conversion_order() -> None:
    assert typing.get_args(TargetName) == registry.ORDER
    assert targets.ORDER == registry.ORDER
    assert all(name == row.name for name, row in registry.TARGETS.items())


@pytest.mark.parametrize("name", registry.ORDER)
def test_each_rows_module_implements_the_interface(name: str) -> None:
    module = importlib.import_module(registry.spec(name).module)
    assert isinstance(module, Target)
    assert set(HOOKS) <= set(module.__all__)
    assert isinstance(module.THREAD_SETTINGS, tuple)


def test_every_file_a_target_writes_is_its_own() -> None:
    files = [name for row in registry.TARGETS.values() for name in (row.artifact, *row.companions)]
    assert len(files) == len(set(files))
    assert not set(files) & {*ARTIFACT_NAMES, ENCODER}
    for row in registry.TARGETS.values():
        assert row.encoder is None or row.encoder in row.companions
    assert set(registry.TARGET_FILES) == set(files)


def test_the_schemes_and_hints_come_from_the_rows() -> None:
    from engine.quantization.schemes import METHODS, TARGET_SCHEMES

    for row in registry.TARGETS.values():
        assert TARGET_SCHEMES[row.name] == tuple(row.schemes)
        assert all(METHODS[(row.name, scheme)] == how for scheme, how in row.schemes.items())
        assert row.install_hint and row.failure_hint and row.failed_op


def test_the_cli_and_the_docs_name_every_target() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_upload_arguments(parser)
    action = next(a for a in parser._actions if a.dest == "target")
    assert tuple(action.choices or ()) == registry.ORDER
    table = (ROOT / "docs" / "targets.md").read_text()
    for row in registry.TARGETS.values():
        assert re.search(rf"^\| `{row.name}` \| `{re.escape(row.artifact)}`", table, re.M), row.name


def test_the_face_and_the_registry_import_no_torch() -> None:
    code = (
        "import sys, engine.targets, engine.targets.registry, engine.serialize.artifacts, "
        "engine.environment.target_requirements, worker.sandbox.confinement.converters; "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False"


def test_a_target_that_is_a_module_and_a_row_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    row = registry.TargetSpec(
        name="pt2_copy", module="tests.engine.pt2_copy_target", artifact="model.copy.pt2"
    )
    monkeypatch.setitem(registry.TARGETS, row.name, row)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU()).eval()
    args = (torch.randn(3, 4),)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(module, args, dynamic_shapes=({0: batch},))
    result = targets.run_target(
        row.name,
        targets.TargetJob(
            program=program.run_decompositions(),
            traced=program,
            pristine=module,
            args=args,
            kwargs={},
            out_dir=tmp_path,
            options=ExportOptions(),
        ),
    )
    assert result.status == "succeeded", result.error
    assert (result.artifact, result.artifacts) == ("model.copy.pt2", ["model.copy.pt2"])
    assert result.verification is not None and result.verification.verdict == "verified"
    assert result.verification.checked == 4
    assert result.notes == [f"{result.details['nodes']} nodes"]
