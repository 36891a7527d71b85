"""Render the docs' tables of measured figures from the raw files under docs/results.

A rendered table sits between two markers, the first naming its renderer and raw files:

    <!-- docs-tables: NAME; raw: docs/results/a.json, docs/results/b/ -->
    | ... the table ... |

    Raw: `docs/results/a.json` (commit 1234567, clean tree) ...
    <!-- /docs-tables -->

`python scripts/docs_tables.py` (`make docs-tables`) rewrites everything between the markers,
the opening marker too, in every Markdown file it scans; `--check` renders them all and exits
1 naming every block whose committed text differs (a swapped column, a stale figure, a raw
file gone). The closing line under each table names the raw files with their provenance, and
says when a result was made from a dirty tree. Derived numbers (ratios, intervals, ranges)
are computed here; the raw files stay as they were recorded.

A new table: a function returning the table's lines in one of the area modules that
scripts/docs_table_renderers.py lists, registered with `@TABLES.table(NAME, RAW...)` (RAW:
files or folders relative to the repository), and the two markers where it goes
(`<!-- docs-tables: NAME -->`, then `<!-- /docs-tables -->`); `make docs-tables` fills the
block in. Every table of docs/benchmarks.md is rendered (a test holds that).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ministream.atomic_file import write_atomic

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent
# The Markdown files scanned for markers, relative to the repository.
DOC_GLOBS = ("README.md", "docs/*.md", "charts/*/README.md")
OPEN = re.compile(r"^<!-- docs-tables: (?P<name>[\w.-]+)(?:; raw: (?P<raw>[^>]*))? -->$")
CLOSE = "<!-- /docs-tables -->"

Lines = list[str]


@dataclass(frozen=True)
class Table:
    name: str
    raw: tuple[str, ...]
    render: Callable[[Path], Lines]


class Registry(dict[str, Table]):
    """Table renderers by name (`docs_table_renderers.TABLES` holds the docs' own)."""

    def table(
        self, name: str, *raw: str
    ) -> Callable[[Callable[[Path], Lines]], Callable[[Path], Lines]]:
        """Register a renderer: `fn(root) -> the table's lines`, reading only `raw` under root."""
        if not raw:
            raise ValueError(f"{name}: a rendered table needs at least one raw file")

        def register(fn: Callable[[Path], Lines]) -> Callable[[Path], Lines]:
            if name in self:
                raise ValueError(f"table {name!r} registered twice")
            self[name] = Table(name, raw, fn)
            return fn

        return register


class RenderError(Exception):
    """A marker that names no renderer, a block without its end, a raw file missing."""


# ---------------------------------------------------------------- reading raw files


def load(root: Path, rel: str) -> Any:
    path = root / rel
    if not path.is_file():
        raise RenderError(f"raw file missing: {rel}")
    return json.loads(path.read_text())


def _json_files(root: Path, rel: str) -> list[Path]:
    path = root / rel
    if path.is_file():
        return [path] if path.suffix == ".json" else []
    if not path.is_dir():
        raise RenderError(f"raw file missing: {rel}")
    return sorted(path.rglob("*.json"))


def provenance_note(root: Path, raw: Sequence[str]) -> str:
    """`Raw: `a.json`, `b/` (commit 1234567, clean tree).`: each raw file's (or folder's)
    commits and whether any of its results came from a dirty tree; files that share both are
    named together."""
    groups: dict[str, list[str]] = {}
    for rel in raw:
        commits: list[str] = []
        dirty = set()
        files = _json_files(root, rel)
        for path in files:
            data = json.loads(path.read_text())
            prov = data.get("provenance") if isinstance(data, dict) else None
            if not isinstance(prov, dict):
                continue
            commit = str(prov.get("commit") or "")[:7]
            if commit and commit not in commits:
                commits.append(commit)
            if "dirty" in prov:
                dirty.add(bool(prov["dirty"]))
        what = [f"commit {', '.join(commits)}"] if commits else []
        if True in dirty:
            what.append("**made from a dirty tree**" if dirty == {True} else "**partly dirty**")
        elif dirty == {False}:
            what.append("clean tree")
        if not what:
            what.append(
                "no provenance block: `docs/results/provenance-notes.json`"
                if files
                else "text, no provenance block"
            )
        groups.setdefault(", ".join(what), []).append(f"`{rel}`")
    parts = [", ".join(files) + (f" ({what})" if what else "") for what, files in groups.items()]
    return "Raw: " + "; ".join(parts) + ". Rendered by `make docs-tables`."


# ---------------------------------------------------------------- formatting


def num(x: float, digits: int = 1) -> str:
    """A figure with `digits` decimals, thousands separated by a space (`31 815`)."""
    text = f"{x:,.{digits}f}"
    return text.replace(",", " ")


def fig(x: float) -> str:
    """One decimal under 100, whole numbers above (`90.8`, `7 737`)."""
    return num(x, 1) if abs(x) < 100 else num(x, 0)


def interval(ratio: float, lo: float, hi: float, digits: int = 2) -> str:
    return f"{ratio:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def row(*cells: object) -> str:
    """`| a | b |`; an empty cell is `| |`."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def header(*cells: str, align: str = "") -> Lines:
    """A header and its rule; `align` holds one letter per column, `r` for right-aligned."""
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(cells), "l"))
    return [row(*cells), rule]


@cache
def gpu_script(name: str) -> Any:
    """A module of scripts/gpu (they import their siblings by bare name)."""
    gpu = str(SCRIPTS / "gpu")
    if gpu not in sys.path:
        sys.path.insert(0, gpu)
    return importlib.import_module(name)


def script(name: str) -> Any:
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(name)


# ---------------------------------------------------------------- the documents


@dataclass
class Block:
    path: Path
    start: int  # index of the opening marker
    end: int  # index of the closing marker
    name: str


def blocks(path: Path, lines: Sequence[str]) -> Iterator[Block]:
    i = 0
    while i < len(lines):
        m = OPEN.match(lines[i].rstrip())
        if m:
            try:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() == CLOSE)
            except StopIteration:
                raise RenderError(f"{path}:{i + 1}: {m['name']}: no {CLOSE} after it") from None
            nested = [j for j in range(i + 1, end) if OPEN.match(lines[j].rstrip())]
            if nested:
                raise RenderError(f"{path}:{nested[0] + 1}: a marker inside {m['name']}'s block")
            yield Block(path, i, end, m["name"])
            i = end
        i += 1


def render_block(tables: Registry, name: str, root: Path) -> Lines:
    """The marker and everything up to (not including) the closing marker."""
    spec = tables.get(name)
    if spec is None:
        raise RenderError(f"no renderer named {name!r} (known: {', '.join(sorted(tables))})")
    return [
        f"<!-- docs-tables: {name}; raw: {', '.join(spec.raw)} -->",
        *spec.render(root),
        "",
        provenance_note(root, spec.raw),
    ]


def render_text(tables: Registry, path: Path, text: str, root: Path) -> str:
    lines = text.split("\n")
    out: list[str] = []
    last = 0
    for block in blocks(path, lines):
        out += lines[last : block.start]
        out += render_block(tables, block.name, root)
        last = block.end
    out += lines[last:]
    return "\n".join(out)


def documents(root: Path) -> list[Path]:
    return sorted({p for pattern in DOC_GLOBS for p in root.glob(pattern)})


def stale(tables: Registry, root: Path) -> list[str]:
    """Every block whose committed text differs from what its renderer makes now."""
    found = []
    for path in documents(root):
        text = path.read_text()
        lines = text.split("\n")
        for block in blocks(path, lines):
            want = render_block(tables, block.name, root)
            if lines[block.start : block.end] != want:
                found.append(f"{path.relative_to(root)}:{block.start + 1}: {block.name}")
    return found


def rewrite(tables: Registry, root: Path) -> list[Path]:
    changed = []
    for path in documents(root):
        text = path.read_text()
        new = render_text(tables, path, text, root)
        if new != text:
            write_atomic(path, new)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if any table is stale")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    tables = script("docs_table_renderers").TABLES
    try:
        if args.check:
            bad = stale(tables, args.root)
            for where in bad:
                print(f"stale: {where} (run `make docs-tables`)")
            return 1 if bad else 0
        for path in rewrite(tables, args.root):
            print(f"rewrote {path.relative_to(args.root)}")
    except RenderError as e:
        print(f"docs-tables: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
