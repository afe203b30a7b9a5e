"""Checkpoints named by reference: an `s3://bucket/prefix/` the deployment allow-lists
(docs/contract.md §1, *Checkpoints by reference*).

The API lists the prefix (names, sizes and ETags, never the bytes) and stores what it
found as the job's model upload, the manifest `checkpoint-source.json`; the worker reads
exactly those objects, each only if its ETag is still the listed one, into the job's
staging as a checkpoint zip. The rules both sides apply are here, once: plain Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import Field

from schemas._base import StrictModel
from schemas.limits import ZIP_MAX_ENTRIES
from schemas.model_zip import ADAPTER_CONFIG, ADAPTER_WEIGHTS, CONFIG, TOKENIZER_FILES

SOURCE_MANIFEST = "checkpoint-source.json"
"""The model upload of a job whose checkpoint is a reference: no user upload is named so
(a model upload is a `.py` or a `.zip`)."""
SOURCE_ZIP = "checkpoint.zip"
"""The name the worker gives the checkpoint it reads, in the job's staging."""
URL_MAX_LENGTH = 1024
MANIFEST_MAX_BYTES = 4 * 1024 * 1024
"""A manifest of `ZIP_MAX_ENTRIES` files of the longest names fits."""
KEY_WILDCARD = "{key}"
"""In an allow-listed prefix: the caller's API key id (one prefix per tenant)."""

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^[0-9]+(\.[0-9]+){3}$")
_PREFIX_PART = re.compile(r"^[A-Za-z0-9!_.*'()=+,@-][A-Za-z0-9!_.*'()=+,@ -]{0,254}$")
_WEIGHT_SUFFIXES = (".safetensors",)
_ALWAYS = (CONFIG, "generation_config.json", "model.safetensors.index.json")

__all__ = [
    "KEY_WILDCARD",
    "MANIFEST_MAX_BYTES",
    "SOURCE_MANIFEST",
    "SOURCE_ZIP",
    "URL_MAX_LENGTH",
    "CheckpointSource",
    "S3Prefix",
    "SourceFile",
    "allowed_prefix",
    "parse_prefix",
    "selected_files",
]


class SourceFile(StrictModel):
    """One object of a referenced checkpoint, as the API listed it."""

    path: str = Field(max_length=512, description="Relative to the prefix: the zip member.")
    size: int = Field(ge=0)
    etag: str = Field(min_length=1, max_length=256)


class CheckpointSource(StrictModel):
    """The manifest of a checkpoint reference: what the worker reads (`SOURCE_MANIFEST`)."""

    url: str = Field(max_length=URL_MAX_LENGTH, description="`s3://bucket/prefix/`.")
    files: list[SourceFile] = Field(max_length=ZIP_MAX_ENTRIES)

    @property
    def size(self) -> int:
        """The bytes of every file together."""
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class S3Prefix:
    """A bucket and a key prefix ending in `/` (or empty: the whole bucket)."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def key(self, path: str) -> str:
        """The object key of a file of the checkpoint."""
        return self.prefix + path

    def within(self, other: S3Prefix) -> bool:
        """Whether every key under this prefix is under `other`."""
        return self.bucket == other.bucket and self.prefix.startswith(other.prefix)


def parse_prefix(url: str) -> S3Prefix:
    """`s3://bucket/some/prefix` (a trailing `/` added) as an `S3Prefix`.

    Raises:
        ValueError: no `s3://` URL, a bucket name S3 does not allow, or a prefix with
            an empty, `.` or `..` part, a control character or a part S3 recommends
            against (the message says which).
    """
    if len(url) > URL_MAX_LENGTH:
        raise ValueError(f"longer than {URL_MAX_LENGTH} characters")
    if not url.startswith("s3://"):
        raise ValueError("not an s3:// URL")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket or _IP.match(bucket):
        raise ValueError(f"{bucket!r} is no S3 bucket name")
    parts = prefix.split("/")
    if parts and parts[-1] == "":
        parts.pop()
    for part in parts:
        if part in ("", ".", "..") or not _PREFIX_PART.match(part):
            raise ValueError(f"the prefix part {part!r} is not allowed")
    return S3Prefix(bucket, "".join(f"{part}/" for part in parts))


def allowed_prefix(
    reference: S3Prefix, allowed: Iterable[str], key_id: str | None
) -> S3Prefix | None:
    """The allow-listed prefix `reference` lies in, or None. An entry holding `{key}` is
    that of the caller's API key id only (never matched without a key)."""
    for entry in allowed:
        if KEY_WILDCARD in entry:
            if key_id is None or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", key_id):
                continue
            entry = entry.replace(KEY_WILDCARD, key_id)
        if reference.within(candidate := parse_prefix(entry)):
            return candidate
    return None


def selected_files(paths: Iterable[str]) -> list[str]:
    """Which files of a checkpoint folder a reference reads, as `torchport submit DIR`
    sends a directory: `config.json`, `generation_config.json`, the tokenizer's files
    (`TOKENIZER_FILES`), the weights
    (`*.safetensors` and their index; `pytorch_model*.bin` and its index only without a
    safetensors file), top-level `.py` files (the engine runs them only for a config
    with an `auto_map`, as it does a zip's), and each
    sub-folder's PEFT adapter (`adapter_config.json`, `adapter_model.safetensors`).
    Everything else (`original/` weights, optimizer states, READMEs) stays behind."""
    paths = sorted(set(paths))
    top = [p for p in paths if "/" not in p]
    chosen = [
        p for p in top if p in _ALWAYS or p in TOKENIZER_FILES or p.endswith(_WEIGHT_SUFFIXES)
    ]
    if not any(p.endswith(_WEIGHT_SUFFIXES) for p in top):
        chosen += [
            p
            for p in top
            if p.startswith("pytorch_model") and p.endswith((".bin", ".bin.index.json"))
        ]
    chosen += [p for p in top if p.endswith(".py")]
    adapters = {
        p.rsplit("/", 1)[0] for p in paths if p.count("/") == 1 and p.endswith(f"/{ADAPTER_CONFIG}")
    }
    chosen += [
        p
        for p in paths
        if p.count("/") == 1
        and p.rsplit("/", 1)[0] in adapters
        and p.rsplit("/", 1)[1] in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
    ]
    return sorted(set(chosen))
