"""`ministream-sidecar` / `python -m ministream_sidecar`: the sidecar under uvicorn."""

from __future__ import annotations

import argparse
import sys
import textwrap

from .settings import ENV_PREFIX, SidecarSettings


def _environment_help() -> str:
    """One line per setting, read from SidecarSettings itself so the list cannot drift."""
    lines = []
    for name, field in SidecarSettings.model_fields.items():
        alias = field.validation_alias
        choices = getattr(alias, "choices", None)
        env = str(choices[0]) if choices else f"{ENV_PREFIX}{name.upper()}"
        default = "unset" if field.default is None else repr(field.default)
        about = f": {field.description}" if field.description else ""
        lines.append(
            textwrap.fill(
                f"{env} (default {default}){about}",
                88,
                initial_indent="  ",
                subsequent_indent="      ",
            )
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    about = (
        "Health, readiness, warmup, drain and Prometheus metrics for the vLLM server next to "
        "it. It takes no arguments: every setting comes from the environment "
        f"({ENV_PREFIX}* variables; docs/sidecar.md)."
    )
    return argparse.ArgumentParser(
        prog="ministream-sidecar",
        description=textwrap.fill(about, 88),
        epilog=f"environment:\n{_environment_help()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(sys.argv[1:] if argv is None else argv)  # --help; else exit 2
    # Imported after parsing: `--help` needs neither the app nor uvicorn.
    import uvicorn

    from .app import create_app, server_options
    from .logs import configure_logging

    settings = SidecarSettings()
    configure_logging(settings.log_level, access_log_probes=settings.access_log_probes)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep our JSON handlers
        access_log=True,
        timeout_graceful_shutdown=int(settings.drain_timeout_seconds) + 5,
        **server_options(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
