"""scripts/docs_tables.py: the docs' measured tables are what their raw files say.

The first test renders every marked table again from docs/results and fails on any committed
text that differs; the others prove that check fails for what it is there to catch (a swapped
column, an altered figure, a raw file gone, a marker without a renderer) and that a result
made from a dirty tree says so under its table.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.scripts import SCRIPTS, ScriptImporter

ROOT = SCRIPTS.parent
BENCHMARKS = "docs/benchmarks.md"


@pytest.fixture
def dt(import_script: ScriptImporter) -> ModuleType:
    return import_script("docs_tables")


@pytest.fixture
def tables(import_script: ScriptImporter) -> object:
    return import_script("docs_table_renderers").TABLES


def _copy_docs(tmp_path: Path) -> Path:
    """A tree with the repository's Markdown files copied (to be edited) and its raw results
    linked (read only)."""
    for pattern in ("README.md", "docs/*.md", "charts/*/README.md"):
        for src in ROOT.glob(pattern):
            dst = tmp_path / src.relative_to(ROOT)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    (tmp_path / "docs" / "results").symlink_to(ROOT / "docs" / "results")
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path}"
    path.write_text(text.replace(old, new))


def test_committed_tables_match_their_raw_files(dt: ModuleType, tables: object) -> None:
    assert dt.stale(tables, ROOT) == [], "run `make docs-tables` and commit the result"


def test_every_renderer_has_exactly_one_table_in_the_docs(dt: ModuleType, tables: dict) -> None:
    used: list[str] = []
    for path in dt.documents(ROOT):
        lines = path.read_text().split("\n")
        used += [b.name for b in dt.blocks(path, lines)]
    assert sorted(used) == sorted(tables), "a renderer without its table, or a table twice"


def test_no_table_of_the_benchmarks_page_is_typed_by_hand(dt: ModuleType) -> None:
    """Every table of docs/benchmarks.md is measured figures, so every one is rendered."""
    path = ROOT / BENCHMARKS
    lines = path.read_text().split("\n")
    rendered = {i for b in dt.blocks(path, lines) for i in range(b.start, b.end)}
    by_hand = [
        f"{BENCHMARKS}:{i + 1}: {line[:60]}"
        for i, line in enumerate(lines)
        if line.startswith("|") and not lines[i - 1].startswith("|") and i not in rendered
    ]
    assert by_hand == [], "a table typed by hand: give it a renderer (scripts/docs_tables.py)"


def test_a_swapped_column_fails_the_check(dt: ModuleType, tables: object, tmp_path: Path) -> None:
    root = _copy_docs(tmp_path)
    lines = (root / BENCHMARKS).read_text().split("\n")
    i = next(n for n, line in enumerate(lines) if line.startswith("| decode 1 | 1.377 / 1.378"))
    cells = lines[i].split(" | ")
    cells[1], cells[2] = cells[2], cells[1]  # plugin and Llama A, as the old table had them
    lines[i] = " | ".join(cells)
    (root / BENCHMARKS).write_text("\n".join(lines))
    stale = dt.stale(tables, root)
    assert len(stale) == 1 and "h200-run17-parity" in stale[0]
    assert dt.main(["--check", "--root", str(root)]) == 1


def test_an_altered_figure_fails_and_a_rewrite_restores_it(
    dt: ModuleType, tables: object, tmp_path: Path
) -> None:
    root = _copy_docs(tmp_path)
    _edit(root / BENCHMARKS, "**21.4 [19.9–22.4]**", "**20.4 [19.9–22.4]**")
    assert [s.split(": ")[-1] for s in dt.stale(tables, root)] == ["h200-run17-cold-start"]
    assert dt.main(["--root", str(root)]) == 0
    assert dt.stale(tables, root) == []
    assert (root / BENCHMARKS).read_text() == (ROOT / BENCHMARKS).read_text()


def _toy(dt: ModuleType, tmp_path: Path, dirty: bool) -> tuple[object, Path]:
    registry = dt.Registry()

    @registry.table("toy", "docs/results/toy.json")
    def toy(root: Path) -> list[str]:
        data = dt.load(root, "docs/results/toy.json")
        return [*dt.header("figure", align="r"), dt.row(dt.fig(data["value"]))]

    (tmp_path / "docs" / "results").mkdir(parents=True)
    raw = {"provenance": {"commit": "abcdef0123", "dirty": dirty}, "value": 1234.5}
    (tmp_path / "docs" / "results" / "toy.json").write_text(json.dumps(raw))
    doc = tmp_path / "docs" / "toy.md"
    doc.write_text("Intro.\n\n<!-- docs-tables: toy -->\n<!-- /docs-tables -->\n\nAfter.\n")
    return registry, doc


def test_a_rendered_block_names_its_raw_file_and_a_dirty_tree(
    dt: ModuleType, tmp_path: Path
) -> None:
    registry, doc = _toy(dt, tmp_path, dirty=True)
    assert dt.rewrite(registry, tmp_path) == [doc]
    assert doc.read_text() == (
        "Intro.\n\n<!-- docs-tables: toy; raw: docs/results/toy.json -->\n"
        "| figure |\n|---:|\n| 1 234 |\n\n"
        "Raw: `docs/results/toy.json` (commit abcdef0, **made from a dirty tree**). "
        "Rendered by `make docs-tables`.\n<!-- /docs-tables -->\n\nAfter.\n"
    )
    assert dt.rewrite(registry, tmp_path) == []  # a second run changes nothing


def test_a_lost_raw_file_fails(dt: ModuleType, tmp_path: Path) -> None:
    registry, _ = _toy(dt, tmp_path, dirty=False)
    dt.rewrite(registry, tmp_path)
    (tmp_path / "docs" / "results" / "toy.json").unlink()
    with pytest.raises(dt.RenderError, match=re.escape("raw file missing: docs/results/toy.json")):
        dt.stale(registry, tmp_path)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<!-- docs-tables: nosuch -->\n<!-- /docs-tables -->\n", "no renderer named 'nosuch'"),
        ("<!-- docs-tables: toy -->\n| a |\n", re.escape("no <!-- /docs-tables --> after")),
    ],
)
def test_a_broken_marker_fails(dt: ModuleType, tmp_path: Path, text: str, error: str) -> None:
    registry, doc = _toy(dt, tmp_path, dirty=False)
    doc.write_text(text)
    with pytest.raises(dt.RenderError, match=error):
        dt.stale(registry, tmp_path)
