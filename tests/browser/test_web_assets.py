"""The pages' assets and mount, without a browser: the vendored bundle is the pinned one,
nothing points off the server, and the pages do not shadow the API."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

from fastapi.testclient import TestClient

from schemas.errors import STAGES
from schemas.outcomes import CATALOGUE
from service.app import create_app
from service.settings import ServiceSettings
from service.web import STATIC_DIR, render_index

ROOT = Path(__file__).resolve().parents[2]
OUR_SCRIPTS = sorted(p for p in STATIC_DIR.glob("*.js") if p.name != "vendor.js")


def test_the_vendor_bundle_carries_the_pinned_library_versions() -> None:
    pinned = json.loads((ROOT / "web" / "package.json").read_text())["dependencies"]
    lock = json.loads((ROOT / "web" / "package-lock.json").read_text())["packages"]
    banner = (STATIC_DIR / "vendor.js").read_text().splitlines()[0]
    bundled = json.loads(re.search(r"bundle: (\{.*?\})", banner).group(1))  # type: ignore[union-attr]
    assert bundled == pinned
    for name, version in pinned.items():
        assert lock[f"node_modules/{name}"]["version"] == version
    assert "cytoscape" in (STATIC_DIR / "vendor.LICENSE.txt").read_text()


def test_every_module_import_resolves_to_a_served_file() -> None:
    imports = re.compile(r"""^import .* from "\./([^"]+)";$""", re.M)
    for script in OUR_SCRIPTS:
        for name in imports.findall(script.read_text()):
            assert (STATIC_DIR / name).is_file(), f"{script.name} imports missing {name}"


def test_the_pages_load_nothing_from_other_hosts() -> None:
    page = (STATIC_DIR / "index.html").read_text()
    assert re.findall(r"""(?:src|href)="(https?:)?//""", page) == []
    for script in OUR_SCRIPTS:
        hosts = set(re.findall(r"https?://([^/\"'`\s]+)", script.read_text()))
        # Only links people click (ExportDB) and the SVG namespace's name (an identifier for
        # createElementNS); nothing is fetched from them.
        assert hosts <= {"pytorch.org", "www.w3.org"}, (script.name, hosts)
    assert "@import" not in (STATIC_DIR / "app.css").read_text()
    assert "url(http" not in (STATIC_DIR / "app.css").read_text()


def test_the_index_carries_the_upload_limits() -> None:
    page = render_index({"model": 123, "inputs": 456, "weights": 789, "options": 10})
    meta = re.search(r'name="torchport-limits" content="([^"]*)"', page)
    assert meta is not None
    assert json.loads(html.unescape(meta.group(1))) == {
        "model": 123,
        "inputs": 456,
        "weights": 789,
        "options": 10,
    }


def test_the_index_carries_the_checkpoint_tasks(tmp_path: Path) -> None:
    from typing import get_args

    from schemas.options import TaskName

    page = render_index(None)
    meta = re.search(r'name="torchport-tasks" content="([^"]*)"', page)
    assert meta is not None
    assert json.loads(html.unescape(meta.group(1))) == list(get_args(TaskName))
    settings = ServiceSettings(data_dir=tmp_path, max_checkpoint_bytes=98765)
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as client:
        limits = re.search(r'name="torchport-limits" content="([^"]*)"', client.get("/").text)
        assert limits is not None
        assert json.loads(html.unescape(limits.group(1)))["checkpoint"] == 98765


def test_the_pages_are_served_beside_the_api(tmp_path: Path) -> None:
    settings = ServiceSettings(data_dir=tmp_path, max_model_bytes=4321)
    with TestClient(create_app(settings), client=("127.0.0.1", 50000)) as client:
        index = client.get("/")
        assert index.status_code == 200
        assert index.headers["content-type"].startswith("text/html")
        assert "4321" in html.unescape(index.text)
        script = client.get("/web/app.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert client.get("/web/vendor.js").status_code == 200
        assert client.get("/healthz").status_code == 200
        jobs = client.get("/v1/exports")
        assert jobs.status_code == 200 and jobs.json()["items"] == []
        assert client.get("/v1/exports/nope").json()["code"] == "not_found"
        paths = client.get("/openapi.json").json()["paths"]
        assert "/" not in paths and "/v1/exports" in paths


def _js_object_keys(source: str, name: str) -> set[str]:
    """The keys of a `const NAME = { key: …, … };` object literal in one of our scripts."""
    body = re.search(rf"const {name} = \{{(.*?)\n\}};", source, re.S)
    assert body is not None, name
    return set(re.findall(r"^\s+([a-z_]+):", body.group(1), re.M))


def test_every_code_a_job_can_end_with_is_explained_on_the_failure_page() -> None:
    explained = _js_object_keys((STATIC_DIR / "failure.js").read_text(), "EXPLAIN")
    job_codes = {code for code, entry in CATALOGUE.items() if entry.ends_jobs}
    assert job_codes - explained == set()
    assert "target_failed" in explained


def test_the_job_page_knows_every_stage_in_order() -> None:
    script = (STATIC_DIR / "job.js").read_text()
    listed = re.search(r"export const STAGES = \[([^\]]*)\];", script)
    assert listed is not None
    assert tuple(re.findall(r'"([a-z]+)"', listed.group(1))) == STAGES
    assert _js_object_keys(script, "STAGE_HELP") == set(STAGES)
