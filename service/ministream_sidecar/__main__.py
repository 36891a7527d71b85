"""`ministream-sidecar` / `python -m ministream_sidecar`: the sidecar under uvicorn."""

from __future__ import annotations

import sys

import uvicorn

from .app import create_app
from .logs import configure_logging
from .settings import SidecarSettings


def main(argv: list[str] | None = None) -> int:
    """Everything is configured through MINISTREAM_SIDECAR_* variables; no arguments."""
    args = sys.argv[1:] if argv is None else argv
    if args:
        print(
            "ministream-sidecar takes no arguments; configure it with MINISTREAM_SIDECAR_* "
            "environment variables (see docs/sidecar.md).",
            file=sys.stderr,
        )
        return 2
    settings = SidecarSettings()
    configure_logging(settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep our JSON handlers
        access_log=True,
        timeout_graceful_shutdown=int(settings.drain_timeout_seconds) + 5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
