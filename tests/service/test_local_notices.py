"""With the embedded broker, job notices travel as datagrams to the API process's socket in
the data directory: a stream is woken at once instead of at its next poll."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from persistence.notices import LocalPublisher, local_socket, make_publisher
from service.streams import EventHub

T = TypeVar("T")


def run(scenario: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a loop of its own, in a thread: another fixture (Playwright's)
    may keep a loop running in this one, where asyncio.run refuses to start a second."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, scenario()).result()  # type: ignore[arg-type]


def test_a_notice_wakes_the_streams_of_its_job_only(tmp_path: Path) -> None:
    async def scenario() -> tuple[bool, bool, bool, bool]:
        hub = EventHub("filesystem://", None, data_dir=tmp_path)
        await hub.start()
        live = hub.live
        publisher = make_publisher("filesystem://", None, tmp_path)
        assert isinstance(publisher, LocalPublisher)
        with hub.watch("job-a") as woken, hub.watch("job-b") as other:
            publisher.publish({"job-a"})
            await asyncio.wait_for(woken.wait(), 2.0)
            await asyncio.sleep(0.05)
            result = (live, woken.is_set(), other.is_set())
        await hub.stop()
        return (*result, (tmp_path / "notices.sock").exists())

    live, woken, other, left = run(scenario)
    assert live and woken and not other
    assert not left  # the socket goes with the API process


def test_a_publisher_without_a_listener_drops_its_notice(tmp_path: Path) -> None:
    publisher = make_publisher("filesystem://", None, tmp_path)
    assert publisher is not None
    publisher.publish({"job-a"})  # nobody listens: no error, nothing kept


def test_only_the_embedded_broker_uses_the_socket(tmp_path: Path) -> None:
    assert make_publisher("amqp://guest@localhost//", None, tmp_path) is None
    assert EventHub("amqp://guest@localhost//", None, data_dir=tmp_path).socket_path is None
    assert local_socket(tmp_path) == tmp_path.absolute() / "notices.sock"


def test_a_data_dir_too_long_for_a_socket_polls(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    assert local_socket(deep) is None
    assert make_publisher("filesystem://", None, deep) is None

    async def scenario() -> bool:
        hub = EventHub("filesystem://", None, data_dir=deep)
        await hub.start()
        live = hub.live
        await hub.stop()
        return live

    assert run(scenario) is False
