"""Regenerate docs/screenshots/*.png: every page of the browser UI, against a real
`torchport serve`, in Debian's Chromium (the same setup as tests/browser).

    python scripts/screenshots.py [--out docs/screenshots] [--only graph|pages]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.conftest import CHROMIUM, CHROMIUM_FLAGS, MODELS, Server  # noqa: E402

SHARED_BATCH = {"image": {"0": {"name": "batch", "min": 1, "max": 64}}, "text": {"0": "batch"}}


def choose(page: Any, model: Path, dynamic_shapes: Any = None, auto_fix: bool = True) -> None:
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(model))
    if dynamic_shapes is not None:
        page.fill("#dynamic-shapes", json.dumps(dynamic_shapes))
    if not auto_fix:
        page.uncheck("#auto-fix")


def shoot(page: Any, out: Path, name: str) -> None:
    page.wait_for_timeout(400)
    page.screenshot(path=str(out / f"{name}.png"), full_page=True)
    print(f"wrote {out / name}.png")


def shoot_card(page: Any, out: Path, name: str, card: str = "graph") -> None:
    page.wait_for_timeout(400)
    page.locator(f"[data-card={card}]").screenshot(path=str(out / f"{name}.png"))
    print(f"wrote {out / name}.png")


def open_graph(page: Any, job_id: str) -> None:
    page.goto(f"/#/jobs/{job_id}")
    page.wait_for_selector("[data-card=graph]", timeout=120_000)
    page.wait_for_function("document.querySelector('.graph-host')?.graphView !== undefined")


def take_graph(page: Any, out: Path, server: Server) -> None:
    """The graph view: an 800-op model collapsed at fit, a layer opened, a search for an op
    decomposition removed, a transformers node's library line."""
    job_id, _, _ = server.export(MODELS / "graph_large.py")
    open_graph(page, job_id)
    shoot_card(page, out, "graph-large")
    page.evaluate(
        """() => {
          const view = document.querySelector('.graph-host').graphView;
          view.open('m:encoder');
          view.open('m:encoder.layers.3');
        }"""
    )
    shoot_card(page, out, "graph-large-open")
    open_graph(page, job_id)
    page.fill("#graph-search", "linear")
    page.press("#graph-search", "Enter")
    shoot_card(page, out, "graph-search-decomposed")
    job_id, _, _ = server.export(ROOT / "tests" / "models" / "hf_llama.py")
    open_graph(page, job_id)
    page.fill("#graph-search", "mm")
    page.press("#graph-search", "Enter")
    shoot_card(page, out, "graph-library-source")


def take(out: Path, server: Server, only: str | None = None) -> None:
    """The screenshots against `server`: all, or only those of the `graph` view or `pages`."""
    from playwright.sync_api import sync_playwright

    url = server.url
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(base_url=url, viewport={"width": 1280, "height": 900})
        if only in (None, "graph"):
            take_graph(page, out, server)
        if only == "graph":
            browser.close()
            return

        choose(page, MODELS / "shared_batch.py", SHARED_BATCH)
        shoot(page, out, "upload")
        page.click("#submit")
        page.wait_for_selector("[data-card=summary]", timeout=120_000)
        page.fill("#graph-search", "addmm")
        page.press("#graph-search", "Enter")
        shoot(page, out, "result")

        choose(page, MODELS / "data_dependent.py")
        page.click("#submit")
        page.wait_for_selector("#error-code", timeout=120_000)
        shoot(page, out, "failure")

        choose(page, ROOT / "tests" / "models" / "diag_derived.py", auto_fix=False)
        page.click("#submit")
        page.wait_for_selector("#error-code", timeout=120_000)
        shoot(page, out, "failure-dynamic-shapes")

        with tempfile.TemporaryDirectory() as tmp:
            slow = Path(tmp) / "slow_30.py"
            slow.write_bytes((ROOT / "tests" / "models" / "service_slow.py").read_bytes())
            choose(page, slow)
            page.click("#submit")
            page.wait_for_selector("[data-stage=loading][data-state=running]", timeout=60_000)
            page.wait_for_timeout(1500)
            shoot(page, out, "job")
            page.click("#cancel")
            page.wait_for_selector(".job-header [data-status=canceled]", timeout=30_000)

        page.goto("/#/jobs")
        page.wait_for_selector("#jobs-table")
        shoot(page, out, "jobs")
        browser.close()


def main() -> int:
    """Start a server in a temporary data directory, take the screenshots, stop it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument(
        "--only", choices=["graph", "pages"], help="only the graph view's, or only the pages'"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        server = Server(Path(tmp) / "data", Path(tmp) / "serve.log")
        server.start()
        try:
            take(args.out, server, args.only)
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
