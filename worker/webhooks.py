"""Completion callbacks: POST the job body to the job's `callback_url`, signed.

Signed per the Standard Webhooks spec, by the `standardwebhooks` package: `webhook-id` (the
job id, the same on every retry, so a receiver can drop duplicates), `webhook-timestamp`
(unix seconds), `webhook-signature: v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`, so
a receiver verifies with any Standard Webhooks library. The secret is the submitting API
key's webhook secret (shown by `torchport keys create`), or `TORCHPORT_WEBHOOK_SECRET` for
keyless servers; `persistence.webhook_secrets` says how a secret gives the key. Deprecated,
sent one more release for receivers that verify the old way: `X-Torchport-Timestamp` and
`X-Torchport-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`, keyed with the
secret's text as shown.

The delivery itself stays ours, on httpcore: the URL is the caller's, so a delivery must
not become a probe of the worker's network, and no HTTP client library pins a checked
address and holds one deadline over DNS, connect, TLS and the answer's headers:

- the host is resolved once and every address it resolves to must be public (not
  loopback, private, link-local — 169.254.169.254 is —, shared, multicast, reserved or
  unspecified; IPv4 inside IPv6 is checked as IPv4), unless the host is named in
  `TORCHPORT_WEBHOOK_ALLOW_HOSTS`; the connection then goes to that checked address (the
  URL's host name is still sent as `Host` and used for TLS), so a second DNS answer can
  never redirect it;
- redirects are not followed (a 3xx is a failed delivery);
- one delivery has one deadline, `TORCHPORT_WEBHOOK_TIMEOUT_S`, for everything (DNS,
  connect, TLS, sending, the answer's status line and headers): every socket operation
  gets what is left of it, and a timer shuts the socket down when it passes, so a
  receiver that drips its answer a byte at a time is cut off; the body is never read;
- what the caller sees is only `delivery failed`: no connection error, and the HTTP
  status only of a public host (the operator finds the reason in the worker's log).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpcore
from sqlalchemy import update
from standardwebhooks import Webhook

from persistence.database import transaction
from persistence.models import ApiKey, Job, utcnow
from persistence.records import load_job, to_public
from persistence.webhook_secrets import signing_key
from worker.execution import WorkerContext

logger = logging.getLogger(__name__)

DELIVERY_FAILED = "delivery failed"
"""The one error text a delivery record shows."""

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")


class DeliveryFailed(Exception):
    """The receiver did not answer 2xx; retried with backoff."""


class DestinationRefused(Exception):
    """The callback URL names an address the worker may not call (or cannot resolve)."""


def legacy_signature(secret: str, timestamp: str, body: bytes) -> str:
    """The deprecated `X-Torchport-Signature` value of a body sent at `timestamp`."""
    mac = hmac.new(secret.encode("utf-8"), timestamp.encode("ascii") + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signature_headers(secret: str, message_id: str, sent_at: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of `body` sent at unix time `sent_at`, and the
    deprecated ones."""
    timestamp = str(sent_at)
    signature = Webhook(signing_key(secret)).sign(
        message_id, datetime.fromtimestamp(sent_at, tz=UTC), body.decode("utf-8")
    )
    return {
        "webhook-id": message_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": signature,
        "X-Torchport-Timestamp": timestamp,
        "X-Torchport-Signature": legacy_signature(secret, timestamp, body),
    }


def is_public_address(address: IPAddress) -> bool:
    """Whether a webhook may be sent to `address`: a global unicast address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded: list[ipaddress.IPv4Address] = []
        if address.ipv4_mapped is not None:
            embedded.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            embedded.append(address.sixtofour)
        if address.teredo is not None:
            embedded.extend(address.teredo)
        if address in _NAT64:
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address in _NAT64_LOCAL:
            return False
        if any(not is_public_address(inner) for inner in embedded):
            return False
    return bool(
        address.is_global
        and not (
            address.is_private
            or address.is_loopback
            or address.is_link_local
            or address.is_multicast
            or address.is_reserved
            or address.is_unspecified
        )
    )


def allowed_hosts(setting: str) -> frozenset[str]:
    """The host names of `TORCHPORT_WEBHOOK_ALLOW_HOSTS` (comma-separated), normalized."""
    return frozenset(_normalize(h) for h in setting.split(",") if h.strip())


def _normalize(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _getaddrinfo(host: str, port: int, timeout: float) -> list[IPAddress]:
    """The addresses of `host`, resolved in a thread so the deadline holds over DNS too."""
    result: dict[str, Any] = {}

    def resolve() -> None:
        try:
            result["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            result["error"] = exc

    thread = threading.Thread(target=resolve, name="webhook-dns", daemon=True)
    thread.start()
    thread.join(timeout)
    if "infos" not in result:
        raise DestinationRefused(f"cannot resolve {host!r}: {result.get('error', 'timed out')}")
    addresses: list[IPAddress] = []
    for family, *_, sockaddr in result["infos"]:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise DestinationRefused(f"{host!r} has no IP address")
    return addresses


def check_destination(
    url: str, allow: Iterable[str], timeout: float
) -> tuple[str, int, IPAddress, bool]:
    """Resolve the URL's host and check every address it has.

    Returns:
        (host, port, the address to connect to, whether the host is an allowed internal
        one rather than a public one).

    Raises:
        DestinationRefused: not http(s), no host, unresolvable, or an address that is not
            public and a host not in `allow`.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DestinationRefused(f"not an http(s) URL with a host: {url!r}")
    host = _normalize(parts.hostname)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise DestinationRefused(f"bad port in {url!r}") from exc
    try:
        addresses: list[IPAddress] = [ipaddress.ip_address(host)]
    except ValueError:
        addresses = _getaddrinfo(host, port, timeout)
    internal = host in set(allow)
    if not internal:
        refused = [str(a) for a in addresses if not is_public_address(a)]
        if refused:
            raise DestinationRefused(f"{host!r} resolves to non-public {', '.join(refused)}")
    return host, port, addresses[0], internal


