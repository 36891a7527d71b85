"""Assertions per concern on the objects every CI scenario renders.

Each test reads the rendered objects and the values the scenario set, and checks what the
chart must have derived (TP everywhere, startup budget) or the property a derived number
must have (the grace period covers the whole shutdown, read from the rendered pod).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, TypeVar

import pytest
from chartkit import CHART, HelmError, Rendered, render

from ministream_sidecar import client, engine_client
from ministream_testkit.stand_in_sidecar import stand_in_sidecar

SHARDED = {"shardedState", "runaiStreamerSharded"}
S3_MODES = {"runaiStreamer", "runaiStreamerSharded"}
T = TypeVar("T")
LOAD_FORMATS = {
    "local": None,
    "runaiStreamer": "runai_streamer",
    "shardedState": "sharded_state",
    "runaiStreamerSharded": "runai_streamer_sharded",
}


# ---------------------------------------------------------------- helpers


def need(value: T | None, what: str = "value") -> T:
    assert value is not None, f"missing {what}"
    return value


def pod_spec(rendered: Rendered) -> dict[str, Any]:
    return rendered.pod_template()["spec"]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    for c in spec.get("containers", []) + spec.get("initContainers", []):
        if c["name"] == name:
            return c
    raise AssertionError(f"no container {name!r}")


def arg(c: dict[str, Any], flag: str) -> str | None:
    args = c.get("args", c.get("command", []))
    return args[args.index(flag) + 1] if flag in args else None


def env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def env_value(c: dict[str, Any], name: str) -> str | None:
    e = env(c).get(name)
    return None if e is None else e.get("value")


def tp_of(values: dict[str, Any]) -> int:
    # parallelism.tensor, or its older name tensorParallelSize.
    return values["parallelism"]["tensor"] or values.get("tensorParallelSize") or 1


def ranks_per_pod(values: dict[str, Any]) -> int:
    """tensor x pipeline on one node, accelerator.perNode on each pod of a multi-node group."""
    world = tp_of(values) * values["parallelism"]["pipeline"]
    return min(world, values["accelerator"]["perNode"])


def shard_containers(rendered: Rendered) -> list[dict[str, Any]]:
    out = [
        c for job in rendered.of_kind("Job") for c in job["spec"]["template"]["spec"]["containers"]
    ]
    out += [c for c in pod_spec(rendered).get("initContainers", []) if c["name"] == "shard"]
    return out


def all_pod_specs(rendered: Rendered) -> list[dict[str, Any]]:
    specs = [pod_spec(rendered)]
    if rendered.of_kind("LeaderWorkerSet"):
        specs.append(rendered.pod_template("worker")["spec"])
    specs += [j["spec"]["template"]["spec"] for j in rendered.of_kind("Job")]
    specs += [p["spec"] for p in rendered.of_kind("Pod")]
    return specs


def mounted(c: dict[str, Any], path: str) -> bool:
    return any(
        path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        for m in c.get("volumeMounts", [])
    )


# ---------------------------------------------------------------- tensor parallel


def test_tp_drives_args_gpu_limit_shm_and_sidecar_info(rendered: Rendered, values: dict) -> None:
    tp = tp_of(values)
    spec = pod_spec(rendered)
    vllm = container(spec, "vllm")
    assert arg(vllm, "--tensor-parallel-size") == str(tp)
    limits = vllm["resources"].get("limits", {})
    if values["accelerator"]["type"] == "gpu":
        assert limits["nvidia.com/gpu"] == ranks_per_pod(values)
    else:
        assert not any("gpu" in k for k in limits), "CPU variant must not request accelerators"
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert shm["emptyDir"]["sizeLimit"] == (
        f"{ranks_per_pod(values) * values['scratch']['shmGiBPerRank']}Gi"
    )
    assert mounted(vllm, "/dev/shm")
    assert env_value(
        container(spec, "sidecar"), "MINISTREAM_SIDECAR_INFO_TENSOR_PARALLEL_SIZE"
    ) == str(tp)


def test_shard_preparation_uses_the_same_tp(rendered: Rendered, values: dict) -> None:
    mode, prepare = values["loading"]["mode"], values["loading"]["sharded"]["prepare"]["mode"]
    shards = shard_containers(rendered)
    if mode not in SHARDED or prepare == "none":
        assert not shards and not rendered.of_kind("Job")
        return
    assert len(shards) == 1
    (shard,) = shards
    tp = tp_of(values)
    assert shard["command"][:2] == ["ministream", "shard"]
    assert arg(shard, "--tensor-parallel-size") == str(tp)
    # It writes exactly what vLLM then serves.
    assert arg(shard, "--output") == arg(container(pod_spec(rendered), "vllm"), "--model")
    if prepare == "job":
        job = rendered.one("Job")
        hooks = job["metadata"]["annotations"]["helm.sh/hook"].split(",")
        assert set(hooks) == {"pre-install", "pre-upgrade"}
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        # A pre-install hook runs before the chart's ServiceAccount exists.
        assert "serviceAccountName" not in job["spec"]["template"]["spec"]
    else:
        init_names = [c["name"] for c in pod_spec(rendered)["initContainers"]]
        assert init_names.index("shard") < init_names.index("sidecar")


def test_default_shard_location_names_the_tp(rendered: Rendered, values: dict) -> None:
    model = need(arg(container(pod_spec(rendered), "vllm"), "--model"))
    if values["loading"]["mode"] in SHARDED and not values["loading"]["sharded"]["path"]:
        assert model.endswith(f"-tp{tp_of(values)}")
    elif values["loading"]["mode"] in SHARDED:
        assert model.endswith(values["loading"]["sharded"]["path"])


# ---------------------------------------------------------------- loading modes


def test_load_format_and_model_location(rendered: Rendered, values: dict) -> None:
    loading = values["loading"]
    vllm = container(pod_spec(rendered), "vllm")
    if rendered.of_kind("LeaderWorkerSet"):
        # A Ray head first, then the same module with the same args (test_chart_multinode.py).
        assert vllm["command"][-2].endswith('python3 -m vllm.entrypoints.openai.api_server "$@"')
    elif values["accelerator"]["type"] == "cpu":  # the CPU image's entrypoint: sizes, execs
        assert vllm["command"] == ["python3", "-m", "ministream_sidecar.serve_vllm"]
    else:
        assert vllm["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert arg(vllm, "--load-format") == LOAD_FORMATS[loading["mode"]]
    assert arg(vllm, "--served-model-name") == values["model"]["name"]
    assert arg(vllm, "--port") == "8000"
    assert arg(vllm, "--shutdown-timeout") == str(values["vllm"]["shutdownTimeoutSeconds"])
    # The preStop drain waits for vLLM's GET /load, which counts only with this flag.
    assert engine_client.LOAD_TRACKING_FLAG in vllm["args"]
    model = need(arg(vllm, "--model"))
    if loading["mode"] in S3_MODES:
        assert model.startswith(f"s3://{loading['s3']['bucket']}/")
        assert not mounted(vllm, loading["local"]["mountPath"])
    else:
        assert model.startswith(loading["local"]["mountPath"] + "/")
        mount = next(m for m in vllm["volumeMounts"] if m["name"] == "model")
        assert mount["readOnly"] is True
    if loading["mode"] == "runaiStreamer":
        extra = json.loads(need(arg(vllm, "--model-loader-extra-config")))
        assert extra == {
            "concurrency": loading["s3"]["concurrency"],
            "memory_limit": loading["s3"]["memoryLimit"],
        }
    else:
        # vLLM's sharded loaders reject any extra-config key but "pattern".
        assert arg(vllm, "--model-loader-extra-config") is None


def test_s3_settings_reach_vllm_and_shard_preparation(rendered: Rendered, values: dict) -> None:
    s3, mode = values["loading"]["s3"], values["loading"]["mode"]
    users = [container(pod_spec(rendered), "vllm"), *shard_containers(rendered)]
    for c in users:
        e = env(c)
        if mode not in S3_MODES:
            assert not any(n.startswith(("AWS_", "RUNAI_")) for n in e), c["name"]
            continue
        assert env_value(c, "AWS_ENDPOINT_URL") == env_value(c, "RUNAI_STREAMER_S3_ENDPOINT")
        assert env_value(c, "AWS_ENDPOINT_URL") == (s3["endpoint"] or None)
        assert env_value(c, "AWS_REGION") == s3["region"]
        assert env_value(c, "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING") == (
            "1" if s3["virtualAddressing"] else "0"
        )
        assert env_value(c, "RUNAI_STREAMER_CONCURRENCY") == str(s3["concurrency"])
        assert env_value(c, "RUNAI_STREAMER_MEMORY_LIMIT") == str(s3["memoryLimit"])
        if s3["credentials"]["existingSecret"]:
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                ref = e[name]["valueFrom"]["secretKeyRef"]
                assert ref["name"] == s3["credentials"]["existingSecret"]
            assert env_value(c, "AWS_EC2_METADATA_DISABLED") == "true"
        else:
            # Workload identity: no keys, instance metadata left on (GKE, EC2 identities).
            assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(e)
            assert "AWS_EC2_METADATA_DISABLED" not in e
            assert env_value(c, "RUNAI_STREAMER_NO_BOTO3_SESSION") == "0"
        ca = s3["caBundle"]
        if ca["configMapName"] or ca["secretName"]:
            bundle = need(env_value(c, "AWS_CA_BUNDLE"))
            assert bundle.endswith("/" + ca["key"]) and mounted(c, bundle)
        else:
            assert "AWS_CA_BUNDLE" not in e


def test_model_hash_pin_reaches_vllm_and_shard_preparation(
    rendered: Rendered, values: dict
) -> None:
    pinned = values["model"]["hash"] or None
    for c in [container(pod_spec(rendered), "vllm"), *shard_containers(rendered)]:
        assert env_value(c, "MINISTREAM_MODEL_HASH") == pinned, c["name"]
    sidecar = container(pod_spec(rendered), "sidecar")
    assert env_value(sidecar, "MINISTREAM_MODEL_HASH") is None


# ---------------------------------------------------------------- probes


def startup_budget(rendered: Rendered) -> int:
    """The budget the chart computed (one helper, `_budgets.tpl`), read from the comment it
    renders above the vLLM container's startupProbe: the tests never recompute the formula."""
    found = set(re.findall(r"# Budget (\d+) s = ", rendered.text))
    assert len(found) == 1, found
    return int(found.pop())


