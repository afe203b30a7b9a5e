"""The `requires` option: pip-style requirement strings, checked when the options are read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas import ExportOptions


def test_requirements_are_kept_stripped_in_order() -> None:
    options = ExportOptions.model_validate(
        {"requires": ["transformers>=4.40", " timm ", 'numpy<3; python_version >= "3.8"']}
    )
    assert options.requires == ["transformers>=4.40", "timm", 'numpy<3; python_version >= "3.8"']
    assert ExportOptions().requires == []


@pytest.mark.parametrize(
    "bad",
    ["transformers>>4", ">=1.0", "", "pkg @ https://example.invalid/pkg.whl", "a" * 201],
)
def test_anything_but_a_named_requirement_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ExportOptions.model_validate({"requires": [bad]})
    assert [error["loc"][0] for error in caught.value.errors()] == ["requires"]


def test_at_most_64_requirements() -> None:
    ExportOptions.model_validate({"requires": ["torch"] * 64})
    with pytest.raises(ValidationError):
        ExportOptions.model_validate({"requires": ["torch"] * 65})


def test_requires_must_be_a_list_of_strings() -> None:
    with pytest.raises(ValidationError):
        ExportOptions.model_validate({"requires": "transformers>=4.40"})
