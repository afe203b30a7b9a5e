"""Checkpoints named by reference (`schemas.source`), read from S3 with the deployment's
own credentials (boto3's default chain, `TORCHPORT_S3_ENDPOINT_URL`).

The API lists a reference (`list_source`: names, sizes and ETags, never the bytes); the
worker reads what was listed (`read_source`) straight into the job's staging as a stored
zip, each object only while its ETag is the listed one. Nothing here follows an address
the deployment did not name: the bucket is the allow-list's, the endpoint the
deployment's, and a key is the listed prefix plus a listed name.
"""

from __future__ import annotations

import functools
import zipfile
from pathlib import Path
from typing import Any

from persistence.store import CHUNK, StoreError
from schemas.model_zip import CONFIG, aligned_member, member_parts
from schemas.source import CheckpointSource, S3Prefix, SourceFile, parse_prefix, selected_files

__all__ = ["SourceError", "client", "list_source", "read_source"]

_UNREADABLE = frozenset({"AccessDenied", "403", "NoSuchBucket", "AllAccessDisabled"})
_CHANGED = frozenset({"PreconditionFailed", "412", "NoSuchKey", "404", "NotFound"})


class SourceError(Exception):
    """A reference that cannot be exported as it is (the user's to fix: `invalid_request`
    or, for `source_too_large`, `upload_too_large`); `reason` and `details` say why."""

    def __init__(self, message: str, reason: str, hint: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.hint = hint
        self.details = {"reason": reason, **details}


@functools.cache
def client(endpoint_url: str | None) -> Any:
    """The process's S3 client for `endpoint_url`, with the deployment's credentials
    (boto3's default chain); made once, shared by threads (boto3 clients are safe to)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        config=Config(retries={"max_attempts": 3, "mode": "standard"}),
    )


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


def _call(url: str, call: Any, **kwargs: Any) -> Any:
    """`call(**kwargs)`; S3's refusals as `SourceError`, outages as `StoreError`."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return call(**kwargs)
    except ClientError as exc:
        code = _code(exc)
        if code in _UNREADABLE:
            raise SourceError(
                f"{url} cannot be read with the deployment's credentials ({code})",
                "source_unreadable",
                "ask the deployment's operators to let the workers read this prefix",
                url=url,
                s3_error=code,
            ) from exc
        if code in _CHANGED and "Key" in kwargs:
            raise _changed(url, kwargs["Key"], code) from exc
        raise StoreError(f"S3 answered {code or 'an error'} for {url}: {exc}") from exc
    except BotoCoreError as exc:
        raise StoreError(f"S3 could not be reached for {url}: {exc}") from exc


def _changed(url: str, key: str, why: str) -> SourceError:
    return SourceError(
        f"{key} changed or went away after the job was submitted ({why})",
        "source_changed",
        "submit the job again: it lists the prefix anew; keep a checkpoint's files "
        "unchanged until its jobs have started",
        url=url,
        key=key,
    )


def _clean(path: str) -> bool:
    """Whether a key's name below the prefix is a plain relative path (what a zip member
    unpacks to, unchanged), of printable characters."""
    return (
        "\\" not in path
        and path.isprintable()
        and "/".join(member_parts(path)) == path
        and ".." not in path.split("/")
    )


def list_source(
    s3: Any, url: str, *, max_files: int, max_bytes: int, prefix: S3Prefix | None = None
) -> CheckpointSource:
    """The manifest of the checkpoint at `url` (an allow-listed prefix, checked by the
    caller): its files as `schemas.source.selected_files` picks them.

    Raises:
        SourceError: more than `max_files` objects under the prefix
            (`source_too_many_files`), no `config.json` at its top (`source_not_a_checkpoint`),
            over `max_bytes` (`source_too_large`), or not readable (`source_unreadable`).
        StoreError: S3 did not answer.
    """
    prefix = prefix or parse_prefix(url)
    found: dict[str, tuple[int, str]] = {}
    listed = 0
    token: str | None = None
    while True:
        page = _call(
            prefix.url,
            s3.list_objects_v2,
            Bucket=prefix.bucket,
            Prefix=prefix.prefix,
            **({"ContinuationToken": token} if token else {}),
        )
        for item in page.get("Contents", []):
            listed += 1
            if listed > max_files:
                raise SourceError(
                    f"{prefix.url} holds more than {max_files} objects",
                    "source_too_many_files",
                    "name the folder that holds config.json and the weights",
                    url=prefix.url,
                    max_files=max_files,
                )
            path = str(item["Key"])[len(prefix.prefix) :]
            if path and not path.endswith("/") and _clean(path):
                found[path] = (int(item["Size"]), str(item.get("ETag", "")))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            break
    chosen = selected_files(found)
    if CONFIG not in chosen:
        raise SourceError(
            f"{prefix.url} holds no config.json: it is no save_pretrained checkpoint",
            "source_not_a_checkpoint",
            "name the folder `save_pretrained` wrote (the one holding config.json)",
            url=prefix.url,
            files=sorted(found)[:20],
        )
    source = CheckpointSource(
        url=prefix.url,
        files=[SourceFile(path=p, size=found[p][0], etag=found[p][1] or "-") for p in chosen],
    )
    if source.size > max_bytes:
        raise SourceError(
            f"the checkpoint at {prefix.url} is {source.size} bytes, over the limit of {max_bytes}",
            "source_too_large",
            "export a smaller checkpoint, or ask the operators for a larger "
            "TORCHPORT_MAX_CHECKPOINT_BYTES",
            url=prefix.url,
            bytes=source.size,
            limit_bytes=max_bytes,
        )
    return source


def read_source(s3: Any, source: CheckpointSource, archive: Path) -> int:
    """Write the manifest's files into `archive`, a zip of stored members named by their
    paths, each read only if its ETag is still the listed one and exactly its listed size;
    returns the bytes read.

    Raises:
        SourceError: an object changed or went away (`source_changed`), or cannot be
            read (`source_unreadable`).
        StoreError: S3 did not answer.
    """
    prefix = parse_prefix(source.url)
    total = 0
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for item in source.files:
            key = prefix.key(item.path)
            condition = {"IfMatch": item.etag} if item.etag != "-" else {}
            answer = _call(prefix.url, s3.get_object, Bucket=prefix.bucket, Key=key, **condition)
            body = answer["Body"]
            written = 0
            info = aligned_member(item.path, zf.fp.tell() if zf.fp else 0)
            with zf.open(info, "w", force_zip64=True) as member:
                while chunk := body.read(CHUNK):
                    written += len(chunk)
                    if written > item.size:
                        break
                    member.write(chunk)
            body.close()
            if written != item.size:
                raise _changed(source.url, key, f"{written} bytes, listed as {item.size}")
            total += written
    return total
