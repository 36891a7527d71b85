"""Time `.ci/run` on a fresh clone, the way the README's CI figure is measured.

    python3 scripts/ci_timed.py --clone /tmp/ci-clone --out docs/results/ci/ci-DATE.json

Clones this checkout's HEAD into `--clone` (which must not exist yet), runs
`CI=true bash .ci/run` there with no standard input (as CI does) and its output in
`<clone>.log`, and writes a JSON result: the wall time, the exit status, pytest's closing
line (its test count and the suite's own time) and the provenance block (commit, machine,
versions). Exits with `.ci/run`'s status. Standard library only: it runs before any set-up.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "devtools"), str(ROOT / "plugins")]

from ministream_testkit.provenance import stamp  # noqa: E402
from ministream_testkit.results import write_json  # noqa: E402

_PYTEST_SUMMARY = re.compile(r"^=+ (.*\b(passed|failed)\b.* in [0-9.]+s.*) =+$")


def pytest_summary(log: str) -> str | None:
    """pytest's last closing line, e.g. '1158 passed, 12 skipped in 1234.56s (0:20:34)'."""
    found = [m.group(1) for line in log.splitlines() if (m := _PYTEST_SUMMARY.match(line))]
    return found[-1] if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clone", type=Path, required=True, help="where to clone (new)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON result")
    args = parser.parse_args(argv)
    if args.clone.exists():
        parser.error(f"--clone {args.clone} exists: give a new path")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(args.clone)], check=True)
    log_path = args.clone.with_name(args.clone.name + ".log")
    env = {**os.environ, "CI": "true"}
    began = time.monotonic()
    with open(log_path, "wb") as log:
        status = subprocess.run(
            ["bash", ".ci/run"],
            cwd=args.clone,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
        ).returncode
    wall = time.monotonic() - began
    text = log_path.read_text(errors="replace")
    result = stamp(
        {
            "what": "CI=true bash .ci/run on a fresh clone of HEAD",
            "exit_status": status,
            "wall_seconds": round(wall, 1),
            "pytest_summary": pytest_summary(text),
            "log": str(log_path),
        },
        command=[Path(sys.executable).name, *sys.argv],
    )
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "provenance"}, indent=2))
    return status


if __name__ == "__main__":
    sys.exit(main())
