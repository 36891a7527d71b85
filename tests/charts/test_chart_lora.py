"""LoRA adapters in the chart (lora.*): the fetch-adapters init step, vLLM's LoRA flags with
a free slot by default, the sidecar's adapter list, and the values refused."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, HelmError, Rendered, render

from ministream import adapter_guard

SCENARIO = CHART / "ci" / "cpu-lora-values.yaml"
ADAPTERS: list[dict[str, str]] = yaml.safe_load(SCENARIO.read_text())["lora"]["adapters"]


def _write(tmp_path: Path, overrides: dict[str, Any]) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(json.dumps(overrides))
    return path


def _containers(out: Rendered) -> dict[str, dict[str, Any]]:
    spec = out.pod_template()["spec"]
    return {c["name"]: c for c in spec["initContainers"] + spec["containers"]}


def _flag(args: list[str], flag: str) -> list[str]:
    """The values after `flag` up to the next flag."""
    rest = args[args.index(flag) + 1 :]
    end = next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))
    return rest[:end]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_adapters_are_fetched_verified_and_served_by_name() -> None:
    out = render(SCENARIO)
    c = _containers(out)
    fetch, vllm, sidecar = c["fetch-adapters"], c["vllm"], c["sidecar"]
    names = [a["name"] for a in ADAPTERS]
    init_order = [x["name"] for x in out.pod_template()["spec"]["initContainers"]]
    assert init_order.index("fetch-adapters") < init_order.index("sidecar")

    # The fetch step gets every adapter and writes where vLLM reads, with vLLM's rank limit.
    cmd = fetch["command"]
    assert cmd[:2] == ["ministream", "fetch-adapters"]
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--adapter"] == [
        f"{a['name']}={a['uri']}" for a in ADAPTERS
    ]
    out_dir = _flag(cmd, "--output-dir")[0]
    assert _flag(cmd, "--max-rank") == _flag(vllm["args"], "--max-lora-rank")
    mounts = {m["name"]: m for m in fetch["volumeMounts"]}
    assert mounts["adapters"]["mountPath"] == out_dir and not mounts["adapters"].get("readOnly")
    assert mounts["model"]["readOnly"] is True
    # S3 adapters are read with the model's S3 settings; the base hash is checked.
    env = _env(fetch)
    assert (
        env["AWS_ENDPOINT_URL"] == yaml.safe_load(SCENARIO.read_text())["loading"]["s3"]["endpoint"]
    )
    assert env["MINISTREAM_MODEL_HASH"] == yaml.safe_load(SCENARIO.read_text())["model"]["hash"]

    # vLLM: LoRA on, a free slot beyond the adapters, every adapter by name from out_dir,
    # read-only, started through the entrypoint that leaves refused adapters out.
    args = vllm["args"]
    assert "--enable-lora" in args
    assert int(_flag(args, "--max-loras")[0]) == len(ADAPTERS) + 1
    assert _flag(args, "--lora-modules") == [f"{n}={out_dir}/{n}" for n in names]
    vmounts = {m["name"]: m for m in vllm["volumeMounts"]}
    assert vmounts["adapters"]["mountPath"] == out_dir and vmounts["adapters"]["readOnly"]
    assert vllm["command"] == ["python3", "-m", "ministream_sidecar.serve_vllm"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in _env(vllm)
    # The sidecar warms up exactly the names vLLM serves.
    assert _env(sidecar)["MINISTREAM_SIDECAR_LORA_ADAPTERS"].split(",") == names
    volumes = {v["name"]: v for v in out.pod_template()["spec"]["volumes"]}
    assert "emptyDir" in volumes["adapters"]


def test_lora_off_renders_nothing_of_it() -> None:
    out = render(SCENARIO, lora__enabled=False)
    c = _containers(out)
    assert "fetch-adapters" not in c
    assert not [a for a in c["vllm"]["args"] if "lora" in a]
    assert "MINISTREAM_SIDECAR_LORA_ADAPTERS" not in _env(c["sidecar"])
    assert "adapters" not in {v["name"] for v in out.pod_template()["spec"]["volumes"]}


def test_gpu_pods_with_adapters_start_vllm_through_the_filtering_entrypoint() -> None:
    on = _containers(render(SCENARIO, accelerator__type="gpu"))["vllm"]
    off = _containers(render(SCENARIO, accelerator__type="gpu", lora__enabled=False))["vllm"]
    assert on["command"][-1] == "ministream_sidecar.serve_vllm"
    assert off["command"][-1] == "vllm.entrypoints.openai.api_server"


def test_explicit_slots_and_cpu_cache_render() -> None:
    args = _containers(render(SCENARIO, lora__maxLoras=4, lora__maxCpuLoras=8))["vllm"]["args"]
    assert _flag(args, "--max-loras") == ["4"] and _flag(args, "--max-cpu-loras") == ["8"]


def test_every_slot_in_use_is_accepted() -> None:
    """As many slots as adapters: base requests beside a full set are the plugin's to serve
    right (ministream.lora_punica, vllm#48421), so the chart sets no floor."""
    full = len(ADAPTERS)
    args = _containers(render(SCENARIO, lora__maxLoras=full))["vllm"]["args"]
    assert _flag(args, "--max-loras") == [str(full)]


def test_dynamic_loading_is_on_only_when_asked() -> None:
    vllm = _containers(render(SCENARIO, lora__dynamic__enabled=True))["vllm"]
    assert _env(vllm)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    # vLLM's key covers /v1 only; the guard covers its /adapters routes (adapter_guard).
    assert _flag(vllm["args"], "--middleware") == [adapter_guard.MIDDLEWARE]
    module, name = adapter_guard.MIDDLEWARE.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is adapter_guard.AdapterRoutesGuard
    static = _containers(render(SCENARIO))["vllm"]
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in _env(static)
    assert "--middleware" not in static["args"]


BAD: dict[str, tuple[dict[str, Any], list[str]]] = {
    "cpu-cache-below-slots": ({"lora": {"maxCpuLoras": 1}}, ["lora.maxCpuLoras"]),
    "dynamic-without-key": (
        {"lora": {"dynamic": {"enabled": True}}, "apiKey": {"enabled": False}},
        ["/apiKey/enabled", "must be true"],
    ),
    "rank-vllm-lacks": ({"lora": {"maxRank": 24}}, ["maxRank"]),
    "duplicate-name": (
        {"lora": {"adapters": [ADAPTERS[0], ADAPTERS[0]]}},
        [ADAPTERS[0]["name"], "twice"],
    ),
    "base-name": (
        {"lora": {"adapters": [{"name": "ministream", "uri": ADAPTERS[0]["uri"]}]}},
        ["model.name"],
    ),
    "path-off-volume": (
        {"lora": {"adapters": [{"name": "x", "uri": "/etc/x"}]}},
        ["/etc/x", "not on the model volume"],
    ),
    "path-without-volume": (
        {
            "loading": {"mode": "runaiStreamer", "s3": {"bucket": "m"}},
            "lora": {"adapters": [ADAPTERS[1]]},
        },
        [ADAPTERS[1]["uri"], "use an s3:// URI"],
    ),
    "relative-uri": ({"lora": {"adapters": [{"name": "x", "uri": "adapters/x"}]}}, ["uri"]),
    "lora-flag-by-hand": ({"vllm": {"extraArgs": ["--max-loras=1"]}}, ["extraArgs"]),
    "multi-node": (
        {"accelerator": {"type": "gpu"}, "parallelism": {"tensor": 8, "pipeline": 2}},
        ["multi-node replica"],
    ),
}


@pytest.mark.parametrize(("overrides", "words"), BAD.values(), ids=BAD.keys())
def test_bad_lora_values_are_refused(
    tmp_path: Path, overrides: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(HelmError) as err:
        render(SCENARIO, _write(tmp_path, overrides))
    for word in words:
        assert word in str(err.value), str(err.value)
