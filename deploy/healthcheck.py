"""Container health checks, one file for both roles of the image (exit 0 healthy, 1 not).

    torchport-healthcheck            # API: `GET /healthz` answers 200
    torchport-healthcheck worker     # worker: a Celery worker on this host answers a ping

The API check uses the standard library only (~30 ms, imports nothing of the service);
its URL is `TORCHPORT_HEALTHCHECK_URL` (default `http://127.0.0.1:8000/healthz`). The worker
check broadcasts a ping through the broker with the torch-free sender app
(`persistence.queue.make_celery`) and looks for a reply from a node named `…@<this hostname>`
(`torchport worker` names its processes `torchport-<pid>@<hostname>`).
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8000/healthz"


def check_api(url: str, timeout_s: float = 4.0) -> bool:
    """Whether `url` answers 200 within `timeout_s`."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def local_nodes(replies: list[dict[str, object]], hostname: str) -> list[str]:
    """Names of the replying Celery nodes that run on `hostname`."""
    return [name for reply in replies for name in reply if name.endswith("@" + hostname)]


def check_worker(timeout_s: float = 10.0) -> bool:
    """Whether at least one Celery worker process of this host answers a ping."""
    from persistence.queue import make_celery
    from service.settings import CommonSettings

    app = make_celery(CommonSettings())
    try:
        replies = app.control.ping(timeout=timeout_s) or []
    except Exception:  # any broker failure means "not healthy", never a crash
        return False
    return bool(local_nodes(replies, socket.gethostname()))


def main(argv: list[str]) -> int:
    """Run the check named by `argv[1]` (`api` by default)."""
    role = argv[1] if len(argv) > 1 else "api"
    if role == "worker":
        return 0 if check_worker() else 1
    return 0 if check_api(os.environ.get("TORCHPORT_HEALTHCHECK_URL", DEFAULT_URL)) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
