"""With API keys on, the pages ask for a key, keep it in the tab's session only, and send it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import MODELS, ROOT, Server, assert_archive_of

pytestmark = pytest.mark.slow

KEYS = [sys.executable, "-m", "torchport.cli", "keys"]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, str]]:
    root = tmp_path_factory.mktemp("browser-keys")
    served = Server(root / "data", root / "serve.log")
    created = subprocess.run(
        [*KEYS, "--data-dir", str(served.data_dir), "--json", "create", "browser"],
        env=served.env,
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    )
    key = json.loads(created.stdout.strip().splitlines()[-1])["key"]
    served.start()
    try:
        yield served, key
    finally:
        served.stop()


def test_the_key_is_asked_for_kept_in_the_session_and_sent(
    browser: Any, keyed: tuple[Server, str]
) -> None:
    server, key = keyed
    context = browser.new_context(base_url=server.url)
    page = context.new_page()
    try:
        page.goto("/#/jobs")
        page.wait_for_selector("#banner[data-code=unauthorized]")
        assert page.locator("[data-code=unauthorized]").count() >= 1
        page.fill("#api-key", key)
        page.click("#api-key-form button[type=submit]")
        page.wait_for_selector("#no-jobs")
        assert page.evaluate("sessionStorage.getItem('torchport.apiKey')") == key
        assert page.evaluate("localStorage.length") == 0

        page.goto("/")
        page.set_input_files("[data-testid=file-model]", str(MODELS / "data_dependent.py"))
        page.click("#submit")
        page.wait_for_selector("#error-code", timeout=120_000)
        assert page.get_attribute("#error-code", "data-code") == "data_dependent"
        jobs = server.api("v1/exports", key=key)["items"]
        assert len(jobs) == 1 and jobs[0]["status"] == "failed"

        # A new tab (a new session) starts without the key.
        other = context.browser.new_context(base_url=server.url).new_page()
        other.goto("/#/jobs")
        other.wait_for_selector("#banner[data-code=unauthorized]")
        assert other.evaluate("sessionStorage.getItem('torchport.apiKey')") is None
        # With the key, the failure page fetches the uploaded source around the line.
        other.fill("#api-key", key)
        other.click("#api-key-form button[type=submit]")
        other.wait_for_selector("#jobs-table")
        other.goto(f"/#/jobs/{jobs[0]['id']}")
        other.wait_for_selector("#source[data-source=upload]")
        assert other.locator("#source .src-line.highlight").get_attribute("data-line") == "9"
        assert other.locator("#source .src-line").count() == 13
        other.context.close()
    finally:
        context.close()


def test_download_all_sends_the_key(browser: Any, keyed: tuple[Server, str]) -> None:
    server, key = keyed
    context = browser.new_context(base_url=server.url, accept_downloads=True)
    page = context.new_page()
    try:
        page.goto("/")
        page.evaluate("key => sessionStorage.setItem('torchport.apiKey', key)", key)
        page.set_input_files("[data-testid=file-model]", str(MODELS / "shared_batch.py"))
        page.click("#submit")
        page.wait_for_selector("#download-all", timeout=120_000)
        job_id = page.url.rsplit("/", 1)[1]
        job = server.api(f"v1/exports/{job_id}", key=key)
        # without the key the archive is refused: the page must have sent it
        assert httpx.get(f"{server.url}v1/exports/{job_id}/artifacts.zip").status_code == 401
        with page.expect_download() as download_info:
            page.click("#download-all")
        assert download_info.value.suggested_filename == f"{job_id}.zip"
        assert_archive_of(Path(download_info.value.path()), job)
    finally:
        context.close()
