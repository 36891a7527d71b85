"""The translation of the chart's rendered pod for `podman kube play` (no podman needed):
only the documented fields change, everything else passes through exactly as rendered."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
from imagekit import ROOT

from ministream_loadtest.haproxy import Slot, render_config
from ministream_loadtest.kube_play import KubePlayError, pod_manifest
from ministream_loadtest.podman_fleet import podman_chart_values
from ministream_testkit.helm import helm_path, render

CHART = ROOT / "charts" / "ministream"


def _deployment(**sets: Any) -> dict[str, Any]:
    docs = render(CHART, [CHART / "ci" / "cpu-local-tp1-values.yaml"], sets, namespace="serving")
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    return deployment


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    return _deployment()


def test_translation_changes_only_the_documented_fields(rendered: dict[str, Any]) -> None:
    original = copy.deepcopy(rendered)
    manifest = pod_manifest(rendered, "ms-ministream-0", namespace="serving")
    try:
        assert rendered == original, "the rendering itself must stay untouched"
        spec, before = manifest.pod["spec"], original["spec"]["template"]["spec"]
        assert manifest.pod["kind"] == "Pod" and manifest.name == "ms-ministream-0"
        assert [c["name"] for c in spec["containers"]] == ["sidecar", "vllm"]
        assert "initContainers" not in spec
        sidecar, vllm = spec["containers"]
        assert "restartPolicy" not in sidecar and "ports" not in vllm
        namespace = next(e for e in sidecar["env"] if e["name"] == "POD_NAMESPACE")
        assert namespace == {"name": "POD_NAMESPACE", "value": "serving"}
        dshm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        folder = Path(dshm["hostPath"]["path"])
        assert folder.parent == Path("/dev/shm") and folder.stat().st_mode & 0o7777 == 0o1777
        # Everything else is as rendered: undo the emptyDir renames and splits, compare.
        prefix = "ms-ministream-0-"
        rendered_names = {v["name"] for v in before["volumes"]}

        def undo(mount: dict[str, Any]) -> dict[str, Any]:
            name = mount["name"].removeprefix(prefix)
            if name in rendered_names:
                return {**mount, "name": name}
            volume, _, sub = name.rpartition("-")  # split off by subPath
            assert volume in rendered_names, mount
            return {**mount, "name": volume, "subPath": sub}

        for container in spec["containers"]:
            original = next(
                c
                for c in before["containers"] + before["initContainers"]
                if c["name"] == container["name"]
            )
            assert [undo(m) for m in container["volumeMounts"]] == original["volumeMounts"]
            assert [e for e in container["env"] if e["name"] != "POD_NAMESPACE"] == [
                e for e in original["env"] if e["name"] != "POD_NAMESPACE"
            ]
            rest = {k: v for k, v in container.items() if k not in ("volumeMounts", "env")}
            assert rest == {
                k: v
                for k, v in original.items()
                if k not in ("volumeMounts", "env", "ports", "restartPolicy")
            }
        for volume in spec["volumes"]:
            if volume["name"] == "dshm":
                continue
            undone = undo({"name": volume["name"]})["name"]
            assert {**volume, "name": undone} in before["volumes"]
        for key in ("securityContext", "terminationGracePeriodSeconds", "serviceAccountName"):
            assert spec[key] == before[key]
        assert len(manifest.translations) == 7, manifest.translations
    finally:
        for folder in manifest.memory_dirs:
            shutil.rmtree(folder)


def test_per_pod_env_goes_to_vllm_only(rendered: dict[str, Any]) -> None:
    manifest = pod_manifest(rendered, "p", extra_env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    for folder in manifest.memory_dirs:
        shutil.rmtree(folder)
    sidecar, vllm = manifest.pod["spec"]["containers"]
    assert {"name": "VLLM_CPU_OMP_THREADS_BIND", "value": "1"} in vllm["env"]
    assert all(e["name"] != "VLLM_CPU_OMP_THREADS_BIND" for e in sidecar["env"])


def test_an_unsupported_field_ref_is_refused(rendered: dict[str, Any]) -> None:
    pod = copy.deepcopy(rendered)
    container = pod["spec"]["template"]["spec"]["containers"][0]
    container["env"].append(
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    )
    with pytest.raises(KubePlayError, match=r"spec\.nodeName"):
        pod_manifest(pod, "p")


def test_podman_values_put_the_model_and_engine_flags_into_the_pod(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny"
    sets = podman_chart_values(str(model), "tiny", ("--dtype", "float32"), {"X": "1"})
    deployment = _deployment(**sets)
    vllm = next(
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"
    )
    args = vllm["args"]
    assert args[args.index("--model") + 1] == "/models/tiny"
    assert args[args.index("--served-model-name") + 1] == "tiny"
    assert args[-2:] == ["--dtype", "float32"]
    volume = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "model"
    )
    assert volume["hostPath"]["path"] == str(model.parent)
    assert {"name": "X", "value": "1"} in vllm["env"]


def test_haproxy_reaches_a_slot_at_its_address() -> None:
    from ministream_loadtest.chart_pod import chart_pod

    probe = chart_pod(CHART, helm=helm_path())
    config = render_config(
        frontend_port=1,
        socket_path=Path("/tmp/s"),
        slots=[Slot(0, 8000, 8081, "10.213.1.10")],
        enabled={0},
        probe=probe,
    )
    assert "server slot0 10.213.1.10:8000 check port 8081" in config
