"""The checkpoint of a job that names it by reference (`schemas.source`): the worker reads
the objects its manifest lists from S3, with the deployment's credentials, straight into
the job's staging as a checkpoint zip. The job's code never sees a credential, and the
worker reads only what the API listed, under a prefix its own allow-list admits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from persistence import sources
from persistence.store import ArtifactStore
from schemas import ErrorBody, UploadRef
from schemas.source import (
    MANIFEST_MAX_BYTES,
    SOURCE_MANIFEST,
    SOURCE_ZIP,
    CheckpointSource,
    allowed_prefix,
    parse_prefix,
)

__all__ = ["ReferencedCheckpoint", "is_reference", "source_error"]


def is_reference(ref: UploadRef) -> bool:
    """Whether a job's model upload is a reference's manifest (made only by the API: a
    user's model upload is a `.py` or a `.zip`)."""
    return ref.name == SOURCE_MANIFEST


@dataclass(frozen=True)
class ReferencedCheckpoint:
    """A `worker.sandbox.UploadSource`: the manifest's objects, zipped where the sandbox
    stages the model."""

    store: ArtifactStore
    ref: UploadRef
    allowed: tuple[str, ...]
    owner: str | None
    endpoint_url: str | None

    @property
    def name(self) -> str:
        return SOURCE_ZIP

    def manifest(self) -> CheckpointSource:
        """The manifest, bounded and validated, under a prefix this worker may read.

        Raises:
            sources.SourceError: a manifest this worker does not take
                (`source_not_allowed`, or `bad_manifest` where the store's blob is not one).
        """
        if self.store.size(self.ref.sha256) > MANIFEST_MAX_BYTES:
            raise _bad_manifest(f"over {MANIFEST_MAX_BYTES} bytes")
        raw = b"".join(self.store.read(self.ref.sha256))
        try:
            source = CheckpointSource.model_validate(json.loads(raw))
            prefix = parse_prefix(source.url)
        except (ValueError, ValidationError) as exc:
            raise _bad_manifest(str(exc)[:300]) from exc
        if allowed_prefix(prefix, self.allowed, self.owner) is None:
            raise sources.SourceError(
                f"{prefix.url} is not under a prefix this worker reads checkpoints from",
                "source_not_allowed",
                "the allow-lists of the API and the workers differ "
                "(TORCHPORT_CHECKPOINT_SOURCES): ask the deployment's operators",
                url=prefix.url,
            )
        return source

    def copy_to(self, target: Path) -> None:
        sources.read_source(sources.client(self.endpoint_url), self.manifest(), target)


def _bad_manifest(why: str) -> sources.SourceError:
    return sources.SourceError(
        f"the job's checkpoint manifest cannot be read: {why}",
        "bad_manifest",
        "submit the job again with its model_url",
    )


def source_error(exc: sources.SourceError) -> ErrorBody:
    """The job's error for a reference it could not read: `invalid_request` at loading."""
    return ErrorBody(
        code="invalid_request",
        message=exc.message,
        hint=exc.hint,
        stage="loading",
        details=exc.details,
    )
