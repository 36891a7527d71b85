"""vLLM's router in front of the serving pods (`router.enabled`): the objects it needs, as
rendered, checked against the API schemas (kubernetes-validate, the vendored HTTPRoute CRD, the
prometheus-operator models) and against each other: the router finds the very pods the
serving workload runs, may read pods and nothing else, is hardened like them, and the
serving pods' NetworkPolicy lets it in on 8000.

No Kubernetes API server runs here: the router's pod watch cannot be exercised, so the test
reads the selector it is given and compares it with the pods' labels. Its command line is
parsed by vllm-router's own argument parser (the `router` extra; a missing wheel fails with
the hint that installs it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import crdkit
import kubernetes_validate
import pytest
from chartkit import CHART, KUBE_VERSIONS, NAMESPACE, HelmError, Rendered, admits, render
from test_chart_scenarios import validate_monitoring

from tests.support import tools

BASE = CHART / "ci" / "local-tp1-values.yaml"
MULTI = CHART / "ci" / "multinode-2x8-values.yaml"
ROUTER = CHART / "ci" / "router-values.yaml"


def write(tmp_path: Path, overrides: dict[str, Any], name: str = "o.yaml") -> Path:
    """A values file; one name per content (chartkit caches renders by file name)."""
    path = tmp_path / name
    assert not path.exists(), f"{path} written twice: the render cache would return the first"
    path.write_text(json.dumps(overrides))  # JSON is YAML
    return path


def component(rendered: Rendered, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        d
        for d in rendered.of_kind(kind)
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == name
    ]


def router_deployment(rendered: Rendered) -> dict[str, Any]:
    (found,) = component(rendered, "Deployment", "router")
    return found


def router_container(rendered: Rendered) -> dict[str, Any]:
    (container,) = router_deployment(rendered)["spec"]["template"]["spec"]["containers"]
    return container


def selector_arg(args: list[str]) -> dict[str, str]:
    """The `--selector key=value ...` words of vllm-router's command line."""
    start = args.index("--selector") + 1
    words = []
    for word in args[start:]:
        if word.startswith("--"):
            break
        words.append(word)
    return dict(w.split("=", 1) for w in words)


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def pod_labels(rendered: Rendered, role: str = "leader") -> dict[str, str]:
    labels: dict[str, str] = rendered.pod_template(role)["metadata"]["labels"]
    return labels


@pytest.fixture(scope="module")
def routed() -> Rendered:
    return render(ROUTER)


# ---------------------------------------------------------------- switch and schemas


def test_off_by_default_renders_nothing_of_the_router() -> None:
    out = render(BASE)
    assert not [d for d in out.docs if d["metadata"]["name"].endswith("-router")]
    assert "router" not in out.text.lower().replace("httproute", "")


def test_on_renders_every_piece_once(routed: Rendered) -> None:
    names = {
        (d["kind"], d["metadata"]["name"])
        for d in routed.docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "router"
    }
    name = "ms-ministream-router"
    assert names == {
        (kind, name)
        for kind in (
            "Deployment",
            "Service",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "ServiceMonitor",
        )
    }


def test_router_objects_validate_against_the_schemas(routed: Rendered) -> None:
    for doc in routed.docs:
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            assert validate_monitoring(doc) == [], doc["kind"]
        elif doc["kind"] in crdkit.KINDS:
            assert crdkit.validate(doc) == [], doc["kind"]
        else:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_schema_refuses_an_unknown_policy(tmp_path: Path) -> None:
    with pytest.raises(HelmError) as err:
        render(ROUTER, write(tmp_path, {"router": {"policy": "least_busy"}}))
    assert "/router/policy" in str(err.value) and "cache_aware" in str(err.value)


def test_schema_refuses_a_managed_flag_in_extra_args(tmp_path: Path) -> None:
    with pytest.raises(HelmError) as err:
        render(ROUTER, write(tmp_path, {"router": {"extraArgs": ["--policy=random"]}}))
    assert "/router/extraArgs/0" in str(err.value)


def test_every_policy_of_the_schema_is_one_vllm_router_accepts() -> None:
    """The schema's enum against the installed wheel's own choices (router extra)."""
    tools.vllm_router()
    from vllm_router.launch_router import parse_router_args

    schema = json.loads((CHART / "values.schema.json").read_text())
    for policy in schema["properties"]["router"]["properties"]["policy"]["enum"]:
        assert parse_router_args(["--policy", policy]).policy == policy


