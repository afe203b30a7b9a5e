"""A checkpoint named by reference (`model_url`, docs/contract.md §1, *Checkpoints by
reference*): checked against the deployment's allow-list, listed (never read) with its
credentials, and its manifest made the job's model upload.

Blocking (S3 calls): endpoints call `resolve` from a worker thread.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from persistence import sources
from persistence.store import StoreError
from schemas.limits import ZIP_MAX_ENTRIES
from schemas.source import SOURCE_MANIFEST, allowed_prefix, parse_prefix
from service.auth import Caller
from service.errors import InternalError, InvalidRequest, UploadTooLarge
from service.settings import ServiceSettings
from service.uploads import UploadedFile, UploadedForm

__all__ = ["resolve"]


def resolve(form: UploadedForm, settings: ServiceSettings, caller: Caller, directory: Path) -> None:
    """Make the form's `model_url` its `model`: the reference's manifest
    (`schemas.source.SOURCE_MANIFEST`), written in `directory` and recorded in
    `form.source`. A form without `model_url` is left as it is.

    Raises:
        InvalidRequest: `model` given too, a URL that is no `s3://` prefix (`bad_url`),
            one outside the allow-list (`source_not_allowed`), or a prefix that holds no
            checkpoint, too many objects or cannot be read (`sources.SourceError`'s reason).
        UploadTooLarge: over `TORCHPORT_MAX_CHECKPOINT_BYTES` (`details.limit` `checkpoint`).
        InternalError: S3 did not answer (`source_unavailable`).
    """
    if form.model_url is None:
        return
    url = form.model_url.strip()
    if "model" in form.files:
        raise InvalidRequest(
            "send the model as a file or by model_url, not both",
            details={"field": "model_url", "reason": "model_and_model_url"},
        )
    try:
        prefix = parse_prefix(url)
    except ValueError as exc:
        raise InvalidRequest(
            f"model_url is no s3:// prefix: {exc}",
            hint="name the folder save_pretrained wrote, as s3://bucket/path/to/checkpoint/",
            details={"field": "model_url", "reason": "bad_url"},
        ) from exc
    if allowed_prefix(prefix, settings.allowed_sources, caller.key_id) is None:
        raise InvalidRequest(
            f"{prefix.url} is not under a prefix this deployment reads checkpoints from",
            hint="ask the deployment's operators which s3:// prefixes are allowed "
            "(TORCHPORT_CHECKPOINT_SOURCES), or upload the checkpoint as a zip",
            details={"field": "model_url", "reason": "source_not_allowed", "url": prefix.url},
        )
    try:
        source = sources.list_source(
            sources.client(settings.s3_endpoint_url),
            prefix.url,
            max_files=ZIP_MAX_ENTRIES,
            max_bytes=settings.max_checkpoint_bytes,
            prefix=prefix,
        )
    except sources.SourceError as exc:
        if exc.reason == "source_too_large":
            raise UploadTooLarge(
                exc.message,
                hint=exc.hint,
                details={**exc.details, "field": "model", "limit": "checkpoint"},
            ) from exc
        raise InvalidRequest(
            exc.message, hint=exc.hint, details={"field": "model_url", **exc.details}
        ) from exc
    except StoreError as exc:
        raise InternalError(
            f"S3 did not answer while {prefix.url} was listed",
            hint="submit again in a moment",
            details={"reason": "source_unavailable", "url": prefix.url},
        ) from exc
    manifest = source.model_dump_json(indent=1).encode("utf-8")
    path = directory / "model"
    path.write_bytes(manifest)
    form.files["model"] = UploadedFile(
        field="model",
        filename=SOURCE_MANIFEST,
        path=path,
        sha256=hashlib.sha256(manifest).hexdigest(),
        size=len(manifest),
    )
    form.source = source
