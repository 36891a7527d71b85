"""Prefill/decode disaggregation (`disaggregation.enabled`): a prefill and a decode Deployment
behind vLLM's router in P/D mode, NIXL between them. Checked as rendered: the pools are the
colocated serving pod plus NIXL and differ in their pool label only, the router finds each
pool by that pool's own labels (its command line parsed by vllm-router's own parser), the
NetworkPolicy admits the NIXL ports between serving pods and nobody else, and what cannot work
is refused with the value to change. The strict schema validation of every rendered object is
the scenario tests' (ci/pd-values.yaml in tests/charts/test_chart_scenarios.py); the transfer
itself runs for real in tests/pd/test_pd_live.py.

No Kubernetes API server runs here: the router's pod watch cannot be exercised, so the test
compares the selectors it is given with the pods' labels.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from chartkit import CHART, POOL_LABEL, HelmError, Rendered, admits, render, up_alert_pods

from tests.support import tools

PD = CHART / "ci" / "pd-values.yaml"
POOLS = ("prefill", "decode")


def write(tmp_path: Path, overrides: dict[str, Any], name: str = "o.yaml") -> Path:
    """A values file; one name per content (chartkit caches renders by file name)."""
    path = tmp_path / name
    assert not path.exists(), f"{path} written twice: the render cache would return the first"
    path.write_text(json.dumps(overrides))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def pd() -> Rendered:
    return render(PD)


def router_args(rendered: Rendered) -> list[str]:
    (router,) = [
        d
        for d in rendered.of_kind("Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    ]
    (container,) = router["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


def words_after(args: list[str], flag: str) -> list[str]:
    """The values of a multi-word flag (`--prefill-selector k=v k=v`)."""
    out = []
    for word in args[args.index(flag) + 1 :]:
        if word.startswith("--"):
            break
        out.append(word)
    return out


def selector(args: list[str], flag: str) -> dict[str, str]:
    return dict(w.split("=", 1) for w in words_after(args, flag))


def vllm(template: dict[str, Any]) -> dict[str, Any]:
    (found,) = [c for c in template["spec"]["containers"] if c["name"] == "vllm"]
    return found


def env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def without_nixl(template: dict[str, Any]) -> dict[str, Any]:
    """A pool's pod template less what P/D adds: the pool label, the connector's argument,
    its environment and its port."""
    t = copy.deepcopy(template)
    t["metadata"]["labels"].pop(POOL_LABEL)
    c = vllm(t)
    i = c["args"].index("--kv-transfer-config")
    del c["args"][i : i + 2]
    nixl = ("VLLM_NIXL_", "UCX_")
    c["env"] = [e for e in c["env"] if not e["name"].startswith(nixl)]
    c["ports"] = [p for p in c["ports"] if p["name"] != "nixl-side"]
    return t


# ---------------------------------------------------------------- the pools


def test_off_by_default_renders_nothing_of_pd() -> None:
    out = render(CHART / "ci" / "router-values.yaml")
    assert POOL_LABEL not in out.text
    assert "NIXL" not in out.text and "kv-transfer-config" not in out.text
    assert "--vllm-pd-disaggregation" not in router_args(out)


def test_two_pools_with_their_replicas(pd: Rendered) -> None:
    values = {"prefill": 2, "decode": 3}  # ci/pd-values.yaml
    for pool in POOLS:
        deployment = pd.workload(pool)
        assert deployment["metadata"]["name"] == f"ms-ministream-{pool}"
        assert deployment["spec"]["replicas"] == values[pool]
        own = deployment["spec"]["selector"]["matchLabels"]
        assert own[POOL_LABEL] == pool
        assert own.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert len(pd.workloads()) == 2
    # Neither Deployment's selector takes the other's pods (two controllers fighting over pods).
    prefill, decode = (pd.workload(p) for p in POOLS)
    assert not prefill["spec"]["selector"]["matchLabels"].items() <= (
        decode["spec"]["template"]["metadata"]["labels"].items()
    )


def test_pools_are_the_colocated_pod_plus_nixl(tmp_path: Path, pd: Rendered) -> None:
    """Same image, model, plugin, parallelism, sidecar, probes, drain and warmup on both sides
    (NIXL's compatibility check compares model and layout): the pools' templates are the
    colocated release's, with only the connector added."""
    colocated = render(PD, write(tmp_path, {"disaggregation": {"enabled": False}}))
    expected = colocated.workload()["spec"]["template"]
    for pool in POOLS:
        template = pd.workload(pool)["spec"]["template"]
        assert template["metadata"]["labels"][POOL_LABEL] == pool
        assert without_nixl(template) == expected, pool
    spec = expected["spec"]
    assert [c["name"] for c in spec["initContainers"]][-1] == "sidecar"
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(vllm(expected))
    assert "preStop" in vllm(expected)["lifecycle"]


def test_every_replica_runs_the_connector_both_ways(pd: Rendered) -> None:
    for pool in POOLS:
        container = vllm(pd.workload(pool)["spec"]["template"])
        args = [str(a) for a in container["args"]]
        config = json.loads(args[args.index("--kv-transfer-config") + 1])
        assert config["kv_connector"] == "NixlConnector"
        assert config["kv_role"] == "kv_both"
        assert config["kv_load_failure_policy"] == "fail"


def test_nixl_env_ports_and_policy_agree(pd: Rendered) -> None:
    container = vllm(pd.workload("decode")["spec"]["template"])
    variables = env(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    side = int(variables["VLLM_NIXL_SIDE_CHANNEL_PORT"]["value"])
    assert ports["nixl-side"] == side
    # The decode pod connects to the address the prefill pod advertises: its own IP, never
    # vLLM's default (localhost).
    host = variables["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert host == "status.podIP"
    low, high = (int(x) for x in variables["UCX_TCP_PORT_RANGE"]["value"].split("-"))
    # pd-values.yaml is a GPU release: NIXL's UCX backend needs CUDA memory support there.
    assert variables["UCX_TLS"]["value"] == "tcp,cuda_copy,self"

    (policy,) = [
        p
        for p in pd.of_kind("NetworkPolicy")
        if p["metadata"]["labels"]["app.kubernetes.io/component"] == "server"
    ]
    labels = {pool: pd.workload(pool)["spec"]["template"]["metadata"]["labels"] for pool in POOLS}
    router_pod = {"app.kubernetes.io/name": "ministream", "app.kubernetes.io/instance": "ms"}
    router_pod["app.kubernetes.io/component"] = "router"
    for port in (side, low, high):
        assert admits(policy, labels["prefill"], port) and admits(policy, labels["decode"], port)
        assert not admits(policy, router_pod, port)
        assert not admits(policy, {"app": "other"}, port)
    assert not admits(policy, labels["prefill"], high + 1)
    assert not admits(policy, labels["prefill"], low - 1)


def test_one_budget_over_both_pools(pd: Rendered) -> None:
    (pdb,) = pd.serving("PodDisruptionBudget")
    match = pdb["spec"]["selector"]["matchLabels"]
    assert POOL_LABEL not in match
    for pool in POOLS:
        assert match.items() <= pd.workload(pool)["spec"]["template"]["metadata"]["labels"].items()


def test_alert_rules_match_the_pools_pods(tmp_path: Path) -> None:
    over = {"monitoring": {"prometheusRule": {"enabled": True}}}
    out = render(PD, write(tmp_path, over))
    pattern = up_alert_pods(out)
    for pool in POOLS:
        name = out.workload(pool)["metadata"]["name"]
        assert re.fullmatch(pattern, f"{name}-5d9c7b9f8-x2x7q")
    assert not re.fullmatch(pattern, "ms-ministream-router-5d9c7b9f8-x2x7q")


# ---------------------------------------------------------------- the router


def test_router_finds_each_pool_by_its_own_labels(pd: Rendered) -> None:
    args = router_args(pd)
    assert "--vllm-pd-disaggregation" in args and "--selector" not in args
    assert args[args.index("--kv-connector") + 1] == "nixl"
    for pool in POOLS:
        own = selector(args, f"--{pool}-selector")
        deployment = pd.workload(pool)
        assert own == deployment["spec"]["selector"]["matchLabels"]
        other = pd.workload("decode" if pool == "prefill" else "prefill")
        assert not own.items() <= other["spec"]["template"]["metadata"]["labels"].items()


def test_router_command_line_parses_with_vllm_routers_parser(pd: Rendered) -> None:
    tools.vllm_router()
    from vllm_router.launch_router import parse_router_args

    args = [a.replace("$(VLLM_API_KEY)", "k") for a in router_args(pd)]
    parsed = parse_router_args(args)
    assert parsed.vllm_pd_disaggregation and parsed.service_discovery
    assert parsed.prefill_selector == selector(args, "--prefill-selector")
    assert parsed.decode_selector == selector(args, "--decode-selector")
    assert parsed.kv_connector == "nixl"


# ---------------------------------------------------------------- refusals

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "without-router": ({"router": {"enabled": False}}, "needs router.enabled=true"),
    "autoscaled": (
        {"autoscaling": {"enabled": True, "keda": {"serverAddress": "http://prometheus:9090"}}},
        "autoscaling.enabled",
    ),
    "gateway": (
        {"gateway": {"enabled": True, "endpointPicker": {"serviceName": "epp"}}},
        "gateway.enabled",
    ),
    "multi-node": ({"parallelism": {"tensor": 16}}, "single-node replicas only"),
    "kv-offload": ({"vllm": {"kvOffload": {"sizeGiB": 4}}}, "vllm.kvOffload.sizeGiB"),
    "port-range": (
        {"disaggregation": {"nixl": {"ucxPortRange": {"start": 41000, "end": 40000}}}},
        "start (41000) must not exceed end (40000)",
    ),
    "gpu-without-cuda-transport": (
        {"disaggregation": {"nixl": {"ucxTransports": "tcp,self"}}},
        "unless cuda_copy (or cuda) is among the transports",
    ),
    "own-kv-transfer-config": (
        {"vllm": {"extraArgs": ["--kv-transfer-config", "{}"]}},
        "remove --kv-transfer-config from vllm.extraArgs",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_what_cannot_work_is_refused(tmp_path: Path, case: str) -> None:
    overrides, message = REFUSED[case]
    with pytest.raises(HelmError) as err:
        render(PD, write(tmp_path, overrides))
    assert message in str(err.value), str(err.value)


@pytest.mark.parametrize(
    ("accelerator", "transports", "rendered"),
    [
        ("cpu", None, "tcp,self"),
        ("gpu", None, "tcp,cuda_copy,self"),
        ("cpu", "tcp,self", "tcp,self"),
        ("gpu", "cuda_ipc,cuda_copy,tcp,self", "cuda_ipc,cuda_copy,tcp,self"),
        ("gpu", "", None),  # UCX's own choice: no UCX_TLS at all
    ],
)
def test_ucx_transports_default_by_accelerator(
    tmp_path: Path, accelerator: str, transports: str | None, rendered: str | None
) -> None:
    """Null ucxTransports takes the accelerator's default; a value is kept as given."""
    nixl = {"ucxTransports": transports}
    values = {"accelerator": {"type": accelerator}, "disaggregation": {"nixl": nixl}}
    release = render(PD, write(tmp_path, values))
    for pool in POOLS:
        variables = env(vllm(release.workload(pool)["spec"]["template"]))
        assert variables.get("UCX_TLS", {}).get("value") == rendered, (pool, variables)


def test_schema_refuses_an_unknown_connector(tmp_path: Path) -> None:
    with pytest.raises(HelmError) as err:
        render(PD, write(tmp_path, {"disaggregation": {"connector": "mooncake"}}))
    assert "/disaggregation/connector" in str(err.value)