# ---------------------------------------------------------------- finding the replicas


def test_selector_is_the_serving_pods_own(routed: Rendered) -> None:
    args = router_container(routed)["args"]
    selector = selector_arg(args)
    deployment = routed.workload()
    assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels(routed).items()
    assert flag(args, "--service-discovery-port") == "8000"
    assert flag(args, "--service-discovery-namespace") == NAMESPACE
    assert "--service-discovery" in args and "--worker-urls" not in args
    # The router's own pods never match: it must not route to itself.
    router_pod = router_deployment(routed)["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= router_pod.items()


def test_multinode_routes_to_leaders_only(tmp_path: Path) -> None:
    out = render(MULTI, write(tmp_path, {"router": {"enabled": True}}))
    selector = selector_arg(router_container(out)["args"])
    assert selector.items() <= pod_labels(out, "leader").items()
    assert not selector.items() <= pod_labels(out, "worker").items()


def test_policy_and_knobs_reach_the_command_line(tmp_path: Path) -> None:
    knobs = {
        "policy": "round_robin",
        "requestTimeoutSeconds": 123,
        "healthCheck": {"intervalSeconds": 7, "failureThreshold": 4},
        "retries": {"maxRetries": 2},
        "circuitBreaker": {"failureThreshold": 6, "timeoutSeconds": 45},
        "extraArgs": ["--log-level", "debug"],
    }
    args = router_container(render(ROUTER, write(tmp_path, {"router": knobs})))["args"]
    assert flag(args, "--policy") == "round_robin"
    assert flag(args, "--request-timeout-secs") == "123"
    assert flag(args, "--health-check-interval-secs") == "7"
    assert flag(args, "--health-failure-threshold") == "4"
    assert flag(args, "--retry-max-retries") == "2"
    assert flag(args, "--cb-failure-threshold") == "6"
    assert flag(args, "--cb-timeout-duration-secs") == "45"
    assert args[-2:] == ["--log-level", "debug"]


def test_command_line_parses_with_vllm_routers_parser(routed: Rendered) -> None:
    tools.vllm_router()
    from vllm_router.launch_router import parse_router_args

    container = router_container(routed)
    args = [a.replace("$(VLLM_API_KEY)", "k") for a in container["args"]]
    parsed = parse_router_args(args)
    assert parsed.service_discovery and parsed.service_discovery_port == 8000
    assert parsed.selector == selector_arg(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert (parsed.port, parsed.prometheus_port) == (ports["http"], ports["metrics"])
    assert parsed.host == parsed.prometheus_host == "0.0.0.0"


# ---------------------------------------------------------------- permissions and hardening


def test_role_only_reads_pods(routed: Rendered) -> None:
    (role,) = component(routed, "Role", "router")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    (binding,) = component(routed, "RoleBinding", "router")
    spec = router_deployment(routed)["spec"]["template"]["spec"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": NAMESPACE}
    ]
    # The serving pods keep their own account: the pod-reading Role is not theirs.
    assert routed.pod_template()["spec"]["serviceAccountName"] != spec["serviceAccountName"]


def test_router_is_hardened_like_the_serving_pods(routed: Rendered) -> None:
    spec = router_deployment(routed)["spec"]["template"]["spec"]
    serving = routed.pod_template()["spec"]
    assert spec["securityContext"] == serving["securityContext"]
    (vllm,) = [c for c in serving["containers"] if c["name"] == "vllm"]
    sc = router_container(routed)["securityContext"]
    assert sc == vllm["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_api_key_comes_from_the_same_secret(routed: Rendered) -> None:
    container = router_container(routed)
    (vllm,) = [c for c in routed.pod_template()["spec"]["containers"] if c["name"] == "vllm"]
    key = {e["name"]: e for e in vllm["env"]}["VLLM_API_KEY"]
    assert {e["name"]: e for e in container["env"]}["VLLM_API_KEY"] == key
    assert flag(container["args"], "--api-key") == "$(VLLM_API_KEY)"


def test_without_api_key_the_router_gets_none(tmp_path: Path) -> None:
    out = render(ROUTER, write(tmp_path, {"apiKey": {"enabled": False}}))
    container = router_container(out)
    assert "--api-key" not in container["args"] and "env" not in container


# ---------------------------------------------------------------- network, budget, scrape


def test_serving_policy_admits_the_router_on_8000_only(tmp_path: Path) -> None:
    # apiFrom names a gateway only: without the router's own rule it could not reach vLLM.
    gateway = [{"podSelector": {"matchLabels": {"app": "gateway"}}}]
    probes = [{"podSelector": {"matchLabels": {"app": "prober"}}}]
    policy = {"apiFrom": gateway, "sidecarFrom": probes}
    out = render(ROUTER, write(tmp_path, {"networkPolicy": policy}))
    (serving,) = component(out, "NetworkPolicy", "server")
    router_pod = router_deployment(out)["spec"]["template"]["metadata"]["labels"]
    assert admits(serving, router_pod, 8000)
    assert not admits(serving, router_pod, 8081)
    (own,) = component(out, "NetworkPolicy", "router")
    assert own["spec"]["podSelector"]["matchLabels"].items() <= router_pod.items()
    assert admits(own, {"app": "gateway"}, 8000)
    assert not admits(own, {"app": "other"}, 8000)


def test_without_router_the_serving_policy_does_not_name_it(tmp_path: Path) -> None:
    gateway = [{"podSelector": {"matchLabels": {"app": "gateway"}}}]
    out = render(BASE, write(tmp_path, {"networkPolicy": {"apiFrom": gateway}}))
    (serving,) = out.of_kind("NetworkPolicy")
    routed = render(ROUTER, write(tmp_path, {}, "r.yaml"))
    router_pod = router_deployment(routed)["spec"]["template"]["metadata"]["labels"]
    assert not admits(serving, router_pod, 8000)


def test_service_and_monitor_reach_the_router_ports(routed: Rendered) -> None:
    (service,) = component(routed, "Service", "router")
    pod = router_deployment(routed)["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for p in router_container(routed)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports
    (monitor,) = component(routed, "ServiceMonitor", "router")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


def test_budget_only_with_more_than_one_router(tmp_path: Path, routed: Rendered) -> None:
    (pdb,) = component(routed, "PodDisruptionBudget", "router")
    pod = router_deployment(routed)["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod.items()
    one = render(ROUTER, write(tmp_path, {"router": {"replicas": 1}}))
    assert not component(one, "PodDisruptionBudget", "router")


# ---------------------------------------------------------------- the route


def test_route_points_at_the_router_or_the_pool(tmp_path: Path) -> None:
    route = {"httpRoute": {"enabled": True, "parentRefs": [{"name": "gw"}]}}
    out = render(ROUTER, write(tmp_path, {"gateway": route}))
    (backend,) = out.one("HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    (service,) = component(out, "Service", "router")
    assert backend == {
        "kind": "Service",
        "name": service["metadata"]["name"],
        "port": next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http"),
    }
    assert crdkit.validate(out.one("HTTPRoute")) == []
    pool = {"enabled": True, "endpointPicker": {"serviceName": "epp"}, **route}
    kept = render(ROUTER, write(tmp_path, {"gateway": pool, "router": {"expose": False}}, "p.yaml"))
    (backend,) = kept.one("HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    assert backend["kind"] == "InferencePool"


@pytest.mark.parametrize("major", [3, 4])
def test_route_without_any_backend_is_refused(tmp_path: Path, major: int) -> None:
    route = {"httpRoute": {"enabled": True, "parentRefs": [{"name": "gw"}]}}
    with pytest.raises(HelmError) as err:
        values = {"gateway": route, "router": {"expose": False}}
        render(ROUTER, write(tmp_path, values), major=major)
    # Both helms name the value to set: an if/else in the schema (an anyOf would leave helm 3
    # naming whichever branch it scored best, helm 4 both).
    message = str(err.value)
    assert "gateway.enabled" in message or "/gateway/enabled" in message, message


def test_cache_aware_gets_the_render_endpoints_it_tokenizes_through(tmp_path: Path) -> None:
    """vLLM answers /v1/completions/render 403 without --enable-scale-out: cache_aware would
    then decide every request on `missing_tokens`."""

    def vllm_args(out: Rendered) -> list[str]:
        (vllm,) = [c for c in out.pod_template()["spec"]["containers"] if c["name"] == "vllm"]
        return [str(a) for a in vllm["args"]]

    assert "--enable-scale-out" in vllm_args(render(ROUTER))
    other = render(ROUTER, write(tmp_path, {"router": {"policy": "round_robin"}}))
    assert "--enable-scale-out" not in vllm_args(other)
    assert "--enable-scale-out" not in vllm_args(render(CHART / "ci" / "local-tp1-values.yaml"))
