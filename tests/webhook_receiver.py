"""An HTTP receiver of completion callbacks on 127.0.0.1, for the tests that deliver them.

Given the webhook secret, it verifies each delivery as a receiver would, with the
`standardwebhooks` package (Standard Webhooks headers), and answers 401 to one that does
not verify.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError


class Receiver:
    """Answers every POST with `status` and keeps its headers and body, in order; with a
    `secret` (a `whsec_` secret, or the raw key bytes of one made before the spec), also
    whether each verified."""

    def __init__(self, status: int, secret: str | bytes | None = None) -> None:
        self.status = status
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.verified: list[bool] = []
        webhook = Webhook(secret) if secret is not None else None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = dict(self.headers)
                receiver.requests.append((headers, body))
                status = receiver.status
                if webhook is not None:
                    try:
                        webhook.verify(body, headers)
                        receiver.verified.append(True)
                    except WebhookVerificationError:
                        receiver.verified.append(False)
                        status = 401
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
