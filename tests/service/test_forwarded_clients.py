"""Which client address the API believes, and what its failed-authentication limit blocks:
a real uvicorn process started with the flags the Dockerfile, docker-compose.yml and the
Kubernetes manifests use, on PostgreSQL and Redis (one shared count), sent requests with
forged `X-Forwarded-For` headers from several loopback source addresses.

Found by an attack run: the deployments ran uvicorn with `--proxy-headers
--forwarded-allow-ips '*'`, so a guesser sending a fresh `X-Forwarded-For` with each bad key
was never throttled (120/120 answered 401), and 21 bad keys naming a victim's address
locked the victim out; `torchport serve` trusted `X-Forwarded-For` from loopback (uvicorn's
default). And a valid key was refused while its address was throttled for others' bad keys:
a flood of bad keys from 127.0.0.1 made a second tenant's next job fail with 429.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from pydantic import ValidationError

from persistence.database import transaction
from schemas.errors import ErrorBody
from service.app import build_state
from service.auth import create_key
from service.settings import ServiceSettings
from tests.conftest import REDIS_URL
from tests.service.conftest import ROOT, _truncate, make_settings, model_file

BURST = 5
ATTACKER = "127.0.0.1"
PROXY = "127.0.0.2"
VICTIM = "127.0.0.3"
TENANT = "127.0.0.4"


def _deployed_api_command() -> list[str]:
    """The API's command line in docker-compose.yml, which the Dockerfile and the
    Kubernetes API Deployment must repeat exactly."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command: list[str] = compose["services"]["api"]["command"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    cmd = [line for line in dockerfile.splitlines() if line.startswith("CMD ")]
    assert [json.loads(line.removeprefix("CMD ")) for line in cmd] == [command]
    kubernetes = yaml.safe_load_all((ROOT / "deploy/kubernetes/base/api.yaml").read_text())
    deployment = next(doc for doc in kubernetes if doc and doc["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["command"] == command
    return command


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (the route to a documentation
    address: no packet is sent)."""
    with closing(socket.socket(socket.AF_INET, socket.SOCK_DGRAM)) as sock:
        sock.connect(("198.51.100.1", 9))
        address = str(sock.getsockname()[0])
    assert not address.startswith("127."), address
    return address


def _wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@dataclass
class Api:
    """A running API process and a valid key's header (None: the server has no keys)."""

    url: str
    valid: dict[str, str] | None

    def client(self, source: str, connect_to: str = "127.0.0.1") -> httpx.Client:
        """A client whose connections come from the address `source`."""
        url = self.url.replace("127.0.0.1", connect_to)
        return httpx.Client(
            base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=source)
        )


def _guess(forwarded_for: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer tp_{secrets.token_urlsafe(32)}"}
    if forwarded_for is not None:
        headers["X-Forwarded-For"] = forwarded_for
    return headers


def _code(response: httpx.Response) -> str:
    return ErrorBody.model_validate(response.json()).code


@pytest.fixture
def deploy(tmp_path: Path, pg_url: str, redis_prefix: str) -> Iterator[Callable[..., Api]]:
    """Start the API as the deployment files start it (listening on all addresses, a free
    port), with `TORCHPORT_*` settings added; each with rate-limit counts of its own."""
    procs: list[subprocess.Popen[bytes]] = []
    settings = make_settings(tmp_path, pg_url, redis_prefix)
    state = build_state(settings)
    _truncate(state)

    def start(*, keys: bool = True, **extra: str) -> Api:
        valid = None
        if keys:
            with transaction(state.sessions) as session:
                valid = {"Authorization": f"Bearer {create_key(session, 'tenant').secret}"}
        command = _deployed_api_command()
        port = _free_port()
        command[command.index("--port") + 1] = str(port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
        env.update(
            TORCHPORT_DATA_DIR=str(tmp_path / "data"),
            TORCHPORT_DATABASE_URL=pg_url,
            TORCHPORT_BROKER_URL=REDIS_URL,
            TORCHPORT_BROKER_KEY_PREFIX=f"{redis_prefix}{uuid.uuid4().hex[:8]}:",
            TORCHPORT_AUTO_MIGRATE="false",
            TORCHPORT_REAPER_INTERVAL_S="3600",
            TORCHPORT_GC_INTERVAL_S="3600",
            TORCHPORT_AUTH_FAILURES_BURST=str(BURST),
            TORCHPORT_AUTH_FAILURES_PER_MINUTE="1",
            **{f"TORCHPORT_{name.upper()}": value for name, value in extra.items()},
        )
        log = (tmp_path / f"api-{port}.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", *command],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        _wait_until(lambda: proc.poll() is None and _answers(url), 30)
        return Api(url, valid)

    yield start
    for proc in procs:
        _stop(proc)
    _truncate(state)
    state.engine.dispose()


def test_a_fresh_forged_forwarded_for_per_guess_is_still_throttled(
    deploy: Callable[..., Api],
) -> None:
    api = deploy()
    with api.client(ATTACKER) as attacker:
        codes = [
            attacker.get("/v1/exports", headers=_guess(f"198.51.100.{i}")).status_code
            for i in range(BURST + 7)
        ]
        assert codes == [401] * BURST + [429] * 7  # was 401 every time
        limited = attacker.get(
            "/v1/exports", headers={**_guess("203.0.113.99"), "X-Real-IP": "203.0.113.98"}
        )
        assert limited.status_code == 429
        body = ErrorBody.model_validate(limited.json())
        assert (body.code, body.details["reason"]) == ("rate_limited", "auth_failures")


def test_bad_keys_naming_a_victims_address_do_not_lock_the_victim_out(
    deploy: Callable[..., Api],
) -> None:
    api = deploy()
    assert api.valid is not None
    with api.client(ATTACKER) as attacker, api.client(VICTIM) as victim:
        for _ in range(BURST + 3):
            attacker.get("/v1/exports", headers=_guess(VICTIM))
        # The victim's own failures still have their whole burst (were 429 at once).
        codes = [victim.get("/v1/exports", headers=_guess()).status_code for _ in range(BURST)]
        assert codes == [401] * BURST
        assert victim.get("/v1/exports", headers=_guess()).status_code == 429
        # ... and the attacker's count is its own.
        assert attacker.get("/v1/exports", headers=_guess()).status_code == 429


def test_a_valid_key_is_answered_from_an_address_flooded_with_bad_keys(
    deploy: Callable[..., Api],
) -> None:
    api = deploy()
    assert api.valid is not None
    with api.client(ATTACKER) as attacker, api.client(ATTACKER) as tenant:
        flood = [attacker.get("/v1/exports", headers=_guess()).status_code for _ in range(30)]
        assert flood == [401] * BURST + [429] * (30 - BURST)
        # Another tenant at the same address (a shared NAT, the same CI runner): its key
        # works, over and over (was 429).
        for _ in range(BURST + 2):
            assert tenant.get("/v1/exports", headers=api.valid).status_code == 200
        name, data = model_file()
        submitted = tenant.post("/v1/exports", headers=api.valid, files={"model": (name, data)})
        assert submitted.status_code == 202, submitted.text
        # Only failures are blocked, and valid calls did not reset the count.
        limited = attacker.get("/v1/exports", headers=_guess())
        assert limited.status_code == 429
        assert ErrorBody.model_validate(limited.json()).details["reason"] == "auth_failures"


def test_behind_trusted_proxies_the_limit_counts_the_first_untrusted_hop(
    deploy: Callable[..., Api],
) -> None:
    api = deploy(trusted_proxies=f"{PROXY}, 10.0.0.0/8")
    with api.client(PROXY) as proxy, api.client(ATTACKER) as direct:
        # The client forges hops on the left; the proxy appends the address it saw.
        codes = [
            proxy.get("/v1/exports", headers=_guess(f"198.51.100.{i}, 203.0.113.5")).status_code
            for i in range(BURST + 3)
        ]
        assert codes == [401] * BURST + [429] * 3
        # Through two trusted proxies, another client has a count of its own ...
        for i in range(BURST - 1):
            hops = f"198.51.100.{i}, 203.0.113.6, 10.1.2.3"
            assert proxy.get("/v1/exports", headers=_guess(hops)).status_code == 401
        # ... the same one whichever way it came.
        assert proxy.get("/v1/exports", headers=_guess("203.0.113.6")).status_code == 401
        assert proxy.get("/v1/exports", headers=_guess("203.0.113.6")).status_code == 429
        # A client that is not a trusted proxy names no one but itself.
        for _ in range(BURST):
            assert direct.get("/v1/exports", headers=_guess("203.0.113.7")).status_code == 401
        assert direct.get("/v1/exports", headers=_guess("203.0.113.8")).status_code == 429
        assert proxy.get("/v1/exports", headers=_guess("203.0.113.7")).status_code == 401


def test_a_forged_forwarded_for_never_makes_a_remote_client_loopback(
    deploy: Callable[..., Api],
) -> None:
    """Without keys the API answers loopback clients only; a forwarded header, trusted or
    not, never makes a client look local."""
    remote_address = _non_loopback_address()
    api = deploy(keys=False, trusted_proxies=PROXY)
    with (
        api.client(ATTACKER) as local,
        api.client(remote_address, connect_to=remote_address) as remote,
        api.client(PROXY) as proxy,
    ):
        assert local.get("/v1/exports").status_code == 200
        for client, forwarded_for in [
            (local, "127.0.0.1"),
            (remote, "127.0.0.1"),
            (remote, None),
            (proxy, "127.0.0.1"),
            (proxy, "127.0.0.1, 203.0.113.9"),
        ]:
            headers = {} if forwarded_for is None else {"X-Forwarded-For": forwarded_for}
            answer = client.get("/v1/exports", headers=headers)
            assert answer.status_code == 403, (client, forwarded_for)
            assert _code(answer) == "forbidden"
            assert ErrorBody.model_validate(answer.json()).details["reason"] == "no_api_keys"


@pytest.mark.parametrize("value", ["*", "0.0.0.0/0", "::/0", "proxy.internal", "10.0.0.0/33"])
def test_trusted_proxies_that_are_not_narrow_addresses_stop_the_start(value: str) -> None:
    with pytest.raises(ValidationError):
        ServiceSettings(trusted_proxies=value)  # type: ignore[arg-type]


def test_torchport_serve_trusts_no_forwarded_header(tmp_path: Path) -> None:
    """`torchport serve` (uvicorn's own default trusts `X-Forwarded-For` from loopback)."""
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    env.update(
        TORCHPORT_DATA_DIR=str(data),
        TORCHPORT_AUTH_FAILURES_BURST=str(BURST),
        TORCHPORT_AUTH_FAILURES_PER_MINUTE="1",
    )
    created = subprocess.run(
        [sys.executable, "-m", "torchport.cli", "keys", "create", "tenant"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stderr
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchport.cli", "serve", "--port", str(port), "--workers", "1"],
        env=env,
        cwd=ROOT,
        stdout=(tmp_path / "serve.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_until(lambda: proc.poll() is None and _answers(url), 60)
        with httpx.Client(base_url=url, timeout=30) as attacker:
            codes = [
                attacker.get("/v1/exports", headers=_guess(f"198.51.100.{i}")).status_code
                for i in range(BURST + 3)
            ]
        assert codes == [401] * BURST + [429] * 3  # was 401 every time
    finally:
        _stop(proc)
