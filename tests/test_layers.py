"""Layers that point one way (docs/architecture.md, "The parts and which way they depend").

Every import of every module of our packages, at any depth (a function's lazy import
counts), is held against the table of what each package may import. The only runtime
entries into other packages of ours are the `ministream` CLI's two commands that run
them (`ministream up` starts the sidecar's launcher, `ministream reference` the reference
model); nothing vLLM loads imports the sidecar.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "ministream": ROOT / "plugins" / "ministream",
    "ministream_sidecar": ROOT / "service" / "ministream_sidecar",
    "ministream_loadtest": ROOT / "loadtest" / "ministream_loadtest",
    "ministream_reference": ROOT / "devtools" / "ministream_reference",
    "ministream_observability": ROOT / "devtools" / "ministream_observability",
    "ministream_testkit": ROOT / "devtools" / "ministream_testkit",
}
# Which of our packages each package may import (itself always).
MAY_IMPORT: dict[str, set[str]] = {
    "ministream": set(),
    "ministream_sidecar": {"ministream"},
    "ministream_loadtest": {"ministream_sidecar", "ministream_testkit"},
    "ministream_reference": {"ministream", "ministream_testkit"},
    "ministream_observability": set(),
    "ministream_testkit": {"ministream", "ministream_sidecar"},
}
# (module, imported package): the CLI commands that run another part, imported lazily.
EXCEPTIONS = {
    ("ministream.cli", "ministream_sidecar"),
    ("ministream.cli", "ministream_reference"),
}
# What the sidecar may take from the plugin package: torch-free modules only (the sidecar
# image has no torch).
SIDECAR_FROM_PLUGIN = {"ministream", "ministream.startup_log"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules() -> list[tuple[str, str, Path]]:
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((package, ".".join([package, *parts]), path))
    return found


def violations() -> list[str]:
    bad = []
    for package, module, path in _modules():
        for name in _imports(path):
            top = name.split(".")[0]
            if top not in PACKAGES or top == package:
                continue
            if top not in MAY_IMPORT[package] and (module, top) not in EXCEPTIONS:
                bad.append(f"{module} imports {name}")
            if (
                package == "ministream_sidecar"
                and top == "ministream"
                and (name not in SIDECAR_FROM_PLUGIN)
            ):
                bad.append(f"{module} imports {name} (the sidecar has no torch)")
    return bad


def test_every_import_points_the_allowed_way() -> None:
    assert violations() == []


def test_the_check_sees_a_lazy_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "ministream"
    plugin.mkdir()
    (plugin / "model.py").write_text("def f():\n    from ministream_sidecar import client\n")
    monkeypatch.setitem(PACKAGES, "ministream", plugin)
    assert violations() == ["ministream.model imports ministream_sidecar"]
