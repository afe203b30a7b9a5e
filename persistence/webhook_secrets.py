"""Webhook secrets, as the Standard Webhooks spec writes them: `whsec_` + base64 of random
bytes, the bytes being the HMAC key. The API makes them (`torchport keys create`); the
webhooks worker signs with them (`worker.webhooks`).

A secret made before torchport adopted the spec has no prefix: its UTF-8 bytes are the key,
so as `whsec_` + base64 of those bytes it works with every Standard Webhooks library.
"""

from __future__ import annotations

import base64
import binascii
import secrets

SECRET_PREFIX = "whsec_"
KEY_BYTES = 32
"""Random bytes of a new secret (the spec asks for 24 to 64)."""
MIN_KEY_BYTES = 24


def new_secret() -> str:
    """A new webhook secret: `whsec_` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def signing_key(secret: str) -> bytes:
    """The HMAC key of a secret: a `whsec_` secret's decoded bytes, else its UTF-8 bytes.

    Raises:
        ValueError: a `whsec_` secret whose rest is not base64 of at least 24 bytes.
    """
    if not secret.startswith(SECRET_PREFIX):
        return secret.encode("utf-8")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error as exc:
        raise ValueError("a whsec_ secret is whsec_ followed by base64") from exc
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"a whsec_ secret holds at least {MIN_KEY_BYTES} bytes")
    return key
