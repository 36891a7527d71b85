"""Multi-node serving: `parallelism.tensor` x `parallelism.pipeline` over
`accelerator.perNode`; one node keeps the Deployment, more render a LeaderWorkerSet whose
leader runs the Ray head, vLLM and the sidecar and whose workers join it as Ray nodes.

No cluster, no LWS controller and no Ray run here: the objects are checked as rendered, the
LeaderWorkerSet against the upstream CRD vendored in tests/charts/crds (crdkit.py), its pod
templates against the core Pod schema, and the vLLM command line by vLLM's own parser
(test_chart_contracts.py, every ci/ scenario).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import crdkit
import kubernetes_validate
import pytest
from chartkit import CHART, KUBE_VERSIONS, HelmError, Rendered, render, up_alert_pods

BASE = CHART / "ci" / "local-tp1-values.yaml"
MULTI = CHART / "ci" / "multinode-2x8-values.yaml"
KEDA = {"serverAddress": "http://prometheus.monitoring.svc:9090"}


def write(tmp_path: Path, overrides: dict[str, Any], name: str = "o.yaml") -> Path:
    """A values file; one name per content (chartkit caches renders by file name)."""
    path = tmp_path / name
    assert not path.exists(), f"{path} written twice: the render cache would return the first"
    path.write_text(json.dumps(overrides))  # JSON is YAML
    return path


def refused(*files: Path) -> str:
    with pytest.raises(HelmError) as err:
        render(*files)
    return str(err.value)


def containers(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = template["spec"]
    return {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}


def env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def volume(template: dict[str, Any], name: str) -> dict[str, Any]:
    return next(v for v in template["spec"]["volumes"] if v["name"] == name)


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions In) against pod labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        if labels.get(e["key"]) not in e["values"]:
            return False
    return True


@pytest.fixture(scope="module")
def multi() -> Rendered:
    return render(MULTI)


# ---------------------------------------------------------------- layout


def test_one_node_keeps_the_deployment() -> None:
    out = render(BASE)
    assert out.one("Deployment") and not out.of_kind("LeaderWorkerSet")
    args = out.pod_template()["spec"]["containers"][0]["args"]
    assert "--pipeline-parallel-size" not in args
    assert "--distributed-executor-backend" not in args


def test_pipeline_on_one_node_stays_a_deployment(tmp_path: Path) -> None:
    """tensor 4 x pipeline 2 = 8 fits one node of 8: one pod, 8 GPUs, vLLM's own executor."""
    out = render(
        BASE,
        write(tmp_path, {"tensorParallelSize": None, "parallelism": {"tensor": 4, "pipeline": 2}}),
    )
    assert not out.of_kind("LeaderWorkerSet")
    template = out.pod_template()
    vllm = containers(template)["vllm"]
    args = vllm["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    assert "--distributed-executor-backend" not in args
    assert vllm["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert volume(template, "dshm")["emptyDir"]["sizeLimit"] == "16Gi"  # 2 GiB x 8 ranks


def test_multi_node_renders_one_leaderworkerset_and_no_deployment(multi: Rendered) -> None:
    assert not multi.of_kind("Deployment")
    lws = multi.one("LeaderWorkerSet")
    spec = lws["spec"]
    assert spec["replicas"] == 2
    assert spec["leaderWorkerTemplate"]["size"] == 2  # 8 x 2 / 8
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    # inPlace preset, in groups.
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
    }
    # The LWS controller creates a headless Service named after the LWS: not the chart's.
    assert lws["metadata"]["name"] != multi.one("Service")["metadata"]["name"]


def test_leaderworkerset_validates_against_the_vendored_crd(multi: Rendered) -> None:
    assert crdkit.validate(multi.one("LeaderWorkerSet")) == []


def test_crd_check_catches_an_unknown_leaderworkerset_field(multi: Rendered) -> None:
    lws = json.loads(json.dumps(multi.one("LeaderWorkerSet")))
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    lws["spec"]["startupPolicy"] = "WorkersFirst"
    errors = "\n".join(crdkit.validate(lws))
    assert "sise" in errors and "WorkersFirst" in errors


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("role", ["leader", "worker"])
def test_group_pod_templates_are_valid_pods(multi: Rendered, role: str, kube_version: str) -> None:
    template = multi.pod_template(role)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]}}
    pod["spec"] = template["spec"]
    kubernetes_validate.validate(pod, kube_version, strict=True)


