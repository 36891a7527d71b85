"""Helpers of the chart tests: the real helm binaries and a cached renderer.

helm comes from .tools/bin (scripts/install_tools.sh) or PATH. A missing helm fails the tests
instead of skipping them: CI runs the install script first, so absence is a broken set-up.
No Kubernetes API server runs here; kubernetes-validate's API schemas stand in for it.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ministream_testkit.helm import RELEASE as RELEASE
from ministream_testkit.helm import RenderError, documents, render_text
from tests.support import tools

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"
TOOLS_BIN = ROOT / ".tools" / "bin"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
NAMESPACE = "serving"
# What a refused render raises; the chart tests name it for what it is to them.
HelmError = RenderError
# Kubernetes minor versions the chart supports (Chart.yaml kubeVersion >= 1.29).
KUBE_VERSIONS = ["1.29", "1.30", "1.31", "1.32", "1.33", "1.34", "1.35"]
INSTALL_HINT = "run scripts/install_tools.sh (installs helm 4, helm 3 and kubectl into .tools/bin)"


def _find(names: list[str]) -> str | None:
    for name in names:
        local = TOOLS_BIN / name
        if local.is_file():
            return str(local)
    for name in names:
        if found := shutil.which(name):
            return found
    return None


@functools.cache
def helm_binary(major: int) -> str:
    """Path of a helm binary of the given major version, or fail with the install hint."""
    candidates = ["helm"] if major == 4 else ["helm3", "helm"]
    for name in candidates:
        path = _find([name])
        if path and helm_major(path) == major:
            return path
    tools.missing_tool(f"helm {major} not found in .tools/bin or PATH: {INSTALL_HINT}")


@functools.cache
def helm_major(path: str) -> int:
    out = subprocess.run([path, "version", "--short"], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().lstrip("v").split(".")[0])


# The label that tells a P/D release's pools apart (templates/_disaggregation.tpl).
POOL_LABEL = "ministream.io/pool"


@dataclass(frozen=True)
class Rendered:
    docs: tuple[dict[str, Any], ...]
    text: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d["kind"] == kind]

    def serving(self, kind: str) -> list[dict[str, Any]]:
        """The objects of a kind that serve the model: the router's own (router.enabled,
        tests/charts/test_chart_router.py) aside."""
        return [d for d in self.of_kind(kind) if not _is_router(d)]

    def one(self, kind: str) -> dict[str, Any]:
        """The one object of a kind, the router's own (router.enabled) aside."""
        found = self.serving(kind)
        assert len(found) == 1, f"expected one {kind}, got {len(found)}"
        return found[0]

    def kinds(self) -> set[str]:
        return {d["kind"] for d in self.docs}

    def workloads(self) -> list[dict[str, Any]]:
        """Every serving workload: one, or a P/D release's two pools (disaggregation.enabled)."""
        return [
            d
            for d in self.of_kind("Deployment") + self.of_kind("LeaderWorkerSet")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
        ]

    def workload(self, pool: str = "decode") -> dict[str, Any]:
        """The serving workload: the Deployment, or the LeaderWorkerSet of a release whose
        replica spans several nodes (docs/multinode.md); never the router's Deployment. In a
        P/D release, the `pool`'s Deployment: both pools render one pod template, and
        tests/charts/test_chart_pd.py checks they differ in the pool label only, so what a
        scenario test checks on one holds for the other."""
        found = self.workloads()
        if len(found) == 2:
            found = [d for d in found if d["metadata"]["labels"].get(POOL_LABEL) == pool]
        assert len(found) == 1, f"expected one serving workload, got {len(found)}"
        return found[0]

    def pod_template(self, role: str = "leader") -> dict[str, Any]:
        """The serving pod's template: the Deployment's, or a LeaderWorkerSet's leader (the pod
        with vLLM, the sidecar and the probes) or `role="worker"` template."""
        workload = self.workload()
        if workload["kind"] == "Deployment":
            template: dict[str, Any] = workload["spec"]["template"]
            return template
        lwt = workload["spec"]["leaderWorkerTemplate"]
        return lwt["leaderTemplate"] if role == "leader" else lwt["workerTemplate"]


def admits(policy: dict[str, Any], labels: dict[str, str], port: int) -> bool:
    """Whether an ingress rule of a NetworkPolicy lets a same-namespace pod with `labels` in on
    `port` (a rule's port, or its port..endPort range; podSelector peers by matchLabels, an
    empty podSelector admits every pod)."""
    for rule in policy["spec"]["ingress"]:
        ranges = [(p["port"], p.get("endPort", p["port"])) for p in rule.get("ports", [])]
        if not any(lo <= port <= hi for lo, hi in ranges):
            continue
        for peer in rule.get("from", []):
            if "namespaceSelector" in peer or "podSelector" not in peer:
                continue
            if peer["podSelector"].get("matchLabels", {}).items() <= labels.items():
                return True
    return False


def up_alert_pods(rendered: Rendered) -> str:
    """The pod regex of the rendered PrometheusRule's `up{...}` alert."""
    rules = rendered.one("PrometheusRule")["spec"]["groups"]
    (up,) = [r["expr"] for g in rules for r in g["rules"] if r["expr"].startswith("up{")]
    pattern = re.search(r'pod=~"([^"]+)"', up)
    assert pattern, up
    return pattern.group(1)


def _is_router(doc: dict[str, Any]) -> bool:
    labels = doc["metadata"].get("labels") or {}
    return bool(labels.get("app.kubernetes.io/component") == "router")


def run_helm(args: list[str], major: int = 4) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(major), *args], capture_output=True, text=True, timeout=60)


def render_notes(*values_files: Path | str, set_args: tuple[str, ...] = ()) -> str:
    """NOTES.txt as `helm install` shows it (helm 4's client-side dry run needs no cluster)."""
    args = ["install", RELEASE, str(CHART), "--dry-run=client", "-n", NAMESPACE]
    for f in values_files:
        args += ["-f", str(f)]
    for s in set_args:
        args += ["--set", s]
    proc = run_helm(args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:", 1)[1]


@functools.cache
def _render(
    values_files: tuple[str, ...],
    sets: tuple[tuple[str, str], ...],
    major: int,
    chart: str,
    extra: tuple[str, ...],
) -> Rendered:
    values = {key: json.loads(value) for key, value in sets}
    text = render_text(
        chart, values_files, values, namespace=NAMESPACE, extra=extra, helm=helm_binary(major)
    )
    return Rendered(tuple(documents(text)), text)


def render(
    *values_files: Path | str,
    major: int = 4,
    chart: Path = CHART,
    extra: tuple[str, ...] = (),
    **sets: Any,
) -> Rendered:
    """`helm template` with values files and `--set-json key=value` pairs (dots in keys via
    `__`, e.g. loading__mode="local"). Raises HelmError (ministream_testkit.helm's
    RenderError) with helm's message on failure."""
    pairs = tuple(sorted((k.replace("__", "."), json.dumps(v)) for k, v in sets.items()))
    return _render(tuple(str(f) for f in values_files), pairs, major, str(chart), extra)


def scenario_id(path: Path) -> str:
    return path.name.removesuffix("-values.yaml")


def scenario_values(path: Path) -> dict[str, Any]:
    """The chart's values.yaml merged with the scenario (what the templates saw)."""
    base = yaml.safe_load((CHART / "values.yaml").read_text())
    return _merge(base, yaml.safe_load(path.read_text()) or {})


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out
