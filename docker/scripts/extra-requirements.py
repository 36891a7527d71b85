#!/usr/bin/env python3
"""Print the requirements of one extra of pyproject.toml, one a line (`pip install -r -`).

    extra-requirements.py EXTRA [PYPROJECT]

The router image installs the `router` extra's pin alone, not the project: this keeps the
version in pyproject.toml, its one place. Standard library only (tomllib, Python >= 3.11).
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    extra, path = argv[0], Path(argv[1] if len(argv) == 2 else "pyproject.toml")
    extras = tomllib.loads(path.read_text())["project"]["optional-dependencies"]
    if extra not in extras:
        print(f"{path}: no extra {extra!r} (extras: {', '.join(sorted(extras))})", file=sys.stderr)
        return 1
    print("\n".join(extras[extra]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
