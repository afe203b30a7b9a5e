"""Write the JSON Schema of every public document into `schemas/json/`.

Run `python -m schemas.generate`; `--check` exits 1 when a file is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from schemas.environment import EnvironmentList
from schemas.errors import ErrorBody
from schemas.graph import GraphDocument
from schemas.job import JobPublic, JobSpec, JobSummary
from schemas.options import SubmittedOptions
from schemas.report import ReportDocument
from schemas.signature import SignatureDocument
from schemas.source import CheckpointSource

DOCUMENTS: dict[str, type[BaseModel]] = {
    "options": SubmittedOptions,
    "job-spec": JobSpec,
    "error": ErrorBody,
    "graph": GraphDocument,
    "signature": SignatureDocument,
    "report": ReportDocument,
    "job": JobPublic,
    "job-summary": JobSummary,
    "environment": EnvironmentList,
    "checkpoint-source": CheckpointSource,
}
JSON_DIR = Path(__file__).parent / "json"


def render() -> dict[str, str]:
    """Return file name → JSON Schema text for every document."""
    return {
        f"{name}.schema.json": json.dumps(model.model_json_schema(), indent=2, sort_keys=True)
        + "\n"
        for name, model in DOCUMENTS.items()
    }


def main(argv: list[str] | None = None) -> int:
    """Write the schemas, or with `--check` report the stale ones."""
    args = sys.argv[1:] if argv is None else argv
    stale = []
    for name, text in render().items():
        path = JSON_DIR / name
        if "--check" in args:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            JSON_DIR.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print("stale JSON Schemas: " + ", ".join(stale) + " (run python -m schemas.generate)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
