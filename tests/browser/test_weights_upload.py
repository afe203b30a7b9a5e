"""The upload form takes a `.pth` weights file (issue 34, item 5): dropped, it goes to the
weights field, whose accepted types include `.pth`, and the job records it."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import Server

pytestmark = pytest.mark.slow


def test_the_form_sends_a_pth_weights_file(page: Any, server: Server, tmp_path: Path) -> None:
    model = tmp_path / "seeded.py"
    model.write_text(f"# {uuid.uuid4()}\nimport torch\nmodel = torch.nn.ReLU()\n")
    weights = tmp_path / "tiny.pth"
    weights.write_bytes(b"PK\x03\x04 a torch.save zip")
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(model))
    field = "[data-testid=file-weights]"
    assert ".pth" in (page.get_attribute(field, "accept") or "").split(",")
    page.set_input_files(field, str(weights))
    page.select_option("select[name=device]", "cuda")  # the gpu queue: no local worker runs it
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/[^/]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    try:
        assert server.api(f"v1/exports/{job_id}")["weights_name"] == "tiny.pth"
    finally:
        httpx.delete(f"{server.url}v1/exports/{job_id}", timeout=10)
