"""The browser pages: the upload form, job, result and failure views, the jobs list.

Static files only (HTML, one CSS file, ES modules and a vendored graph-layout bundle), served
at `/` and `/web/`; the pages call the public `/v1` API like any other client. Nothing is
fetched from elsewhere, so they work offline. `scripts/build_web.sh` rebuilds the vendored
bundle; see `docs/web.md`.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import get_args

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from schemas.options import TaskName

__all__ = ["STATIC_DIR", "mount", "render_index"]

STATIC_DIR = Path(__file__).parent / "static"
"""HTML, CSS, scripts and the vendored bundle served under `/web/`."""

_LIMIT_FIELDS = ("model", "inputs", "weights", "calibration", "options", "checkpoint")
TASKS = list(get_args(TaskName))
"""The checkpoint tasks the form offers, as the options' `task` names them."""


def render_index(upload_limits: dict[str, int] | None) -> str:
    """The single-page shell, with the server's upload limits for checks before submit
    (`checkpoint`: the limit of a checkpoint zip) and the checkpoint tasks."""
    limits = {k: v for k, v in (upload_limits or {}).items() if k in _LIMIT_FIELDS}
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    page = page.replace("__TORCHPORT_TASKS__", html.escape(json.dumps(TASKS), quote=True))
    return page.replace("__TORCHPORT_LIMITS__", html.escape(json.dumps(limits), quote=True))


def mount(app: FastAPI) -> None:
    """Serve the pages at `/` and their assets at `/web/` (leaves `/v1`, `/healthz`, … alone)."""

    async def index(request: Request) -> HTMLResponse:
        settings = getattr(request.app.state, "settings", None)
        limits = getattr(settings, "upload_limits", None)
        if settings is not None and limits is not None:
            limits = {**limits, "checkpoint": settings.max_checkpoint_bytes}
        return HTMLResponse(render_index(limits), headers={"Cache-Control": "no-cache"})

    app.add_api_route("/", index, methods=["GET"], include_in_schema=False)
    app.mount("/web", StaticFiles(directory=STATIC_DIR), name="web")
