"""Messages between the worker and its zygote: JSON over a SOCK_SEQPACKET socket,
with file descriptors passed alongside (SCM_RIGHTS)."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

MAX_MESSAGE = 1 << 16
MAX_FDS = 4
SPARE_KINDS = ("job", "loader")
"""The zygote's spares, as its `spares` message names the ready ones."""


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