def test_startup_budget_is_the_probes_and_the_rollouts(rendered: Rendered) -> None:
    probe = container(pod_spec(rendered), "vllm")["startupProbe"]
    budget = startup_budget(rendered)
    assert probe["failureThreshold"] == math.ceil(budget / probe["periodSeconds"])
    for workload in rendered.workloads():
        if workload["kind"] == "Deployment":
            assert workload["spec"]["progressDeadlineSeconds"] >= budget


def test_startup_budget_follows_size_mode_and_sharding() -> None:
    """What the documented formula promises, as relations between renders: the budget grows
    with the weights, a streaming mode allows less per GiB than a local read, and only a
    sharded mode's budget shrinks with TP x PP (each rank reads its own share)."""

    def budget(mode: str, size: int, tp: int = 1, pp: int = 1) -> int:
        sets: dict[str, Any] = {
            "apiKey__existingSecret": "api-key",
            "loading__local__existingClaim": "models",
            "loading__mode": mode,
            "model__sizeGiB": size,
        }
        if mode in S3_MODES:
            sets["loading__s3__bucket"] = "models"
        if mode in SHARDED:
            sets["loading__sharded__prepare__mode"] = "none"  # shards made elsewhere
        return startup_budget(render(**sets, parallelism__tensor=tp, parallelism__pipeline=pp))

    for mode in ("local", "runaiStreamer", *sorted(SHARDED)):
        assert budget(mode, 8) < budget(mode, 16) < budget(mode, 64), mode
    assert budget("runaiStreamer", 64) < budget("local", 64)
    assert budget("local", 64, tp=4) == budget("local", 64)
    for mode in sorted(SHARDED):
        assert budget(mode, 64, tp=4) < budget(mode, 64, tp=2) < budget(mode, 64), mode
        assert budget(mode, 64, tp=2, pp=2) == budget(mode, 64, tp=4), mode


