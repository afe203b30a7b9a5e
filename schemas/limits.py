"""The limits of the contract that more than one layer enforces, each written once.

The API refuses an upload that breaks one of them before a job exists; the engine
enforces the same numbers where the upload is unpacked or run, so an upload the API took
never fails later on a different number. Deployment-specific limits (upload sizes, a
worker's caps) are settings; these are not.
"""

from __future__ import annotations

MAX_TIMEOUT_S = 24 * 3600
"""The largest `timeout_s` an export may ask for. A worker may cap it lower
(`TORCHPORT_SANDBOX_MAX_TIMEOUT_S`); the broker's visibility timeout must exceed it."""

ZIP_MAX_ENTRIES = 10_000
"""Most entries a model zip may hold (`__MACOSX/` included at upload, where they are
counted before the archive is parsed)."""

ZIP_MAX_UNPACKED_BYTES = 256 * 1024 * 1024
"""Most bytes a model zip of code may unpack to (weights travel separately)."""

CHECKPOINT_ZIP_MAX_UNPACKED_BYTES = 20 * 1024 * 1024 * 1024
"""Most bytes a checkpoint zip (`schemas.model_zip`) may unpack to: its weights travel
inside it. As large as the default upload limit of a checkpoint zip, so a stored
(uncompressed) zip the API takes always unpacks: an 8B-parameter bfloat16 checkpoint
(16 GB) fits. A job's disk quota grows with its upload (the worker's sizing)."""

CALLBACK_URL_MAX_LENGTH = 2048
"""Longest `callback_url`, in characters (the form field may hold 4 UTF-8 bytes each)."""

CALLBACK_URL_PATTERN = r"^https?://[^\x00-\x1f\x7f]*$"
"""An http(s) URL without control characters (a NUL cannot even be stored by PostgreSQL)."""

__all__ = [
    "CALLBACK_URL_MAX_LENGTH",
    "CALLBACK_URL_PATTERN",
    "CHECKPOINT_ZIP_MAX_UNPACKED_BYTES",
    "MAX_TIMEOUT_S",
    "ZIP_MAX_ENTRIES",
    "ZIP_MAX_UNPACKED_BYTES",
]
