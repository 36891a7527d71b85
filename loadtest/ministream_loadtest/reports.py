"""Writing a report: JSON to a temporary name beside it, then renamed into place, so that an
interrupted run never leaves a half-written report where a reader expects a whole one.

Every report and every raw engine result is a result someone may copy into docs/results/,
so each carries the provenance block (commit, command, machine, versions:
ministream_testkit.provenance; docs/benchmarks.md, "How results are recorded"), added here
once for all of them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ministream_testkit.provenance import stamp


def write_json(path: Path, data: Mapping[str, Any], *, indent: int | None = 2) -> dict[str, Any]:
    """Write `data` with its provenance block (kept if it has one); what was written."""
    stamped = stamp(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(stamped, indent=indent) + "\n")
    os.replace(tmp, path)
    return stamped


def stamp_file(path: Path) -> dict[str, Any]:
    """Add the provenance block to a JSON object another program wrote (the load engine's
    raw result), keeping its compact form: a raw result holds every request's timings."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object, no place for a provenance block")
    return write_json(path, data, indent=None)
