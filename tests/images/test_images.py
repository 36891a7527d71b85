"""The images built for real (`make images`: buildah, a base bootstrapped from Debian packages
where python:3.12-slim-bookworm cannot be pulled) and checked from the inside: sizes within
their budgets, the chart's non-root user, no compiler, build leftovers or pip cache, a sidecar
image without torch, vLLM or the Kubernetes client, a router image with the pinned vllm-router
and nothing of the project, and the CPU image able to run the chart's preStop client.

In CI (`make test`), whose budget these fit (docs/images.md: ~10 min cold, ~1 min with the
layer cache): marked `images` and `root`; without root they are skipped with that reason.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest
import tomllib
import yaml
from imagekit import ROOT, podman, run_in

pytestmark = [
    pytest.mark.images,
    # `engine` too: building the CPU image runs vLLM's plugin discovery (check-install.py
    # --engine), and a cold build takes minutes; `make unit` leaves these out.
    pytest.mark.engine,
    pytest.mark.root("buildah --isolation chroot and podman with runc"),
    pytest.mark.timeout(3600),  # a cold build (no layer cache) is part of the first test
]

CHART = ROOT / "charts" / "ministream"
# Anything that compiles or links: none may be in a runtime image.
COMPILERS = ("gcc", "cc", "c++", "g++", "clang", "ld", "as", "make", "x86_64-linux-gnu-gcc")


def _tag(report: dict[str, Any], key: str) -> str:
    return str(report[key]["tag"])


def test_image_names_are_the_charts_defaults(images_script: ModuleType) -> None:
    """`make images` tags what the chart pulls by default (IfNotPresent finds them locally)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    names = images_script.images()
    assert names["cpu"].tag == f"{values['image']['cpuRepository']}:{version}"
    assert names["sidecar"].tag == f"{values['sidecar']['image']['repository']}:{version}"
    assert names["router"].tag == f"{values['router']['image']['repository']}:{version}"


@pytest.mark.parametrize("key", ["sidecar", "router", "cpu"])
def test_size_within_budget(
    built_images: dict[str, Any], images_script: ModuleType, key: str
) -> None:
    size_mb = built_images[key]["size_bytes"] / 1e6
    budget = images_script.BUDGET_MB[key]
    assert size_mb <= budget, f"{key} image is {size_mb:.0f} MB, over its {budget} MB budget"


def test_budgets_are_the_documented_ones(images_script: ModuleType) -> None:
    doc = (ROOT / "docs" / "images.md").read_text()
    for key, budget in images_script.BUDGET_MB.items():
        assert re.search(rf"\| `{key}` .*\| ≤ {budget} MB \|", doc), f"docs/images.md: {key}"


@pytest.mark.parametrize("key", ["sidecar", "router", "cpu", "serving"])
def test_runs_as_the_charts_non_root_user(built_images: dict[str, Any], key: str) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    tag = _tag(built_images, key)
    user = podman("image", "inspect", "--format", "{{.Config.User}}", tag).stdout.strip()
    assert user == f"{uid}:{uid}"
    proc = run_in(tag, "id -u; id -g; echo $HOME")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(uid), str(uid), "/tmp"]


@pytest.mark.parametrize("key", ["sidecar", "router", "cpu", "serving"])
def test_no_compiler_build_leftovers_or_pip_cache(built_images: dict[str, Any], key: str) -> None:
    tag = _tag(built_images, key)
    found = run_in(tag, f"for c in {' '.join(COMPILERS)}; do command -v $c; done; true")
    assert found.stdout.split() == [], f"compilers in {tag}: {found.stdout.split()}"
    leftovers = run_in(
        tag,
        "ls -d /root/.cache /tmp/* /opt/ministream/src/build /opt/ministream/src/*.egg-info "
        "/var/lib/apt/lists/*_Packages* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb "
        "2>/dev/null; find / -xdev -name 'pip-*' -path '*/tmp/*' 2>/dev/null; true",
        user="0",
    )
    assert leftovers.stdout.split() == [], f"build leftovers in {tag}: {leftovers.stdout}"
    env = podman("image", "inspect", "--format", "{{json .Config.Env}}", tag).stdout
    if key != "sidecar":  # the sidecar image has no pip step at runtime; these have pip
        assert "PIP_NO_CACHE_DIR=1" in env