class _DeadlineStream(httpcore.NetworkStream):
    """A stream whose every operation gets at most what is left of the deadline."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float) -> None:
        self._inner = inner
        self._deadline = deadline

    def _left(self, timeout: float | None) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout("the delivery deadline passed")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, self._left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for start in range(0, len(buffer), 16384):
            self._inner.write(buffer[start : start + 16384], self._left(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        inner = self._inner.start_tls(ssl_context, server_hostname, self._left(timeout))
        return _DeadlineStream(inner, self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects to the one checked address whatever host the URL names, and shuts the
    socket down when the deadline passes (a blocked read or write returns at once)."""

    def __init__(self, address: IPAddress, deadline: float) -> None:
        self._address = str(address)
        self._deadline = deadline
        self._inner = httpcore.SyncBackend()
        self.timers: list[threading.Timer] = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout("the delivery deadline passed")
        stream = self._inner.connect_tcp(
            self._address,
            port,
            timeout=left if timeout is None else min(timeout, left),
            local_address=local_address,
            socket_options=socket_options,
        )
        sock = stream.get_extra_info("socket")
        if sock is not None:
            timer = threading.Timer(
                max(0.0, self._deadline - time.monotonic()), _shut_down, args=(sock,)
            )
            timer.daemon = True
            timer.start()
            self.timers.append(timer)
        return _DeadlineStream(stream, self._deadline)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("webhooks are sent over TCP only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _shut_down(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def post(
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    timeout_s: float,
    allow: Iterable[str] = (),
) -> tuple[int, bool]:
    """POST `body` to `url` within `timeout_s` in all; the answer's body is not read.

    Returns:
        (HTTP status, whether the host was an allowed internal one).

    Raises:
        DestinationRefused: the destination is not public (see `check_destination`).
        Exception: any transport error (httpcore's, OSError, ssl), or the deadline.
    """
    deadline = time.monotonic() + timeout_s
    _, _, address, internal = check_destination(url, allow, timeout_s)
    backend = _PinnedBackend(address, deadline)
    left = max(0.001, deadline - time.monotonic())
    try:
        with (
            httpcore.ConnectionPool(network_backend=backend, max_connections=1, retries=0) as pool,
            pool.stream(
                "POST",
                url,
                headers=[*headers.items(), ("Content-Length", str(len(body)))],
                content=body,
                extensions={
                    "timeout": {"connect": left, "read": left, "write": left, "pool": left}
                },
            ) as answer,
        ):
            return answer.status, internal
    finally:
        for timer in backend.timers:
            timer.cancel()


def deliver(context: WorkerContext, job_id: str, *, final_attempt: bool) -> bool:
    """Send one delivery attempt and record it on the job; True when delivered (or moot).

    A destination that is not public fails the delivery at once, without retries.

    Raises:
        DeliveryFailed: the attempt failed and another will follow.
    """
    with context.sessions() as session:
        job = load_job(session, job_id)
        if job is None or job.webhook_status in (None, "delivered"):
            return True
        public = to_public(job)
        secret = context.settings.webhook_secret
        if job.owner_id is not None:
            key = session.get(ApiKey, job.owner_id)
            secret = key.webhook_secret if key is not None else None
    url = public.callback_url
    if url is None:
        return True
    body = public.model_dump_json().encode("utf-8")
    headers = {"Content-Type": "application/json", "X-Torchport-Job": job_id}
    if secret:
        headers |= signature_headers(secret, job_id, int(time.time()), body)
    else:
        headers["X-Torchport-Timestamp"] = str(int(time.time()))
    status_code: int | None = None
    delivered = False
    final = final_attempt
    try:
        status, internal = post(
            url,
            body,
            headers,
            timeout_s=context.settings.webhook_timeout_s,
            allow=allowed_hosts(context.settings.webhook_allow_hosts),
        )
        delivered = 200 <= status < 300
        # An allowed internal host's answers are not shown to the caller (a probe).
        status_code = status if delivered or not internal else None
        if not delivered:
            logger.info("webhook of job %s to %s: HTTP %s", job_id, url, status)
    except DestinationRefused as exc:
        logger.warning("webhook of job %s refused: %s", job_id, exc)
        final = True
    except Exception as exc:
        logger.info("webhook of job %s to %s failed: %s: %s", job_id, url, type(exc).__name__, exc)
    with transaction(context.sessions) as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(
                webhook_attempts=Job.webhook_attempts + 1,
                webhook_last_status_code=status_code,
                webhook_last_error=None if delivered else DELIVERY_FAILED,
                webhook_status="delivered" if delivered else ("failed" if final else "pending"),
                webhook_delivered_at=utcnow() if delivered else None,
            )
        )
    if not delivered and not final:
        raise DeliveryFailed(DELIVERY_FAILED)
    return delivered
