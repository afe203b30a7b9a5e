"""`--requires` (and `--profile`) of `torchport export` and `torchport submit`: added to the
options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchport.cli import build_parser, main
from torchport.commands import submit

MODELS = Path(__file__).parents[1] / "models"


def test_export_with_an_unmet_requirement_fails_in_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "export",
            str(MODELS / "env_missing_module.py"),
            "--out",
            str(tmp_path / "out"),
            "--json",
            "--no-sandbox",
            "--requires",
            "torch>=2.9",
            "--requires",
            "torch<1.0",
            "--options",
            '{"requires": ["torchport-no-such-package"]}',
        ]
    )
    assert code == 1
    report = json.loads(capsys.readouterr().out)
    error = report["error"]
    assert (error["code"], error["stage"]) == ("environment_mismatch", "loading")
    assert [r["requirement"] for r in error["details"]["requirements"]] == [
        "torchport-no-such-package",
        "torch>=2.9",
        "torch<1.0",
    ]
    assert error["details"]["unmet"] == ["torchport-no-such-package", "torch<1.0"]


def test_export_refuses_a_requirement_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "export",
            str(MODELS / "env_missing_module.py"),
            "--out",
            str(tmp_path / "out"),
            "--json",
            "--requires",
            "torch>>1",
        ]
    )
    assert code == 2
    body = json.loads(capsys.readouterr().out)
    assert body["code"] == "invalid_request"
    assert [e["field"] for e in body["details"]["errors"]] == ["requires"]


def test_submit_sends_the_requires_in_its_options() -> None:
    argv = ["submit", "model.py", "--requires", "transformers>=4.40", "--requires", "timm"]
    args = build_parser(argv).parse_args(argv)
    assert submit._options(args) == {"requires": ["transformers>=4.40", "timm"]}


@pytest.mark.parametrize(
    ("flags", "options", "expected"),
    [
        (["--target", "onnx"], "{}", {"targets": ["onnx"]}),
        (["--no-profile"], "{}", {"profile": {"enabled": False}}),
        (["--profile"], '{"profile": {"runs": 5}}', {"profile": {"runs": 5, "enabled": True}}),
        (
            ["--quantize", "8da4w"],
            '{"quantize": {"group_size": 64}}',
            {"quantize": {"group_size": 64, "scheme": "8da4w"}},
        ),
    ],
)
def test_profile_flags_set_the_options_profile(
    flags: list[str], options: str, expected: dict[str, object]
) -> None:
    argv = ["submit", "model.py", "--options", options, *flags]
    args = build_parser(argv).parse_args(argv)
    assert submit._options(args) == expected