_UNCOMPILED = """
import importlib.util, pathlib, sys
missing = total = 0
for name in sys.argv[1:]:
    root = pathlib.Path(importlib.util.find_spec(name).origin).parent
    for py in root.rglob("*.py"):
        total += 1
        missing += not pathlib.Path(importlib.util.cache_from_source(str(py))).is_file()
print(missing, total)
"""


@pytest.mark.parametrize(
    ("key", "packages"),
    [
        ("sidecar", "ministream_sidecar fastapi pydantic"),
        ("router", "vllm_router aiohttp"),
        ("cpu", "ministream ministream_sidecar vllm transformers"),
        ("serving", "ministream ministream_sidecar"),
    ],
)
def test_bytecode_is_precompiled(built_images: dict[str, Any], key: str, packages: str) -> None:
    """The pods run on a read-only root filesystem: a module without its .pyc in the image is
    compiled again at every start (precompiling the GPU host's unpacked vLLM cut
    the API server's imports from 20.5 to 16.7 s). pip compiles what it installs."""
    script = f"cat > /tmp/c.py <<'PY'{_UNCOMPILED}PY\npython3 /tmp/c.py {packages}"
    proc = run_in(_tag(built_images, key), script)
    assert proc.returncode == 0, proc.stderr
    missing, total = map(int, proc.stdout.split())
    assert total > 0 and missing == 0, f"{missing} of {total} modules without bytecode"


def test_sidecar_image_has_no_engine_and_no_kubernetes_client(built_images: dict[str, Any]) -> None:
    proc = run_in(
        _tag(built_images, "sidecar"),
        "python3 -c 'import importlib.util as u; "
        'print([m for m in ("torch", "vllm", "kubernetes", "numpy") if u.find_spec(m)])\'',
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert run_in(_tag(built_images, "sidecar"), "ministream-sidecar --help").returncode == 0


def test_router_image_has_the_pinned_router_and_nothing_of_the_project(
    built_images: dict[str, Any],
) -> None:
    """The version is the `router` extra's pin in pyproject.toml (its one place)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (pin,) = extras["optional-dependencies"]["router"]
    tag = _tag(built_images, "router")
    proc = run_in(
        tag,
        "python3 -c 'import importlib.metadata as m, importlib.util as u; "
        'print(m.version("vllm-router"), [n for n in ("torch", "vllm", "ministream", '
        '"ministream_sidecar") if u.find_spec(n)])\'',
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [pin.split("==")[1], "[]"]
    entrypoint = podman("image", "inspect", "--format", "{{json .Config.Entrypoint}}", tag)
    assert entrypoint.stdout.strip() == '["vllm-router"]'


@pytest.mark.parametrize("key", ["cpu", "serving"])
def test_serving_image_runs_the_prestop_client(built_images: dict[str, Any], key: str) -> None:
    """The chart's preStop hook is `python3 -m ministream_sidecar.client drain ...`, run with
    the serving image's own python3 (no sidecar extra installed there)."""
    proc = run_in(_tag(built_images, key), "python3 -m ministream_sidecar.client --help")
    assert proc.returncode == 0, proc.stderr
    assert "drain" in proc.stdout


def test_dev_packages_stay_out(built_images: dict[str, Any]) -> None:
    for key in ("cpu", "sidecar", "router", "serving"):
        proc = run_in(
            _tag(built_images, key),
            'python3 -c \'import importlib.util as u; print([m for m in ("ministream_loadtest",'
            ' "ministream_reference", "ministream_observability") if u.find_spec(m)])\'',
        )
        assert proc.stdout.strip() == "[]", (key, proc.stdout, proc.stderr)


def test_no_host_configuration_in_the_images(built_images: dict[str, Any]) -> None:
    """The host's pip configuration was mounted into RUN steps only (scripts/images.py)."""
    for key in ("cpu", "sidecar", "router", "serving"):
        proc = run_in(
            _tag(built_images, key),
            "ls /etc/pip.conf /etc/xdg/pip /run/ministream-host-pip 2>/dev/null; true",
            user="0",
        )
        assert proc.stdout.split() == [], (key, proc.stdout)
