"""Leave refused LoRA adapters out of vLLM's `--lora-modules`.

The chart lists every configured adapter in `--lora-modules NAME=PATH ...`, each PATH under
the directory the `fetch-adapters` init step fills. That step writes only adapters that
passed verification (a refused one has no PATH; `ministream fetch-adapters` logged why).
vLLM refuses to start when any static adapter fails to load, so one bad adapter would take
the base model and every other adapter down with it: entries whose PATH is missing are
dropped here, and the sidecar reports them as not loaded (docs/sidecar.md, LoRA adapters).
"""

from __future__ import annotations

import json
import os

FLAG = "--lora-modules"


def _path_of(entry: str) -> str:
    if entry.lstrip().startswith("{"):  # vLLM's JSON form: {"name": ..., "path": ...}
        return str(json.loads(entry).get("path", ""))
    return entry.partition("=")[2]


def admitted(argv: list[str]) -> tuple[list[str], list[str]]:
    """`argv` without the `--lora-modules` entries whose path is missing, and those entries."""
    out: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg != FLAG:
            out.append(arg)
            i += 1
            continue
        i += 1
        kept: list[str] = []
        while i < len(argv) and not argv[i].startswith("--"):
            (kept if os.path.isdir(_path_of(argv[i])) else dropped).append(argv[i])
            i += 1
        if kept:  # a bare --lora-modules is an argparse error
            out += [FLAG, *kept]
    return out, dropped
