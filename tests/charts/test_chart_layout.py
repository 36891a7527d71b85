"""The chart's template layout (charts/ministream/README.md, "Template layout"), held against
what helm renders: helpers (`_*.tpl`) render no object, every other template renders at most
one, and its file is named for that object's kind, `<kind>.yaml` or `<kind>-<component>.yaml`.

Checked for every `ci/` scenario and for the configurations that render what no scenario does,
so every template file is checked at least once (test_every_template_file_is_checked).
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, SCENARIOS, Rendered, render, scenario_id

TEMPLATES = CHART / "templates"
SOURCE_PREFIX = f"# Source: {CHART.name}/templates/"
FLEET = CHART / "ci" / "fleet-values.yaml"
# What no ci/ scenario renders: the chart's own endpoint picker (two replicas and a scrape
# token, so its budget and metrics-auth RBAC render too) and the HPA autoscaling engine.
EXTRA: dict[str, tuple[Path, dict[str, Any]]] = {
    "fleet-picker": (
        FLEET,
        {
            "gateway__picker__enabled": True,
            "gateway__picker__replicas": 2,
            "gateway__picker__metricsAuthSecret": "picker-scrape",
        },
    ),
    "fleet-hpa": (FLEET, {"autoscaling__engine": "hpa"}),
}
CONFIGS: dict[str, tuple[Path, dict[str, Any]]] = {
    **{scenario_id(s): (s, {}) for s in SCENARIOS},
    **EXTRA,
}


def objects(out: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """Each rendered object with the template file (its path under templates/) it came from."""
    found = []
    for doc in out.text.split("\n---\n"):
        sources = [line for line in doc.splitlines() if line.startswith(SOURCE_PREFIX)]
        if sources and (obj := yaml.safe_load(doc)):
            found.append((sources[0].removeprefix(SOURCE_PREFIX), obj))
    return found


def objects_by_source(out: Rendered) -> Counter[str]:
    return Counter(source for source, _ in objects(out))


def render_config(name: str, chart: Path = CHART) -> Rendered:
    values, sets = CONFIGS[name]
    return render(chart / values.relative_to(CHART), chart=chart, **sets)


def expose_helpers(chart: Path) -> None:
    """Rename each `_x.tpl` to `x.tpl`: helm drops whatever a file named `_*` renders, so a
    stray object in a helper would reach no output; renamed, it shows as a document."""
    for helper in (chart / "templates").glob("_*.tpl"):
        helper.rename(helper.with_name(helper.name.removeprefix("_")))


@pytest.fixture(scope="module")
def exposed_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chart = copy_chart(tmp_path_factory.mktemp("exposed"))
    expose_helpers(chart)
    return chart


def helper_objects(out: Rendered) -> list[str]:
    """The template files renamed by expose_helpers that rendered an object."""
    helpers = {p.name.removeprefix("_") for p in TEMPLATES.glob("_*.tpl")}
    return sorted(f"_{source}" for source in objects_by_source(out) if source in helpers)


@pytest.mark.parametrize("config", CONFIGS)
def test_each_template_file_renders_at_most_one_object(config: str) -> None:
    several = {f: n for f, n in objects_by_source(render_config(config)).items() if n > 1}
    assert not several, f"template files rendering several objects (split them): {several}"


@pytest.mark.parametrize("config", CONFIGS)
def test_template_files_are_named_for_their_kind(config: str) -> None:
    for source, obj in objects(render_config(config)):
        kind, stem = obj["kind"], Path(source).stem
        assert stem == kind.lower() or stem.startswith(f"{kind.lower()}-"), (
            f"{source} renders a {kind}: name it {kind.lower()}.yaml or "
            f"{kind.lower()}-<component>.yaml"
        )


@pytest.mark.parametrize("config", CONFIGS)
def test_helpers_render_no_object(config: str, exposed_chart: Path) -> None:
    leaked = helper_objects(render_config(config, exposed_chart))
    assert not leaked, f"helper files rendering objects (only defines belong there): {leaked}"


def test_every_template_file_is_checked() -> None:
    rendered: set[str] = set()
    for config in CONFIGS:
        rendered |= set(objects_by_source(render_config(config)))
    files = {
        str(p.relative_to(TEMPLATES))
        for p in TEMPLATES.rglob("*.yaml")
        if not p.name.startswith("_")
    }
    assert not files - rendered, (
        f"templates no configuration renders (add one to EXTRA): {sorted(files - rendered)}"
    )


def copy_chart(into: Path) -> Path:
    """A copy of the chart under `into` (a path of its own: chartkit caches renders by path)."""
    chart = into / CHART.name
    shutil.copytree(CHART, chart)
    return chart


def test_a_helper_rendering_an_object_is_caught(tmp_path: Path) -> None:
    """A stray object in a helper: helm itself drops it, the exposed copy shows it."""
    stray = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stray\n"
    plain, exposed = copy_chart(tmp_path / "plain"), copy_chart(tmp_path / "exposed")
    for chart in (plain, exposed):
        with (chart / "templates" / "_lora.tpl").open("a") as f:
            f.write(stray)
    expose_helpers(exposed)
    scenario = next(iter(CONFIGS))
    assert "stray" not in render_config(scenario, plain).text
    assert helper_objects(render_config(scenario, exposed)) == ["_lora.tpl"]


def test_a_template_file_rendering_two_objects_is_caught(tmp_path: Path) -> None:
    chart = copy_chart(tmp_path)
    two = "\n---\n".join(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n" for name in ("a", "b")
    )
    (chart / "templates" / "configmap-two.yaml").write_text(two)
    counts = objects_by_source(render_config(next(iter(CONFIGS)), chart))
    assert counts["configmap-two.yaml"] == 2