# ---------------------------------------------------------------- drain and grace


def prestop_command(spec: dict[str, Any]) -> list[str]:
    return list(container(spec, "vllm")["lifecycle"]["preStop"]["exec"]["command"])


def test_grace_period_covers_the_whole_shutdown(rendered: Rendered) -> None:
    """The kubelet never kills a pod that is still draining or finishing requests: the grace
    period covers the preStop hook's longest wait (the drain timeout it hands the client,
    plus the client's own HTTP slack) and vLLM's --shutdown-timeout after SIGTERM. Every
    number is read from the rendered pod and the client, none from values."""
    spec = pod_spec(rendered)
    sidecar, vllm = container(spec, "sidecar"), container(spec, "vllm")
    hook = prestop_command(spec)
    assert hook[:4] == ["python3", "-m", "ministream_sidecar.client", "drain"]
    hook_timeout = float(need(arg({"args": hook}, "--timeout")))
    # The hook waits as long as the sidecar's own drain may take, and no less.
    assert hook_timeout == float(
        need(env_value(sidecar, "MINISTREAM_SIDECAR_DRAIN_TIMEOUT_SECONDS"))
    )
    # The drain's minimum wait (endpoint propagation) is inside the drain timeout.
    assert float(need(env_value(sidecar, "MINISTREAM_SIDECAR_DRAIN_MIN_SECONDS"))) <= hook_timeout
    shutdown = float(need(arg(vllm, "--shutdown-timeout")))
    assert spec["terminationGracePeriodSeconds"] >= (
        hook_timeout + client.DRAIN_HTTP_SLACK_SECONDS + shutdown
    )


