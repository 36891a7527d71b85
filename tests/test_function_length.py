"""No function of the project's own Python is over MAX_LINES lines, but those on LONG, and
LONG only shrinks.

Every git-tracked `.py` file outside tests/ (plugins, service, loadtest, devtools, scripts,
docker) is read with `ast`; a function or method is `end_lineno - lineno + 1` lines long,
decorators left out, a nested function counted on its own too (`outer.inner`). A function over
the limit fails unless LONG names it; a name on LONG fails once it no longer exists or fits
the limit: remove it from the list. A new long function is split into pieces named for their
concerns, never added here.

LONG holds at most MAX_LISTED entries; it only shrinks.
"""

from __future__ import annotations

import ast
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80
MAX_LISTED = 8
# "path::qualname" of the functions over MAX_LINES today: none (15 when this test came in).
LONG: set[str] = set()


def project_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return sorted(p for p in listed.split("\0") if p and not p.startswith("tests/"))


def _functions(node: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualname, lines) of every function under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{child.name}"
            assert child.end_lineno is not None
            yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def function_lengths(files: list[str]) -> dict[str, int]:
    lengths: dict[str, int] = {}
    for path in files:
        tree = ast.parse((ROOT / path).read_text(), path)
        lengths |= {f"{path}::{name}": lines for name, lines in _functions(tree)}
    return lengths


def problems(lengths: dict[str, int], allowed: set[str]) -> list[str]:
    found = [
        f"{key}: {lines} lines (limit {MAX_LINES}): split it, do not add it to LONG"
        for key, lines in sorted(lengths.items())
        if lines > MAX_LINES and key not in allowed
    ]
    for key in sorted(allowed):
        if key not in lengths:
            found.append(f"{key}: no longer exists: remove it from LONG")
        elif lengths[key] <= MAX_LINES:
            found.append(f"{key}: {lengths[key]} lines now: remove it from LONG")
    return found


def test_no_function_is_over_the_limit_but_the_listed_ones() -> None:
    assert problems(function_lengths(project_files()), LONG) == []


def test_the_allow_list_stays_short() -> None:
    assert len(LONG) <= MAX_LISTED, f"{len(LONG)} long functions allowed: split one"


def test_the_check_fails_a_new_long_function_and_a_stale_entry() -> None:
    lengths = {"a.py::long": MAX_LINES + 1, "a.py::C.split": MAX_LINES, "a.py::fine": 3}
    assert problems(lengths, {"a.py::C.split", "a.py::gone"}) == [
        f"a.py::long: {MAX_LINES + 1} lines (limit {MAX_LINES}): split it, do not add it to LONG",
        f"a.py::C.split: {MAX_LINES} lines now: remove it from LONG",
        "a.py::gone: no longer exists: remove it from LONG",
    ]


def test_a_method_and_a_nested_function_are_measured_by_their_qualname() -> None:
    tree = ast.parse("class C:\n    def m(self):\n        def inner():\n            pass\n")
    assert dict(_functions(tree)) == {"C.m": 3, "C.m.inner": 2}
