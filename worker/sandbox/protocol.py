"""Messages between the worker and its zygote: JSON over a SOCK_SEQPACKET socket,
with file descriptors passed alongside (SCM_RIGHTS)."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

from schemas.text import without_surrogates

MAX_MESSAGE = 1 << 16
MAX_FDS = 4
SPARE_KINDS = ("job", "loader")
"""The zygote's spares, as its `spares` message names the ready ones."""
QUIET_STAGES = ("decomposing",)
"""Stages of an export that keep one core busy (Python over the graph, no parallel
regions): the first progress line of a job in one is passed on to the zygote as `quiet`,
which forks the spares it owes then (spares.py)."""
JOB_SPEC = "spec.json"
"""The job child's spec (its uploads' paths, options file, out and work dirs), which the
worker writes into the job's staging root and the child reads after its lockdown: the
upload's file name never passes through the zygote, whose heap every later job inherits."""


MAX_DEPTH = 32
"""Nesting allowed in a line from a job (ours are at most 4 deep)."""


class UntrustedLine(ValueError):
    """A line from a job (or a loader) that is not a JSON object within the bounds."""


def _refuse_constant(name: str) -> Any:
    raise UntrustedLine(f"{name} is not JSON")


def loads_untrusted(data: bytes, max_bytes: int, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """Parse one JSON object written by untrusted code, within size and depth bounds.

    Every failure is `UntrustedLine`, never RecursionError (6,000 nested lists),
    OverflowError or MemoryError: a hostile line is that job's problem, not the reading
    process's. NaN and ±Infinity are refused (`int(float("inf"))` raises later); lone
    surrogates (`"\\udc80"`) become U+FFFD."""
    if len(data) > max_bytes:
        raise UntrustedLine(f"line of {len(data)} bytes (limit {max_bytes})")
    if data.count(b"[") + data.count(b"{") > max_depth and _depth(data) > max_depth:
        raise UntrustedLine(f"nested deeper than {max_depth}")
    try:
        message = json.loads(data, parse_constant=_refuse_constant)
    except UntrustedLine:
        raise
    except Exception as exc:  # ValueError, UnicodeDecodeError, RecursionError, ...
        raise UntrustedLine(f"not JSON: {type(exc).__name__}") from None
    if not isinstance(message, dict):
        raise UntrustedLine("not a JSON object")
    # `"\udc80"` is valid JSON but no UTF-8: whatever the worker passes on (progress
    # events, a refusal's message in the final report) must still be encodable.
    cleaned: dict[str, Any] = without_surrogates(message)
    return cleaned


def _depth(data: bytes) -> int:
    """The deepest nesting of brackets outside strings."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one message (and fds)."""
    data = json.dumps(message).encode()
    if len(data) > MAX_MESSAGE:
        raise ValueError("sandbox control message too large")
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and its fds; (None, []) when the other side is gone."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            _close(fd)
        return None, []
    message = json.loads(data)
    if not isinstance(message, dict):
        raise ValueError("sandbox control message is not an object")
    return message, list(fds)


def _close(fd: int) -> None:
    import os

    with contextlib.suppress(OSError):
        os.close(fd)