def test_default_grace_period_is_the_least_the_chart_accepts(scenario: Path, values: dict) -> None:
    """Left null, the grace period is the minimum: one second less is refused, naming it."""
    grace = pod_spec(render(scenario))["terminationGracePeriodSeconds"]
    if values["terminationGracePeriodSeconds"] is not None:
        assert grace == values["terminationGracePeriodSeconds"]
        return
    explicit = render(scenario, terminationGracePeriodSeconds=grace)
    assert pod_spec(explicit)["terminationGracePeriodSeconds"] == grace
    with pytest.raises(HelmError, match=f"terminationGracePeriodSeconds >= {grace}"):
        render(scenario, terminationGracePeriodSeconds=grace - 1)


def test_prestop_hook_drains_through_the_sidecar(tmp_path: Path) -> None:
    """The rendered hook, run as the kubelet would (python3 swapped for this interpreter, the
    image's own python3), POSTs /drain with the token and reports the sidecar's answer."""
    hook = prestop_command(pod_spec(render(CHART / "ci" / "local-tp1-values.yaml")))
    with stand_in_sidecar() as sidecar:
        proc = subprocess.run(
            [sys.executable, *hook[1:]],
            env={
                **os.environ,
                "MINISTREAM_SIDECAR_PORT": str(sidecar.port),
                "MINISTREAM_SIDECAR_TOKEN": "s3cret",
            },
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert proc.returncode == 0, proc.stderr
    assert sidecar.seen == [("POST", "/drain", "Bearer s3cret")]
    assert json.loads(proc.stdout)["drain"]["body"]["outcome"] == "idle"


def test_sidecar_outlives_vllm_during_drain(rendered: Rendered) -> None:
    """A native sidecar stops only after the main containers: /drain stays reachable."""
    spec = pod_spec(rendered)
    sidecar = container(spec, "sidecar")
    assert sidecar in spec["initContainers"] and sidecar["restartPolicy"] == "Always"
    assert sidecar["command"] == ["ministream-sidecar"]
    assert [c["name"] for c in spec["containers"]] == ["vllm"]


def test_sidecar_token_guards_drain(rendered: Rendered, values: dict) -> None:
    spec = pod_spec(rendered)
    secret = values["sidecar"]["token"]["existingSecret"]
    for c in (container(spec, "sidecar"), container(spec, "vllm")):
        e = env(c).get("MINISTREAM_SIDECAR_TOKEN")
        if secret:
            assert need(e)["valueFrom"]["secretKeyRef"]["name"] == secret
        else:
            assert e is None


# ---------------------------------------------------------------- secrets and security


def test_secrets_only_by_reference(rendered: Rendered, values: dict) -> None:
    assert not rendered.of_kind("Secret"), "the chart must never create Secrets"
    sensitive = re.compile(r"API_KEY|ACCESS_KEY|SECRET|TOKEN$|PASSWORD", re.I)
    for spec in all_pod_specs(rendered):
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for e in c.get("env", []):
                # *_REQUIRED are the sidecar's "refuse to start without it" switches.
                if sensitive.search(e["name"]) and not e["name"].endswith("_REQUIRED"):
                    assert "value" not in e, f"{c['name']}: {e['name']} set literally"
                    assert "secretKeyRef" in e["valueFrom"], e
    vllm = container(pod_spec(rendered), "vllm")
    if values["apiKey"]["enabled"]:
        ref = env(vllm)["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": values["apiKey"]["existingSecret"], "key": values["apiKey"]["key"]}
        sidecar_ref = env(container(pod_spec(rendered), "sidecar"))["MINISTREAM_SIDECAR_API_KEY"]
        assert sidecar_ref["valueFrom"]["secretKeyRef"] == ref
    else:
        assert "VLLM_API_KEY" not in env(vllm)


def test_security_context_hardened(rendered: Rendered) -> None:
    for spec in all_pod_specs(rendered):
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        assert not spec.get("hostNetwork") and not spec.get("hostPID")
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, c["name"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
            assert "add" not in sc["capabilities"], c["name"]
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, c["name"]
            assert not sc.get("privileged"), c["name"]


def test_every_writable_path_is_a_volume(rendered: Rendered) -> None:
    vllm = container(pod_spec(rendered), "vllm")
    for name in (
        "HOME",
        "HF_HOME",
        "VLLM_CACHE_ROOT",
        "TRITON_CACHE_DIR",
    ):
        path = env_value(vllm, name)
        assert path and mounted(vllm, path), f"{name}={path} is not on a mounted volume"
    assert mounted(vllm, "/tmp") and mounted(vllm, "/dev/shm")
    for c in [container(pod_spec(rendered), "sidecar"), *shard_containers(rendered)]:
        assert mounted(c, "/tmp"), c["name"]


def test_no_metrics_directory_outlives_a_vllm_restart(rendered: Rendered) -> None:
    """vLLM's multiprocess metrics directory must be fresh at every start (vLLM warns that a
    user-set one must be wiped between runs). The chart sets none, so vLLM makes its own
    temporary one when it needs one (`--api-server-count` > 1), under the per-container /tmp."""
    spec = pod_spec(rendered)
    for c in spec["containers"] + spec.get("initContainers", []):
        assert all(e["name"] != "PROMETHEUS_MULTIPROC_DIR" for e in c.get("env", [])), c["name"]
    assert all("prometheus" not in v["name"] for v in spec["volumes"])


def test_compile_cache_volume(rendered: Rendered, values: dict) -> None:
    vol = next(v for v in pod_spec(rendered)["volumes"] if v["name"] == "compile-cache")
    cc = values["persistence"]["compileCache"]
    if cc["enabled"]:
        claim = vol["persistentVolumeClaim"]["claimName"]
        if not cc["existingClaim"]:
            pvc = rendered.one("PersistentVolumeClaim")
            assert pvc["metadata"]["name"] == claim
            assert pvc["spec"]["accessModes"] == cc["accessModes"]
    else:
        assert "emptyDir" in vol and not rendered.of_kind("PersistentVolumeClaim")


def test_compile_cache_seed(rendered: Rendered, values: dict) -> None:
    """The seed runs before vLLM, with vLLM's environment, volumes and accelerators, into
    vLLM's cache root, checked against the model the server's weights come from."""
    seed = values["persistence"]["compileCache"]["seedArchive"]
    spec = pod_spec(rendered)
    inits = [c["name"] for c in spec.get("initContainers", [])]
    if not seed:
        assert "compile-cache-seed" not in inits
        return
    init, vllm = container(spec, "compile-cache-seed"), container(spec, "vllm")
    assert inits.index("compile-cache-seed") < inits.index("sidecar")
    command = init["command"]
    assert command[:3] == ["ministream", "compile-cache", "unpack"]
    args = dict(zip(command[3::2], command[4::2], strict=True))
    assert args["--archive"] == seed
    assert args["--cache-root"] == env_value(vllm, "VLLM_CACHE_ROOT")
    # The source model: what vLLM serves, or what its shards were made from.
    shards = shard_containers(rendered)
    source = shards[0]["command"] if shards else vllm["args"]
    assert args["--model"] == source[source.index("--model") + 1]
    assert all(e in vllm["env"] for e in init["env"])
    assert init["volumeMounts"] == [m for m in vllm["volumeMounts"] if m in init["volumeMounts"]]
    assert mounted(init, args["--cache-root"])
    if not seed.startswith("s3://"):
        assert mounted(init, seed)
    assert init["resources"] == vllm["resources"]  # the GPU, for nvidia-smi's name check


def test_service_account_token_only_in_sidecar(rendered: Rendered, values: dict) -> None:
    spec = pod_spec(rendered)
    sa_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert not mounted(container(spec, "vllm"), sa_path)
    assert mounted(container(spec, "sidecar"), sa_path) == values["sidecar"]["events"]["enabled"]
    sidecar_env = env(container(spec, "sidecar"))
    assert sidecar_env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert (
        sidecar_env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    )


def test_rbac_is_minimal_and_switchable(rendered: Rendered, values: dict) -> None:
    wanted = values["rbac"]["create"] and values["sidecar"]["events"]["enabled"]
    assert bool(rendered.of_kind("Role")) == wanted == bool(rendered.of_kind("RoleBinding"))
    if wanted:
        (rule,) = rendered.one("Role")["rules"]
        assert rule["resources"] == ["events"]
        assert sorted(rule["verbs"]) == ["create", "patch"]
        binding = rendered.one("RoleBinding")
        assert binding["roleRef"]["name"] == rendered.one("Role")["metadata"]["name"]
        assert binding["subjects"][0]["name"] == pod_spec(rendered)["serviceAccountName"]


# ---------------------------------------------------------------- rollout, service, labels


def test_rollout_mode(rendered: Rendered, values: dict) -> None:
    """The mode's preset, each field overridden by an explicit rollout.maxSurge/maxUnavailable."""
    workload = rendered.workload()
    if workload["kind"] == "LeaderWorkerSet":
        # The same preset, counted in groups.
        lws = workload["spec"]["rolloutStrategy"]
        strategy = {"type": lws["type"], "rollingUpdate": lws["rollingUpdateConfiguration"]}
    else:
        strategy = workload["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    expected = {
        "surge": {"maxSurge": 1, "maxUnavailable": 0},
        "inPlace": {"maxSurge": 0, "maxUnavailable": 1},
    }[values["rollout"]["mode"]]
    for key in expected:
        if values["rollout"][key] is not None:
            expected[key] = values["rollout"][key]
    assert strategy["rollingUpdate"] == expected


def serving_selector(rendered: Rendered) -> dict[str, str]:
    """The labels every serving pod carries: the one Deployment's selector, or what a P/D
    release's two pool selectors share (each adds its pool label)."""
    selectors = [d["spec"]["selector"]["matchLabels"] for d in rendered.workloads()]
    common = set.intersection(*(set(s.items()) for s in selectors))
    return dict(common)


def test_service_pdb_and_selectors(rendered: Rendered) -> None:
    if rendered.of_kind("LeaderWorkerSet"):
        pytest.skip("multi-node selectors: test_chart_multinode.py")
    selector = serving_selector(rendered)
    for deployment in rendered.workloads():
        own = deployment["spec"]["selector"]["matchLabels"]
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= own.items() <= pod_labels.items()
        assert not any("version" in k or k == "helm.sh/chart" for k in own), own
    service = rendered.one("Service")
    assert service["spec"]["selector"] == selector
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["http"]["port"] == 8000 and ports["http"]["targetPort"] == "http"
    assert ports["sidecar"]["port"] == 8081 and ports["sidecar"]["targetPort"] == 8081
    for pdb in rendered.serving("PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == selector
    # Other pods of the release (shard Job, test) must not count as serving pods.
    for spec_owner in rendered.of_kind("Job") + rendered.of_kind("Pod"):
        labels = (
            spec_owner.get("spec", {})
            .get("template", {})
            .get("metadata", {})
            .get("labels", spec_owner["metadata"]["labels"])
        )
        assert not selector.items() <= labels.items()


def test_names_fit_63_characters(scenario: Path) -> None:
    long = render(scenario, fullnameOverride="x" * 80)
    for doc in long.docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
    for doc in render(scenario).docs:
        for value in doc["metadata"].get("labels", {}).values():
            assert len(str(value)) <= 63


def test_network_policy(rendered: Rendered, values: dict) -> None:
    policies = rendered.serving("NetworkPolicy")
    assert bool(policies) == values["networkPolicy"]["enabled"]
    if rendered.of_kind("LeaderWorkerSet"):
        pytest.skip("multi-node policy (group ports): test_chart_multinode.py")
    expected = [8000, 8081]
    if values["disaggregation"]["enabled"]:
        # NIXL's side channel (the vLLM container's port) and UCX's first data port:
        # tests/charts/test_chart_pd.py checks whom they admit.
        vllm_ports = container(pod_spec(rendered), "vllm")["ports"]
        expected += [p["containerPort"] for p in vllm_ports if p["name"] == "nixl-side"]
        expected += [values["disaggregation"]["nixl"]["ucxPortRange"]["start"]]
    for policy in policies:
        ports = sorted({p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]})
        assert ports == sorted(expected)
        selector = serving_selector(rendered)
        assert policy["spec"]["podSelector"]["matchLabels"] == selector


# ---------------------------------------------------------------- monitoring


def test_monitoring_switches(rendered: Rendered, values: dict) -> None:
    m = values["monitoring"]
    assert bool(rendered.of_kind("ServiceMonitor")) == m["serviceMonitor"]["enabled"]
    assert bool(rendered.of_kind("PodMonitor")) == m["podMonitor"]["enabled"]
    assert bool(rendered.of_kind("PrometheusRule")) == m["prometheusRule"]["enabled"]
    assert bool(rendered.of_kind("ConfigMap")) == m["dashboards"]["enabled"]


def test_monitors_scrape_vllm_and_sidecar(rendered: Rendered) -> None:
    service = rendered.one("Service")
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for sm in rendered.serving("ServiceMonitor"):
        assert (
            sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        )
        ports = [e["port"] for e in sm["spec"]["endpoints"]]
        assert sorted(ports) == ["http", "sidecar"] and set(ports) <= service_ports
        assert {e["path"] for e in sm["spec"]["endpoints"]} == {"/metrics"}
    for pm in rendered.of_kind("PodMonitor"):
        endpoints = pm["spec"]["podMetricsEndpoints"]
        assert [e.get("port") or e.get("portNumber") for e in endpoints] == ["http", 8081]


def test_dashboards_configmap_holds_every_dashboard(rendered: Rendered) -> None:
    for cm in rendered.of_kind("ConfigMap"):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        # The router's dashboard only where the router runs (router.enabled).
        files = sorted(
            p.name
            for p in (CHART / "dashboards").glob("*.json")
            if p.name != "ministream-router.json"
        )
        assert sorted(cm["data"]) == files
        for name, text in cm["data"].items():
            assert json.loads(text)["title"], name


def test_prometheus_rule_groups_come_from_rule_files(rendered: Rendered) -> None:
    for rule in rendered.of_kind("PrometheusRule"):
        groups = rule["spec"]["groups"]
        assert groups and all(g["rules"] for g in groups)
        for g in groups:
            for r in g["rules"]:
                assert 'namespace="serving"' in r["expr"], r["expr"]
                assert "{{" not in r["expr"]


# ---------------------------------------------------------------- helm test


def test_helm_test_pod_lists_models_and_completes(rendered: Rendered, values: dict) -> None:
    (pod,) = rendered.of_kind("Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    script = c["command"][2]
    compile(script, "helm-test", "exec")
    assert "/v1/models" in script and "/v1/completions" in script
    service = rendered.one("Service")
    assert env_value(c, "BASE_URL") == (
        f"http://{service['metadata']['name']}.serving.svc:{values['service']['port']}"
    )
    assert env_value(c, "MODEL") == values["model"]["name"]
    assert ("API_KEY" in env(c)) == values["apiKey"]["enabled"]
