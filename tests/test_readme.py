"""The README and the chart README work as written: each curl asks for the name the command
before it serves, every `helm install` example renders with real helm (current value names
only), and the README links the design docs."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support import tools

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHART_README = (ROOT / "charts" / "ministream" / "README.md").read_text()
HELM = ROOT / ".tools" / "bin" / "helm"


def _served_name(command: str) -> str:
    """What vLLM serves the model as: --served-model-name, else the --model path itself."""
    words = shlex.split(command.replace("\\\n", " "))
    if "--served-model-name" in words:
        return words[words.index("--served-model-name") + 1]
    return words[words.index("--model") + 1]


def _curl_models(text: str) -> list[str]:
    return re.findall(r'"model": "([^"]+)"', text)


def test_the_make_serve_curl_asks_for_the_name_make_serve_serves() -> None:
    makefile = (ROOT / "Makefile").read_text()
    serve = makefile.split("\nserve:", 1)[1].split("\n\n", 1)[0]
    first_curl = README.split("Once `make serve` prints", 1)[1].split("```", 2)[1]
    assert _curl_models(first_curl) == [_served_name(serve.split("ministream up", 1)[1])]


def test_the_checkpoint_to_service_curl_asks_for_the_name_up_serves() -> None:
    section = README.split("## From checkpoint to service", 1)[1].split("\n## ", 1)[0]
    up = next(line for line in section.splitlines() if "ministream up" in line)
    curls = _curl_models(section)
    assert curls, "the section shows no request to the model it serves"
    assert set(curls) == {_served_name(up.split("ministream up", 1)[1])}


@pytest.mark.parametrize("doc", ["docs/architecture.md", "docs/fleet.md", "docs/multinode.md"])
def test_the_readme_links_the_design_docs(doc: str) -> None:
    assert f"]({doc})" in README and (ROOT / doc).is_file()


def _helm_installs() -> list[str]:
    blocks = re.findall(r"```sh\n(.*?)```", CHART_README, flags=re.S)
    commands = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        commands += [line for line in joined.splitlines() if line.startswith("helm install ")]
    return commands


INSTALLS = _helm_installs()


def test_the_chart_readme_has_install_examples() -> None:
    assert len(INSTALLS) >= 3


@pytest.mark.parametrize("command", INSTALLS)
def test_each_chart_readme_install_renders_with_current_value_names(command: str) -> None:
    if not HELM.exists():
        tools.missing_tool("helm is not installed: run scripts/install_tools.sh")
    words = shlex.split(command)
    assert words[:4] == ["helm", "install", "ms", "charts/ministream"], command
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    # The older name still renders; the examples teach the current one.
    assert not [s for s in sets if s.startswith("tensorParallelSize=")], command
    proc = subprocess.run(
        [str(HELM), "template", *words[2:]], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, f"{command}\n{proc.stderr}"
