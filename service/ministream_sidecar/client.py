"""Client of the sidecar's endpoints, standard library only: the one implementation that the
chart's preStop hook, `ministream up` and the rolling-restart experiment all run.

    python3 -m ministream_sidecar.client drain --timeout SECONDS   # the chart's preStop hook
    python3 -m ministream_sidecar.client ready                     # exit 0 iff /readyz is 200

The sidecar is found at http://127.0.0.1:$MINISTREAM_SIDECAR_PORT (8081 when unset, the
chart's port) unless `--url` says otherwise; `MINISTREAM_SIDECAR_TOKEN`, when set, is sent
as the bearer token that guards POST /drain. `drain` prints one JSON line (HTTP status,
the sidecar's answer or the error, seconds taken) and exits 1 when the drain did not answer
200, so that a failed hook shows up as a FailedPreStopHook event.

It imports nothing outside the standard library and this file: the serving images run it
with their own python3, which has neither the sidecar's dependencies nor a need for them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

ENV_PREFIX = "MINISTREAM_SIDECAR_"
DEFAULT_PORT = 8081
# The HTTP wait of a drain outlasts the sidecar's own drain timeout by this much, so that the
# sidecar's answer (idle or timed out) arrives before the client gives up on it.
DRAIN_HTTP_SLACK_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 3.0


def sidecar_url(env: Mapping[str, str] = os.environ) -> str:
    """Where the sidecar of this pod listens, seen from inside the pod."""
    return f"http://127.0.0.1:{env.get(ENV_PREFIX + 'PORT') or DEFAULT_PORT}"


@dataclass(frozen=True)
class DrainAnswer:
    """What POST /drain answered (the sidecar's own outcome is drain.DrainResult)."""

    status: int | None  # HTTP status; None when no answer came
    body: dict[str, Any] | None  # the sidecar's DrainBody
    error: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == 200

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def drain(url: str, *, timeout: float, token: str | None = None) -> DrainAnswer:
    """POST {url}/drain and wait for the answer: the sidecar turns unready at once, then
    answers when vLLM is idle or after its own drain timeout (`timeout`, seconds)."""
    request = urllib.request.Request(f"{url.rstrip('/')}/drain", data=b"", method="POST")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    began = time.monotonic()
    status: int | None = None
    body: dict[str, Any] | None = None
    error: str | None = None
    try:
        with urllib.request.urlopen(request, timeout=timeout + DRAIN_HTTP_SLACK_SECONDS) as resp:
            status, body = resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        status, error = exc.code, exc.read(512).decode(errors="replace")
    except (OSError, ValueError) as exc:  # refused, timed out, or not JSON
        error = f"{type(exc).__name__}: {exc}"
    return DrainAnswer(status, body, error, round(time.monotonic() - began, 3))


def ready(url: str, timeout: float = READY_TIMEOUT_SECONDS) -> bool:
    """True when GET {url}/readyz answers 200."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/readyz", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m ministream_sidecar.client",
        description="Ask this pod's MiniStream sidecar to drain, or whether it is ready.",
    )
    parser.add_argument("--url", help="sidecar base URL (default: from MINISTREAM_SIDECAR_PORT)")
    sub = parser.add_subparsers(dest="command", required=True)
    drain_cmd = sub.add_parser("drain", help="POST /drain and wait for it (preStop hook)")
    drain_cmd.add_argument(
        "--timeout",
        type=float,
        required=True,
        help="the sidecar's drain timeout in seconds; the client waits "
        f"{DRAIN_HTTP_SLACK_SECONDS:g} s longer for its answer",
    )
    sub.add_parser("ready", help="exit 0 when GET /readyz is 200, else 1")
    args = parser.parse_args(argv)
    url = args.url or sidecar_url(env)
    if args.command == "ready":
        return 0 if ready(url) else 1
    result = drain(url, timeout=args.timeout, token=env.get(ENV_PREFIX + "TOKEN") or None)
    print(json.dumps({"drain": result.as_dict()}), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
