"""The embedded broker never hands a consumer a half-written message, and wakes a waiting
consumer when a message is put instead of leaving it to its polling interval."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection
from kombu.transport import filesystem

from persistence import folder_broker


def _channel(transport: Any, folder: Path) -> Any:
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder)}
    connection = Connection("filesystem://", transport=transport, transport_options=options)
    return connection, connection.channel()


def _read_while_writing(module: Any, monkeypatch: pytest.MonkeyPatch, channel: Any) -> list[Any]:
    """Put one message, and let a consumer poll at the moment its bytes are being made."""
    seen: list[Any] = []
    encode = module.str_to_bytes

    def consumer_polls_now(text: str) -> bytes:
        try:
            seen.append(channel._get("cpu"))
        except Exception as exc:  # what kombu's own transport runs into
            seen.append(exc)
        return encode(text)

    monkeypatch.setattr(module, "str_to_bytes", consumer_polls_now)
    channel._put("cpu", {"job": "j1"})
    monkeypatch.setattr(module, "str_to_bytes", encode)
    return seen


def test_a_message_is_invisible_until_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection, channel = _channel(folder_broker.Transport, tmp_path)
    with connection:
        seen = _read_while_writing(folder_broker, monkeypatch, channel)
        assert len(seen) == 1 and type(seen[0]).__name__ == "Empty"
        assert channel._get("cpu") == {"job": "j1"}
        assert list(tmp_path.iterdir()) == []


def test_kombus_own_transport_loses_that_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Why the transport above exists: the same timing empties kombu's queue for good.
    connection, channel = _channel(filesystem.Transport, tmp_path)
    with connection:
        seen = _read_while_writing(filesystem, monkeypatch, channel)
        assert len(seen) == 1 and isinstance(seen[0], ValueError)
        with pytest.raises(Exception) as empty:
            channel._get("cpu")
        assert type(empty.value).__name__ == "Empty"


def test_the_service_uses_it_for_the_embedded_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from persistence.queue import make_celery
    from service.settings import CommonSettings

    monkeypatch.setenv("TORCHPORT_DATA_DIR", str(tmp_path))
    app = make_celery(CommonSettings())
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, folder_broker.Transport)


def _options(folder: Path, polling_interval: float) -> dict[str, Any]:
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        # kombu's exchange tables, else `control/` in the current directory, shared with
        # every other test that runs there
        "control_folder": str(folder.parent / "control"),
        "polling_interval": polling_interval,
    }


def test_a_waiting_consumer_is_woken_by_a_put(tmp_path: Path) -> None:
    # With a 30 s polling interval only the wake-up can hand the message over in time.
    folder = tmp_path / "queue"
    folder.mkdir()
    options = _options(folder, 30.0)
    transport = folder_broker.Transport
    with (
        Connection("filesystem://", transport=transport, transport_options=options) as consumer,
        Connection("filesystem://", transport=transport, transport_options=options) as producer,
    ):
        inbox = consumer.SimpleQueue("cpu")
        got: list[tuple[Any, float]] = []

        def receive() -> None:
            message = inbox.get(block=True, timeout=10)
            got.append((message.payload, time.monotonic()))
            message.ack()

        reader = threading.Thread(target=receive)
        reader.start()
        deadline = time.monotonic() + 5
        while not list((tmp_path / folder_broker.WAKE_DIR).glob("*.sock")):
            assert time.monotonic() < deadline, "the consumer never bound its socket"
            time.sleep(0.01)
        time.sleep(0.2)  # it has looked at the empty folder and waits
        sent = time.monotonic()
        producer.SimpleQueue("cpu").put({"job": "j1"})
        reader.join(15)
        assert got and got[0][0] == {"job": "j1"}
        assert got[0][1] - sent < 2.0  # the polling interval is 30 s
        inbox.close()
    assert list((tmp_path / folder_broker.WAKE_DIR).glob("*.sock")) == []  # closed: removed


def test_sockets_of_dead_consumers_are_removed(tmp_path: Path) -> None:
    wake = tmp_path / folder_broker.WAKE_DIR
    wake.mkdir()
    live = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    live.bind(str(wake / "live.sock"))
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(wake / "dead.sock"))
    dead.close()  # its consumer died: the file stays, nobody reads it
    with live:
        assert folder_broker.wake_consumers(wake) == 1
        assert live.recv(8) == b"\x01"
    assert sorted(p.name for p in wake.iterdir()) == ["live.sock"]
    assert folder_broker.wake_consumers(tmp_path / "missing") == 0
