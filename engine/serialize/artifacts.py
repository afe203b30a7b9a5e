"""The artifacts of an export: their names, and how each is described in the report.
The deployment targets' files are their rows' in `engine.targets.registry`.

Torch-free on purpose: the worker (which never imports torch) and the CLI use it too.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from schemas import ArtifactInfo

PROGRAM = "program.pt2"
GRAPH = "graph.json"
SIGNATURE = "signature.json"
REPORT = "report.json"
PROVISIONAL_REPORT = "report.partial.json"
"""The report as it would be were the job stopped now by its time limit: written by a
sandboxed job before each target and before profiling, delivered by the worker when it
had to stop the job then (`ExportRequest.provisional_report`); never an artifact."""
CRASH_REPORT = "report.crashed.json"
"""The same were the job's process to crash now (die of a signal in native code),
delivered by the worker when it did."""
ARTIFACT_NAMES = (PROGRAM, GRAPH, SIGNATURE, REPORT)
ENCODER = "encoder.pt2"
"""An encoder-decoder model's encoder program, beside its decoder (`program.pt2`)."""


def artifact_info(path: Path) -> ArtifactInfo:
    """Name, size and SHA-256 of an artifact file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return ArtifactInfo(name=path.name, size=path.stat().st_size, sha256=digest.hexdigest())
