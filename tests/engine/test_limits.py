"""A job's limits are named by what failed, by type, in any stage: a MemoryError is
`out_of_memory`, a write over RLIMIT_FSIZE (EFBIG) is `disk_quota_exceeded`; the stage's
own code is kept in `details.original_code`."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from schemas import ExportOptions

TEMPLATE = """
import errno, torch

class Model(torch.nn.Module):
    def forward(self, x):
        {forward}
        return x + 1

{module}
model = Model()
example_args = (torch.ones(2),)
"""


def _export(tmp_path: Path, *, forward: str = "pass", module: str = ""):
    source = tmp_path / "model.py"
    source.write_text(TEMPLATE.format(forward=forward, module=module))
    request = ExportRequest(
        upload=Upload(model=source),
        options=ExportOptions(),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    return run_export(request).report


@pytest.mark.parametrize(
    ("where", "raise_it", "code", "stage", "original"),
    [
        ("module", "raise MemoryError()", "out_of_memory", "loading", "model_import_failed"),
        ("forward", "raise MemoryError()", "out_of_memory", "loading", "eager_run_failed"),
        (
            "module",
            "raise OSError(errno.EFBIG, 'File too large')",
            "disk_quota_exceeded",
            "loading",
            "model_import_failed",
        ),
        (
            "module",
            "raise OSError(errno.ENOMEM, 'Cannot allocate memory')",
            "out_of_memory",
            "loading",
            "model_import_failed",
        ),
    ],
)
def test_limits_are_named_by_the_exception_type(
    tmp_path: Path, where: str, raise_it: str, code: str, stage: str, original: str
) -> None:
    report = _export(tmp_path, **{where: raise_it})
    assert report.status == "failed"
    assert report.error is not None
    assert report.error.code == code
    assert report.error.stage == stage
    assert report.error.details["original_code"] == original
    assert report.error.hint  # the catalogue's


def test_text_that_merely_mentions_memory_is_not_a_limit(tmp_path: Path) -> None:
    report = _export(tmp_path, module="raise ValueError('MemoryError: Cannot allocate memory')")
    assert report.error is not None
    assert report.error.code == "model_import_failed"
