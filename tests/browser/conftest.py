"""Browser tests: a real `torchport serve` (SQLite, folder broker, a local worker, the real
sandbox) on a free port, driven by Debian's Chromium through Playwright.

Playwright cannot download browsers here, so it launches /usr/bin/chromium (`apt-get install
chromium`); TORCHPORT_CHROMIUM overrides the path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = Path(__file__).parent / "models"
CHROMIUM = os.environ.get("TORCHPORT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
MAX_MODEL_BYTES = 256 * 1024
"""The served model limit, small so the form's size check can be tried with a small file."""


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """`torchport serve` in its own process group, with its own data directory."""

    def __init__(self, data_dir: Path, log: Path, extra_env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
        env.update(
            {
                "TORCHPORT_DATA_DIR": str(data_dir),
                "TORCHPORT_MAX_MODEL_BYTES": str(MAX_MODEL_BYTES),
                **(extra_env or {}),
            }
        )
        self.env = env
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "torchport.cli", "serve", "--port", str(self.port)],
            env=self.env,
            cwd=ROOT,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"torchport serve exited: {self.log.read_text()[-2000:]}")
            with suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError(f"torchport serve did not answer: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def api(self, path: str, key: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        answer = httpx.get(f"{self.url}{path}", headers=headers, timeout=10)
        answer.raise_for_status()
        return answer.json()

    def export(self, model: Path) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """Submit `model` through the API and wait for it to succeed: its id, graph.json and
        report.json."""
        with model.open("rb") as f:
            answer = httpx.post(
                f"{self.url}v1/exports", files={"model": (model.name, f)}, timeout=30
            )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        deadline = time.monotonic() + 300
        while (job := self.api(f"v1/exports/{job_id}"))["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.5)
        assert job["status"] == "succeeded", job["error"]
        graph = self.api(f"v1/exports/{job_id}/artifacts/graph.json")
        report = self.api(f"v1/exports/{job_id}/artifacts/report.json")
        return job_id, graph, report


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("browser-serve")
    served = Server(root / "data", root / "serve.log")
    served.start()
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install -y chromium` (see docs/web.md)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any, server: Server) -> Iterator[Any]:
    context = browser.new_context(
        base_url=server.url, accept_downloads=True, viewport={"width": 1280, "height": 900}
    )
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    # Offline for real: any request that leaves the server fails the test.
    outside: list[str] = []

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if url.startswith(server.url) or url.startswith("data:") or url.startswith("blob:"):
            request_route.continue_()
        else:
            outside.append(url)
            request_route.abort()

    opened.route("**/*", route)
    opened.set_default_timeout(30_000)
    yield opened
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"
    assert outside == [], f"the page requested other hosts: {outside}"
