"""Where a vLLM server's import time goes (imports are most of a warm start).

Imports the modules each of the server's two processes needs, group by group, in a fresh
interpreter under `python -X importtime`, and reports each group's wall time and the
top-level packages with the most self time (summed over their modules):

    python scripts/gpu/import_profile.py --out OUT/import-profile.json
    python scripts/gpu/import_profile.py --summarise RAW.txt   # an importtime log made elsewhere

Groups, each on top of the ones before: torch alone (what a faster torch import could give
back), then the rest of the API server's entry module (what `vllm serve` imports before it
parses its arguments), then what the engine core and its GPU worker import on top (the engine
core is forked from the API server, so it only pays for modules the API server did not load).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("api_server", ("vllm.entrypoints.openai.api_server",)),
    (
        "engine_core",
        ("vllm.v1.engine.core", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner"),
    ),
    ("plugin", ("ministream",)),
)
_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")
_CHILD = """
import importlib, json, sys, time
out = {}
for name, modules in json.loads(sys.argv[1]):
    t = time.perf_counter()
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # a group that cannot import is reported, not fatal
            out.setdefault("errors", {})[m] = repr(e)
    out[name] = round(time.perf_counter() - t, 3)
print(json.dumps(out))
"""


def summarise(raw: str, top: int = 25) -> dict[str, Any]:
    """Self time (s) per top-level package, largest first, from `-X importtime` output."""
    self_us: Counter[str] = Counter()
    for line in raw.splitlines():
        m = _LINE.match(line)
        if m:
            self_us[m.group(4).split(".")[0]] += int(m.group(1))
    return {
        "total_self_s": round(sum(self_us.values()) / 1e6, 3),
        "by_package_s": {k: round(v / 1e6, 3) for k, v in self_us.most_common(top)},
    }


def profile() -> dict[str, Any]:
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", _CHILD, json.dumps(GROUPS)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            check=False,
        )
        err.seek(0)
        raw = err.read()
    walls = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    return {
        "python": sys.version.split()[0],
        "dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
        "group_wall_s": walls,
        "returncode": proc.returncode,
        **summarise(raw),
        "raw_tail": raw[-2000:] if proc.returncode else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--summarise", type=Path, help="summarise an existing importtime log")
    args = parser.parse_args(argv)
    report = summarise(args.summarise.read_text()) if args.summarise else profile()
    print(json.dumps(report, indent=2))
    if args.out:
        from ministream_testkit.results import write_json

        write_json(args.out, report)
    return 0 if report.get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
