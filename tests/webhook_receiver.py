"""An HTTP receiver of completion callbacks on 127.0.0.1, for the tests that deliver them."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer


class Receiver:
    """Answers every POST with `status` and keeps its headers and body, in order."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
