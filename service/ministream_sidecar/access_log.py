"""Which requests the sidecar's access log leaves out: probes and scrapes that went well.

The kubelet asks `/readyz` and `/livez` every few seconds and Prometheus scrapes `/metrics`:
logged one line each, they bury everything else (tens of thousands of lines a day that say
nothing). Unless `access_log_probes` is set, a GET of one of those paths is left out of the
access log when it succeeded (status below 400) and answered within `slow_probe_seconds`; a
failed one keeps its access line, and a slow one is logged as a warning with its duration.
"""

from __future__ import annotations

import logging
import time
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The paths the kubelet's probes and Prometheus's scrapes ask for.
PROBE_PATHS = frozenset({"/livez", "/readyz", "/metrics"})

log = logging.getLogger(__name__)


def _access_fields(record: logging.LogRecord) -> tuple[str, int] | None:
    """(path, status) of a uvicorn access record: args (client, method, path, version, status)."""
    args = record.args
    if record.name != "uvicorn.access" or not isinstance(args, tuple) or len(args) != 5:
        return None
    path, status = args[2], args[4]
    if not isinstance(path, str) or not isinstance(status, int):
        return None
    return urlsplit(path).path, status


class QuietProbes(logging.Filter):
    """Drops the access line of a probe or scrape that succeeded."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = _access_fields(record)
        return fields is None or not (fields[0] in PROBE_PATHS and fields[1] < 400)


class SlowProbeLog:
    """ASGI middleware: a warning for a probe or scrape whose answer started later than
    `slow_seconds` after the request (its access line is left out when it succeeded)."""

    def __init__(self, app: ASGIApp, slow_seconds: float) -> None:
        self.app = app
        self.slow_seconds = slow_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.monotonic()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                seconds = time.monotonic() - started
                if seconds >= self.slow_seconds:
                    log.warning(
                        "slow probe",
                        extra={
                            "method": scope["method"],
                            "path": scope["path"],
                            "status": message["status"],
                            "seconds": round(seconds, 3),
                        },
                    )
            await send(message)

        await self.app(scope, receive, timed_send)
