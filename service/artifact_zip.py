"""Every artifact of a finished job as one zip, streamed (`GET /v1/exports/{id}/artifacts.zip`).

zipstream-ng writes the archive as it is read: each member's bytes come from the store in
1 MiB chunks (`ArtifactStore.read`, a local file or an S3 object), so neither the archive
nor any artifact is ever in memory or on disk whole, whatever the store. JSON artifacts are
deflated (graph.json is text and shrinks several times); everything else is stored as it
is: programs and packages (`.pt2`) are zips already, and weights (`model.onnx.data`,
`model.pte`) hardly compress while deflating gigabytes would hold an API core for minutes.

The archive also holds `manifest.json` (not an artifact): the job id and each artifact's
name, size, SHA-256 and media type, so a copy can be checked without the API.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator, Sequence

from zipstream import ZipStream

from persistence.models import Artifact
from persistence.store import ArtifactStore

MANIFEST = "manifest.json"
"""The archive's own member beside the artifacts."""
DEFLATED_SUFFIXES = (".json",)


def compress_type(name: str) -> int:
    """How a member is written: deflated for text (JSON), stored for everything else."""
    return zipfile.ZIP_DEFLATED if name.endswith(DEFLATED_SUFFIXES) else zipfile.ZIP_STORED


def manifest(job_id: str, artifacts: Sequence[Artifact]) -> bytes:
    """The manifest of a job's archive, as JSON."""
    listed = [
        {"name": a.name, "size": a.size, "sha256": a.sha256, "media_type": a.media_type}
        for a in artifacts
    ]
    return json.dumps({"job_id": job_id, "artifacts": listed}, indent=2).encode() + b"\n"


def _blob(store: ArtifactStore, sha256: str) -> Iterator[bytes]:
    """The blob's chunks, opened only when the archive reaches it (one open blob at a time)."""
    yield from store.read(sha256)


def artifact_zip(
    store: ArtifactStore, job_id: str, artifacts: Sequence[Artifact]
) -> Iterator[bytes]:
    """The zip of `artifacts` (and the manifest), in chunks as it is written; each
    member's size is given, so one over 4 GiB gets its zip64 record."""
    archive = ZipStream(compress_type=zipfile.ZIP_STORED)
    for artifact in artifacts:
        archive.add(
            _blob(store, artifact.sha256),
            artifact.name,
            size=artifact.size,
            compress_type=compress_type(artifact.name),
        )
    archive.add(manifest(job_id, artifacts), MANIFEST, compress_type=zipfile.ZIP_DEFLATED)
    yield from archive
