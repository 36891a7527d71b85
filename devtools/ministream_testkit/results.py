"""Writing a result: JSON with its provenance block, written whole or not at all
(ministream.atomic_file), so that an interrupted run never leaves a half-written result where
a reader expects a whole one.

Every report and every raw engine result is a result someone may copy into docs/results/,
so each carries the provenance block (commit, command, machine, versions:
ministream_testkit.provenance; docs/benchmarks.md, "How results are recorded"), added here
once for all of them. A result that is a JSON list has no place for the block: its writer
writes the text with ministream.atomic_file and the block beside it
(provenance.write_sidecar)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ministream.atomic_file import write_atomic
from ministream_testkit.provenance import stamp


def write_json(path: Path, data: Mapping[str, Any], *, indent: int | None = 2) -> dict[str, Any]:
    """Write `data` with its provenance block (kept if it has one); what was written."""
    stamped = stamp(data)
    write_atomic(path, json.dumps(stamped, indent=indent) + "\n")
    return stamped


def stamp_file(path: Path) -> dict[str, Any]:
    """Add the provenance block to a JSON object another program wrote (the load engine's
    raw result), keeping its compact form: a raw result holds every request's timings."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object, no place for a provenance block")
    return write_json(path, data, indent=None)