# ---------------------------------------------------------------- leader and workers


def test_leader_starts_a_ray_head_then_vllm(multi: Rendered) -> None:
    leader = multi.pod_template("leader")
    c = containers(leader)
    assert set(c) == {"vllm", "sidecar"}
    vllm = c["vllm"]
    shell, flag, script, arg0 = vllm["command"]
    assert (shell, flag, arg0) == ("sh", "-c", "vllm")
    head, _, serve = script.partition(" && ")
    assert shlex.split(head)[:4] == ["ray", "start", "--head", "--port=6379"]
    assert "--num-gpus=8" in head and '--node-ip-address="$VLLM_HOST_IP"' in head
    assert serve == 'exec python3 -m vllm.entrypoints.openai.api_server "$@"'
    args = vllm["args"]
    for flag, value in [
        ("--tensor-parallel-size", "8"),
        ("--pipeline-parallel-size", "2"),
        ("--distributed-executor-backend", "ray"),
    ]:
        assert args[args.index(flag) + 1] == value
    assert env(vllm)["VLLM_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # Readiness (warmup gate), liveness and the drain live on the leader.
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert vllm["startupProbe"]["httpGet"]["path"] == "/health"
    assert "ministream_sidecar.client" in vllm["lifecycle"]["preStop"]["exec"]["command"]
    assert c["sidecar"]["restartPolicy"] == "Always"


def test_workers_join_the_leaders_ray_head(multi: Rendered) -> None:
    worker = multi.pod_template("worker")
    c = containers(worker)
    assert set(c) == {"ray-worker"}
    ray = c["ray-worker"]
    assert ray["command"][:2] == ["sh", "-c"]
    wait, _, join = ray["command"][2].partition(" && ")
    assert 'ray health-check --address="$LWS_LEADER_ADDRESS:6379"' in wait
    assert shlex.split(join)[:4] == [
        "exec",
        "ray",
        "start",
        "--address=$LWS_LEADER_ADDRESS:6379",
    ]
    assert join.endswith("--block") and "--num-gpus=8" in join
    # No probes, no sidecar, no API key on the workers; they wait for the leader's drain.
    assert not {"readinessProbe", "livenessProbe", "startupProbe"} & set(ray)
    assert "VLLM_API_KEY" not in env(ray)
    stop = ray["lifecycle"]["preStop"]["exec"]["command"][2]
    assert "+ 90 ))" in stop  # drain 60 + vLLM shutdown 30
    assert "$LWS_LEADER_ADDRESS:6379" in stop
    leader_grace = multi.pod_template("leader")["spec"]["terminationGracePeriodSeconds"]
    assert worker["spec"]["terminationGracePeriodSeconds"] == leader_grace > 90


def test_every_pod_of_a_group_holds_one_node_of_accelerators(multi: Rendered) -> None:
    for role, name in (("leader", "vllm"), ("worker", "ray-worker")):
        template = multi.pod_template(role)
        limits = containers(template)[name]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 8, role
        # shmGiBPerRank 4 x 8 ranks on the pod.
        assert volume(template, "dshm")["emptyDir"]["sizeLimit"] == "32Gi", role


def test_workers_share_the_engines_environment_and_volumes(multi: Rendered) -> None:
    vllm = containers(multi.pod_template("leader"))["vllm"]
    ray = containers(multi.pod_template("worker"))["ray-worker"]
    # The leader's own: the API key vLLM serves with, and the startup log its sidecar reads.
    leader_only = {"VLLM_API_KEY", "MINISTREAM_SIDECAR_STARTUP_LOG"}
    assert {k: v for k, v in env(vllm).items() if k not in leader_only} == env(ray)
    assert [m for m in vllm["volumeMounts"] if m["name"] != "startup-log"] == ray["volumeMounts"]
    assert ray["image"] == vllm["image"]


@pytest.mark.parametrize(
    "loading",
    [
        {"mode": "runaiStreamer", "s3": {"bucket": "m", "credentials": {"existingSecret": "s3"}}},
        {"mode": "shardedState", "sharded": {"prepare": {"mode": "initContainer"}}},
        {"mode": "shardedState", "sharded": {"prepare": {"mode": "job"}}},
    ],
    ids=["runai-streamer", "sharded-init", "sharded-job"],
)
def test_every_loading_mode_reaches_every_rank(tmp_path: Path, loading: dict[str, Any]) -> None:
    """tensor 8 x pipeline 2 over two nodes; the sharded modes make a set for that layout."""
    out = render(MULTI, write(tmp_path, {"loading": loading}))
    assert out.one("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert crdkit.validate(out.one("LeaderWorkerSet")) == []
    vllm = containers(out.pod_template("leader"))
    ray = containers(out.pod_template("worker"))["ray-worker"]
    if loading["mode"] == "runaiStreamer":
        assert env(ray)["AWS_ACCESS_KEY_ID"] == env(vllm["vllm"])["AWS_ACCESS_KEY_ID"]
        assert "RUNAI_STREAMER_CONCURRENCY" in env(ray)
    else:
        assert {"name": "model", "mountPath": "/models", "readOnly": True} in ray["volumeMounts"]
        # Shards are prepared once per group, by the leader (or the Job), never by a worker.
        prepare = loading["sharded"]["prepare"]["mode"]
        assert ("shard" in vllm) == (prepare == "initContainer")
        assert bool(out.of_kind("Job")) == (prepare == "job")
        shard = vllm.get("shard") or out.one("Job")["spec"]["template"]["spec"]["containers"][0]
        made = shlex.join(shard["command"])
        assert "--tensor-parallel-size 8 --pipeline-parallel-size 2 --output /models/" in made
        # The set has a path of its own per layout, and vLLM serves that path.
        shards = shard["command"][shard["command"].index("--output") + 1]
        assert shards.endswith("-tp8-pp2") and shards in vllm["vllm"]["args"]


# ---------------------------------------------------------------- group placement

# Labels the LWS controller and its pod webhook put on every pod of a group (leader and
# workers), kubernetes-sigs/lws v0.10.0 api/leaderworkerset/v1/leaderworkerset_types.go:
# RevisionKey (per template revision, the Deployment's pod-template-hash counterpart) and
# GroupUniqueHashLabelKey (one value per group). pod-template-hash is set by Deployments only.
LWS_REVISION = "leaderworkerset.sigs.k8s.io/template-revision-hash"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-key"
LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def test_group_pods_spread_on_keys_lws_sets(multi: Rendered) -> None:
    """Leaders spread like the Deployment's pods (the chart's default constraints) but counted
    per LWS template revision; workers spread over hosts within their own group. No LWS pod
    carries a key only Deployments set, which would make its constraint count every revision."""
    deployment = render(BASE).pod_template()["spec"]["topologySpreadConstraints"]
    leader = multi.pod_template("leader")
    worker = multi.pod_template("worker")
    lead = leader["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in lead] == [c["topologyKey"] for c in deployment]
    for c in lead:
        assert c["matchLabelKeys"] == [LWS_REVISION], c
        assert c["labelSelector"]["matchLabels"].items() <= leader["metadata"]["labels"].items()
    (spread,) = worker["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["matchLabelKeys"] == [LWS_GROUP]
    assert matches(spread["labelSelector"], worker["metadata"]["labels"])
    assert matches(spread["labelSelector"], leader["metadata"]["labels"])
    assert crdkit.validate(multi.workload()) == []


def test_spreading_off_stays_off_for_groups(tmp_path: Path) -> None:
    out = render(MULTI, write(tmp_path, {"topologySpreadConstraints": []}))
    for role in ("leader", "worker"):
        assert "topologySpreadConstraints" not in out.pod_template(role)["spec"], role


def test_exclusive_topology_keeps_a_group_in_one_domain(multi: Rendered, tmp_path: Path) -> None:
    """multinode.exclusiveTopology becomes the LWS annotation its controller reads (one group
    per domain, all of a group's pods in it); unset, no annotation; the Deployment has none."""
    assert LWS_EXCLUSIVE not in multi.workload()["metadata"].get("annotations", {})
    over = {"multinode": {"exclusiveTopology": "topology.kubernetes.io/zone"}}
    out = render(MULTI, write(tmp_path, over))
    lws = out.workload()
    assert lws["metadata"]["annotations"][LWS_EXCLUSIVE] == "topology.kubernetes.io/zone"
    assert crdkit.validate(lws) == []
    one_node = render(BASE, write(tmp_path, over, "one-node.yaml")).workload()
    assert LWS_EXCLUSIVE not in one_node["metadata"].get("annotations", {})
    with pytest.raises(HelmError, match="exclusiveTopology"):
        render(MULTI, write(tmp_path, {"multinode": {"exclusiveTopology": "a b"}}, "bad.yaml"))


# ---------------------------------------------------------------- selection and policy


def test_service_monitors_and_pool_select_the_leaders_only(tmp_path: Path) -> None:
    over = {
        "gateway": {"enabled": True, "endpointPicker": {"serviceName": "epp"}},
        "networkPolicy": {"apiNamespaces": ["gateway"]},
    }
    out = render(MULTI, write(tmp_path, over))
    leader = out.pod_template("leader")["metadata"]["labels"]
    worker = out.pod_template("worker")["metadata"]["labels"]
    selectors = {
        "Service": {"matchLabels": out.one("Service")["spec"]["selector"]},
        "PodMonitor": out.one("PodMonitor")["spec"]["selector"],
        "InferencePool": out.one("InferencePool")["spec"]["selector"],
    }
    for kind, selector in selectors.items():
        assert matches(selector, leader), kind
        assert not matches(selector, worker), kind
    assert crdkit.validate(out.one("InferencePool")) == []


def test_pdb_and_network_policy_cover_the_whole_group(multi: Rendered) -> None:
    leader = multi.pod_template("leader")["metadata"]["labels"]
    worker = multi.pod_template("worker")["metadata"]["labels"]
    pdb = multi.one("PodDisruptionBudget")["spec"]["selector"]
    policy = multi.one("NetworkPolicy")["spec"]
    for selector in (pdb, policy["podSelector"]):
        assert matches(selector, leader) and matches(selector, worker)
    # The shard Job's and the test pod's labels are not group pods.
    for pod in multi.of_kind("Pod"):
        assert not matches(pdb, pod["metadata"]["labels"])
    # Between the group's pods every port is open (Ray's and NCCL's random ports): a rule
    # without `ports` whose peers are exactly the group's pods.
    (group,) = [r for r in policy["ingress"] if "ports" not in r]
    (peer,) = group["from"]
    assert matches(peer["podSelector"], leader) and matches(peer["podSelector"], worker)
    assert "namespaceSelector" not in peer


@pytest.mark.parametrize("engine", ["keda", "hpa"])
def test_autoscalers_scale_the_leaderworkerset_in_groups(tmp_path: Path, engine: str) -> None:
    keda = {"keda": KEDA} if engine == "keda" else {}
    over = {"autoscaling": {"enabled": True, "engine": engine, "maxReplicas": 3, **keda}}
    out = render(MULTI, write(tmp_path, over, f"{engine}.yaml"))
    lws = out.one("LeaderWorkerSet")
    assert "replicas" not in lws["spec"]
    scaler = out.one({"keda": "ScaledObject", "hpa": "HorizontalPodAutoscaler"}[engine])
    assert scaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": lws["metadata"]["name"],
    }
    for doc in out.docs:
        if doc["kind"] in crdkit.KINDS:
            assert crdkit.validate(doc) == [], doc["kind"]


def test_alert_rules_count_the_leaders_only(tmp_path: Path) -> None:
    """vLLM's metrics come from the leaders "<lws>-<group>"; workers ("-<i>") have none."""
    over = {"monitoring": {"prometheusRule": {"enabled": True}}}
    out = render(MULTI, write(tmp_path, over))
    pattern = up_alert_pods(out)
    name = out.one("LeaderWorkerSet")["metadata"]["name"]
    assert re.fullmatch(pattern, f"{name}-0")
    assert re.fullmatch(pattern, f"{name}-12")
    assert not re.fullmatch(pattern, f"{name}-0-1")


# ---------------------------------------------------------------- refused layouts and the alias


BAD_LAYOUTS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "not-a-multiple-of-per-node": (
        {"parallelism": {"tensor": 12, "pipeline": 1}},
        ["tensor (12) x pipeline (1) = 12", "not a multiple of it", "accelerator.perNode=8"],
    ),
    "pipeline-breaks-the-multiple": (
        {"parallelism": {"tensor": 4, "pipeline": 3}},
        ["= 12 accelerators", "multiple of 8"],
    ),
    "multi-node-on-cpu": (
        {"accelerator": {"type": "cpu"}},
        ["needs 2 nodes", "accelerator.type=gpu"],
    ),
    "alias-disagrees": (
        {"tensorParallelSize": 4},
        ["parallelism.tensor (8) and tensorParallelSize (4) disagree"],
    ),
    "pipeline-zero": ({"parallelism": {"pipeline": 0}}, ["pipeline"]),
    "per-node-zero": ({"accelerator": {"perNode": 0}}, ["perNode"]),
    "pipeline-flag-in-extra-args": ({"vllm": {"extraArgs": ["-pp", "2"]}}, ["extraArgs"]),
    "long-pipeline-flag-in-extra-args": (
        {"vllm": {"extraArgs": ["--pipeline-parallel-size=2"]}},
        ["extraArgs"],
    ),
    "executor-flag-in-extra-args": (
        {"vllm": {"extraArgs": ["--distributed-executor-backend", "mp"]}},
        ["extraArgs"],
    ),
}


@pytest.mark.parametrize(("overrides", "words"), BAD_LAYOUTS.values(), ids=BAD_LAYOUTS.keys())
def test_bad_layouts_are_refused(tmp_path: Path, overrides: dict, words: list[str]) -> None:
    message = refused(MULTI, write(tmp_path, overrides))
    for word in words:
        assert word in message, message


def test_the_old_tp_key_is_an_alias(tmp_path: Path) -> None:
    old = render(BASE, write(tmp_path, {"tensorParallelSize": 4}, "old.yaml"))
    new = render(
        BASE,
        write(tmp_path, {"tensorParallelSize": None, "parallelism": {"tensor": 4}}, "new.yaml"),
    )
    both = render(
        BASE, write(tmp_path, {"tensorParallelSize": 4, "parallelism": {"tensor": 4}}, "both.yaml")
    )
    assert old.docs == new.docs == both.docs
    # ... up to multi-node: the old key alone lays out a group too.
    group = render(
        MULTI,
        write(tmp_path, {"tensorParallelSize": 16, "parallelism": {"tensor": None}}, "g.yaml"),
    )
    assert group.one("LeaderWorkerSet")["spec"]["leaderWorkerTemplate"]["size"] == 4


def test_sharded_modes_take_the_tp_under_either_name(tmp_path: Path) -> None:
    for name, tp in (
        ("a.yaml", {"parallelism": {"tensor": 2}}),
        ("b.yaml", {"tensorParallelSize": 2}),
    ):
        over = {"tensorParallelSize": None, "loading": {"mode": "shardedState"}, **tp}
        out = render(BASE, write(tmp_path, over, name))
        args = out.pod_template()["spec"]["containers"][0]["args"]
        assert args[args.index("--model") + 1].endswith("-tp2")
