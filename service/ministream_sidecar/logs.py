"""Structured JSON logs on stderr, one object per line, for the sidecar and uvicorn."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from .access_log import QuietProbes

# Attributes every LogRecord has; anything else was passed through `extra=` and is a field.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "color_message", "taskName"}
)


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON object: time, level, logger, message, extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if (
            record.name == "uvicorn.access"
            and isinstance(record.args, tuple)
            and len(record.args) == 5
        ):
            client, method, path, http_version, status = record.args
            payload.update(
                client=client, method=method, path=path, http_version=http_version, status=status
            )
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key not in payload:
                payload[key] = value
        if record.exc_info:
            payload["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


def configure_logging(level: str, *, access_log_probes: bool = False) -> None:
    """Send the root logger (and uvicorn's, which propagate) to stderr as JSON lines; probes
    and scrapes that went well are left out unless `access_log_probes` (access_log.py)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    if not access_log_probes:
        handler.addFilter(QuietProbes())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    # httpx logs every request at INFO; the health loop would flood the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
