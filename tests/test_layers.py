"""Layers that point one way (docs/architecture.md, "The parts and which way they depend").

Every import of every module of our packages and of scripts/ and scripts/gpu/, at any depth
(a function's lazy import counts), is held against the table of what each may import;
`from X import Y` counts as importing `X.Y` too where that is one of our modules. The only
runtime entries into other packages of ours are the `ministream` CLI's two commands that run
them (`ministream up` starts the sidecar's launcher, `ministream reference` the reference
model); nothing vLLM loads imports the sidecar, and no package imports a script. An import
by a name computed at run time (`importlib.import_module(name)`) is not seen.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
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
# Folders of scripts, not packages: a script imports its neighbours by bare name
# (`import interval_stats`), as `python scripts/x.py` runs it.
SCRIPT_FOLDERS = {
    "scripts": ROOT / "scripts",
    "scripts/gpu": ROOT / "scripts" / "gpu",
}
# Which of our packages and script folders each one may import (itself always). No package
# imports a script: scripts use the packages, never the other way.
MAY_IMPORT: dict[str, set[str]] = {
    "ministream": set(),
    "ministream_sidecar": {"ministream"},
    "ministream_loadtest": {"ministream_sidecar", "ministream_testkit"},
    "ministream_reference": {"ministream", "ministream_testkit"},
    "ministream_observability": set(),
    "ministream_testkit": {"ministream", "ministream_sidecar"},
    # docs_tables reads the GPU scripts' report code (imported by name at run time); a
    # benchmark reads vLLM's metric names from the one catalog (bench_pd: NIXL's counters).
    "scripts": {
        "ministream",
        "ministream_sidecar",
        "ministream_loadtest",
        "ministream_observability",
        "ministream_reference",
        "ministream_testkit",
        "scripts/gpu",
    },
    # The GPU host runs these from a checkout (scripts/gpu/h200.sh puts every package on
    # PYTHONPATH): the runtime packages, the test oracles, the harnesses, the load test's one
    # streamed client, and the one statistics module of scripts/ (interval_stats).
    "scripts/gpu": {
        "ministream",
        "ministream_sidecar",
        "ministream_loadtest",
        "ministream_reference",
        "ministream_testkit",
        "scripts",
    },
}
# (module, imported package): the CLI commands that run another part, imported lazily.
EXCEPTIONS = {
    ("ministream.cli", "ministream_sidecar"),
    ("ministream.cli", "ministream_reference"),
}
# What the sidecar may take from the plugin package: torch-free modules only (the sidecar
# image has no torch). Held per module: `from ministream import model` counts as
# `ministream.model`.
SIDECAR_FROM_PLUGIN = {"ministream", "ministream.startup_log", "ministream.versions"}


@dataclass(frozen=True)
class Module:
    owner: str  # a key of PACKAGES or SCRIPT_FOLDERS
    name: str  # dotted for a package's module; scripts/gpu/cold_start for a script
    path: Path


def _modules() -> list[Module]:
    found = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append(Module(package, ".".join([package, *parts]), path))
    for owner, folder in SCRIPT_FOLDERS.items():
        found += [Module(owner, f"{owner}/{p.stem}", p) for p in sorted(folder.glob("*.py"))]
    return found


def _owners(modules: list[Module]) -> dict[str, str]:
    """Every importable name of ours (a package's dotted modules, a script's bare name, the
    folder `scripts`) and who owns it."""
    owners = {"scripts": "scripts"}
    for module in modules:
        bare = module.name.rsplit("/", 1)[-1]
        owners[bare] = module.owner
    return owners


def _imports(path: Path, known: dict[str, str]) -> set[str]:
    """Every absolute import of `path`; `from X import Y` also counts as `X.Y` where that is
    one of our modules, so that `from ministream import model` is seen as importing it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(
                f"{node.module}.{alias.name}"
                for alias in node.names
                if f"{node.module}.{alias.name}" in known
            )
    return names


def _owner(name: str, owners: dict[str, str]) -> str | None:
    top = name.split(".")[0]
    return top if top in PACKAGES else owners.get(top)


def violations() -> list[str]:
    bad = []
    modules = _modules()
    owners = _owners(modules)
    for module in modules:
        refused: set[str] = set()  # one line per module and part it may not import
        for name in sorted(_imports(module.path, owners)):
            owner = _owner(name, owners)
            if owner is None or owner == module.owner:
                continue
            allowed = owner in MAY_IMPORT[module.owner] or (module.name, owner) in EXCEPTIONS
            if not allowed and owner not in refused:
                refused.add(owner)
                bad.append(f"{module.name} imports {name}")
            if (
                module.owner == "ministream_sidecar"
                and owner == "ministream"
                and name not in SIDECAR_FROM_PLUGIN
            ):
                bad.append(f"{module.name} imports {name} (the sidecar has no torch)")
    return bad


def test_every_import_points_the_allowed_way() -> None:
    assert violations() == []


def test_the_check_sees_a_lazy_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = tmp_path / "ministream"
    plugin.mkdir()
    (plugin / "model.py").write_text("def f():\n    from ministream_sidecar import client\n")
    monkeypatch.setitem(PACKAGES, "ministream", plugin)
    assert violations() == ["ministream.model imports ministream_sidecar"]


def test_from_a_package_import_a_module_is_that_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sidecar = tmp_path / "ministream_sidecar"
    sidecar.mkdir()
    (sidecar / "app.py").write_text("from ministream import model, startup_log\n")
    monkeypatch.setitem(PACKAGES, "ministream_sidecar", sidecar)
    assert violations() == [
        "ministream_sidecar.app imports ministream.model (the sidecar has no torch)"
    ]


def test_no_package_imports_a_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    testkit = tmp_path / "ministream_testkit"
    testkit.mkdir()
    (testkit / "stats.py").write_text("import interval_stats\n")
    (testkit / "tables.py").write_text("def f():\n    from scripts import docs_tables\n")
    monkeypatch.setitem(PACKAGES, "ministream_testkit", testkit)
    assert violations() == [
        "ministream_testkit.stats imports interval_stats",
        "ministream_testkit.tables imports scripts",
    ]
