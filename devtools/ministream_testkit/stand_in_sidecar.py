"""A stand-in for the MiniStream sidecar's HTTP endpoints (a stdlib HTTP server on loopback),
for tests of the clients that talk to it: it records what it was sent and answers /drain
and /readyz with a fixed status. The real sidecar stands behind the launcher and rollout
tests; this one lets a test see the exact request (path, bearer token) a client sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StandInSidecar:
    port: int = 0
    status: int = 200  # what /drain and /readyz answer
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, auth

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(sidecar: StandInSidecar) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(sidecar.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            sidecar.seen.append(("POST", self.path, self.headers.get("Authorization")))
            ok = sidecar.status == 200
            self._answer({"outcome": "idle"} if ok else {"error": "unauthorized"})

        def do_GET(self) -> None:
            sidecar.seen.append(("GET", self.path, None))
            self._answer({"ready": sidecar.status == 200})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def stand_in_sidecar() -> Iterator[StandInSidecar]:
    sidecar = StandInSidecar()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(sidecar))
    sidecar.port = int(server.server_address[1])
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield sidecar
    finally:
        server.shutdown()
        server.server_close()
