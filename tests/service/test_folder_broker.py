"""The embedded broker never hands a consumer a half-written message."""

from __future__ import annotations

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
