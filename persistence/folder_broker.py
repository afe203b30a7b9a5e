"""kombu's filesystem transport, with message files that appear whole or not at all, and
consumers woken when one appears instead of waiting out their polling interval.

kombu's own `_put` creates the message file and then writes it. A consumer polling the
folder can move and read the file in between, get an empty payload, and the job is lost
(until the API's reaper sends it again, minutes later). Here a message is written under a
staging name that consumers skip (they only take `*.<queue>.msg`) and renamed into place.

kombu's consumer sleeps `polling_interval` after each empty look at the folder, so a job
waited half of it on average, and one interval here (a job's queue time followed the
interval: 46 ms at 50 ms, 9 ms at 10 ms). Each consumer process now binds a datagram
socket in `<broker>/wake/` and waits on it instead of sleeping; `_put` sends a byte to
every socket there once the message is in place. The interval stays the bound on a lost
wake-up. Sockets of consumers that died are removed by the next `_put` (the kernel
refuses a datagram to them).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic, sleep
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

from persistence.notices import fits_socket_address

WAKE_DIR = "wake"
"""Beside the queue folder: one socket per consumer process."""


def wake_dir(queue_folder: str) -> Path:
    """The folder of the consumers' wake-up sockets of a queue folder."""
    return Path(queue_folder).parent / WAKE_DIR


def wake_consumers(directory: Path) -> int:
    """Send one byte to every consumer socket in `directory`; returns how many got it."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    woken = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sender:
        sender.setblocking(False)
        for name in names:
            path = directory / name
            try:
                sender.sendto(b"\x01", str(path))
                woken += 1
            except ConnectionRefusedError:  # its consumer died
                with contextlib.suppress(OSError):
                    path.unlink()
            except OSError:  # a full queue (it is awake anyway), not a socket
                continue
    return woken


class Channel(filesystem.Channel):
    """The filesystem channel with an atomic put that wakes the consumers."""

    # kombu names the argument `message` in its base class and `payload` here: keep theirs.
    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        staging = final + ".part"
        try:
            with open(staging, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(staging, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc
        wake_consumers(wake_dir(self.data_folder_out))


class Transport(filesystem.Transport):
    """The embedded broker of `torchport serve`."""

    Channel = Channel

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._waker: socket.socket | None = None
        self._waker_path: Path | None = None

    def _bind_waker(self) -> socket.socket | None:
        if self._waker is not None:
            return self._waker
        options = self.client.transport_options if self.client is not None else {}
        folder = options.get("data_folder_in")
        if not folder:
            return None
        directory = wake_dir(folder)
        path = directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.sock"
        if not fits_socket_address(path):  # polling only
            return None
        waker = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            directory.mkdir(mode=0o700, exist_ok=True)
            waker.bind(str(path))
            waker.setblocking(False)
        except OSError:
            waker.close()
            return None
        self._waker, self._waker_path = waker, path
        return waker

    def _wait(self, seconds: float) -> None:
        """Sleep up to `seconds`, or until a producer wakes this consumer."""
        waker = self._bind_waker()
        if waker is None:
            sleep(seconds)
            return
        ready, _, _ = select.select([waker], [], [], seconds)
        if ready:
            with contextlib.suppress(OSError):
                while waker.recv(64):
                    pass

    def drain_events(  # type: ignore[override]
        self, connection: Any, timeout: float | None = None
    ) -> None:
        """kombu's `virtual.Transport.drain_events`, waiting on the wake-up socket where it
        sleeps. The socket is bound before the first look at the folder, so a message
        put after that look always finds it."""
        self._bind_waker()
        started = monotonic()
        assert self.cycle is not None
        get = self.cycle.get
        interval = self.polling_interval
        if timeout and interval and interval > timeout:
            interval = timeout
        while True:
            try:
                get(self._deliver, timeout=timeout)
            except Empty:
                if timeout is not None and monotonic() - started >= timeout:
                    raise TimeoutError() from None
                if interval is not None:
                    self._wait(interval)
            else:
                break

    def close_connection(self, connection: Any) -> None:
        if self._waker is not None:
            self._waker.close()
            self._waker = None
            if self._waker_path is not None:
                with contextlib.suppress(OSError):
                    self._waker_path.unlink()
        super().close_connection(connection)
