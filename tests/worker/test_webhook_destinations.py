"""Hostile callback URLs: a delivery is no probe of the worker's network, and no receiver
holds a worker.

Found by an attack run: `callback_url` reached loopback, private ranges, `[::1]`,
link-local and 169.254.169.254, and the delivery record said "Connection refused" or
"HTTP 403" (a port scanner); a receiver dripping its answer a byte at a time held the
worker forever (httpx's read timeout is per read); webhooks shared the `cpu` queue.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import redis

from persistence.queue import Queue, enqueue_webhook, make_celery
from tests.conftest import REDIS_URL
from tests.worker.test_execution import public
from tests.worker.test_webhooks import Receiver, finished_job
from worker.execution import WorkerContext
from worker.webhooks import DELIVERY_FAILED, DeliveryFailed, deliver, is_public_address


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(200)
    yield r
    r.server.shutdown()


def _with(context: WorkerContext, **values: object) -> WorkerContext:
    context.settings = context.settings.model_copy(update=values)
    return context


REFUSED = [
    "http://127.0.0.1:{port}/hook",
    "http://localhost:{port}/hook",  # a host name that resolves to loopback
    "http://[::1]:{port}/hook",
    "http://[::ffff:127.0.0.1]:{port}/hook",
    "http://0.0.0.0:{port}/hook",
    "http://2130706433:{port}/hook",  # 127.0.0.1 as one number
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/hook",
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://224.0.0.1/hook",
    "http://240.0.0.1/hook",
]


@pytest.mark.parametrize("template", REFUSED)
def test_internal_destinations_are_refused_at_once_and_say_nothing(
    context: WorkerContext, tmp_path: Path, receiver: Receiver, template: str
) -> None:
    _with(context, webhook_timeout_s=2.0)
    port = receiver.server.server_address[1]
    job_id = finished_job(context, tmp_path, template.format(port=port), None)
    started = time.monotonic()
    assert deliver(context, job_id, final_attempt=False) is False  # no retry either
    assert time.monotonic() - started < 1.5
    assert receiver.requests == []
    webhook = public(context, job_id).webhook
    assert webhook is not None
    assert (webhook.status, webhook.attempts) == ("failed", 1)
    assert webhook.last_status_code is None
    assert webhook.last_error == DELIVERY_FAILED


def test_an_allowed_host_name_is_reached_on_its_checked_address(
    context: WorkerContext, tmp_path: Path, receiver: Receiver
) -> None:
    _with(context, webhook_allow_hosts="localhost")
    port = receiver.server.server_address[1]
    job_id = finished_job(context, tmp_path, f"http://LOCALHOST:{port}/hook", None)
    assert deliver(context, job_id, final_attempt=False) is True
    headers, _ = receiver.requests[0]
    assert headers["Host"] == f"localhost:{port}"
    webhook = public(context, job_id).webhook
    assert webhook is not None
    assert (webhook.status, webhook.last_status_code, webhook.last_error) == (
        "delivered",
        200,
        None,
    )


def test_connection_errors_and_internal_status_codes_are_not_shown(
    context: WorkerContext, tmp_path: Path
) -> None:
    _with(context, webhook_allow_hosts="127.0.0.1", webhook_timeout_s=2.0)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    job_id = finished_job(context, tmp_path, f"http://127.0.0.1:{closed}/", None)
    with pytest.raises(DeliveryFailed):
        deliver(context, job_id, final_attempt=False)
    webhook = public(context, job_id).webhook
    assert webhook is not None
    assert (webhook.status, webhook.last_status_code, webhook.last_error) == (
        "pending",
        None,
        DELIVERY_FAILED,
    )
    forbidden = Receiver(403)
    try:
        job_id = finished_job(context, tmp_path, forbidden.url, None)
        assert deliver(context, job_id, final_attempt=True) is False
        webhook = public(context, job_id).webhook
        assert webhook is not None
        assert (webhook.status, webhook.last_status_code, webhook.last_error) == (
            "failed",
            None,
            DELIVERY_FAILED,
        )
    finally:
        forbidden.server.shutdown()


def test_redirects_are_not_followed(
    context: WorkerContext, tmp_path: Path, receiver: Receiver
) -> None:
    target = f"http://localhost:{receiver.server.server_address[1]}/hook"

    class Redirect(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _with(context, webhook_allow_hosts="127.0.0.1")
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        job_id = finished_job(context, tmp_path, url, None)
        assert deliver(context, job_id, final_attempt=True) is False
        assert receiver.requests == []
    finally:
        server.shutdown()


class Dripper:
    """Reads the request, then answers one byte every 50 ms, forever."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                answer = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 100_000
                for byte in answer:
                    if self.stop.is_set():
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(0.05)
            except OSError:
                return


def test_a_dripping_receiver_is_cut_off_by_the_total_deadline(
    context: WorkerContext, tmp_path: Path
) -> None:
    dripper = Dripper()
    _with(context, webhook_allow_hosts="127.0.0.1", webhook_timeout_s=1.0)
    job_id = finished_job(context, tmp_path, dripper.url, None)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["delivered"] = deliver(context, job_id, final_attempt=True)
        except Exception as exc:
            outcome["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=10)
    elapsed = time.monotonic() - started
    dripper.stop.set()
    dripper.sock.close()
    assert not thread.is_alive(), "the dripping receiver still holds the delivery after 10 s"
    assert outcome == {"delivered": False}
    assert elapsed < 3.0
    webhook = public(context, job_id).webhook
    assert webhook is not None
    assert (webhook.status, webhook.last_error) == ("failed", DELIVERY_FAILED)


def test_webhooks_have_their_own_queue(context: WorkerContext, redis_prefix: str) -> None:
    app = make_celery(context.settings)
    client = redis.Redis.from_url(REDIS_URL)
    before = {q: client.llen(f"{redis_prefix}{q}") for q in ("cpu", "webhooks")}
    enqueue_webhook(app, "some-job")
    assert client.llen(f"{redis_prefix}{Queue.WEBHOOKS.value}") == before["webhooks"] + 1
    assert client.llen(f"{redis_prefix}cpu") == before["cpu"]
    client.delete(f"{redis_prefix}webhooks")


@pytest.mark.parametrize(
    ("address", "public_"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.2", False),
        ("::", False),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
        ("ff02::1", False),
        ("198.18.0.1", False),
    ],
)
def test_address_classification(address: str, public_: bool) -> None:
    import ipaddress

    assert is_public_address(ipaddress.ip_address(address)) is public_
