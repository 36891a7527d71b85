"""The bad-release experiment, CI-sized: one replica of the tiny model (real vLLM CPU + the real
sidecar) behind real HAProxy under streaming load, upgraded to a release whose engine crashes
at start (`--max-model-len` above the model's limit), then rolled back.

One bad kind, the shortest stall (`--stall-seconds 0`: the stall ends at the new pod's first
failed start, not at the progress deadline) and a 10 s drain timeout on the bad pod's way out:
about 25 s of engine start for the old pod and one failed start of the new one. The three
kinds, each stalled for the whole progress deadline, are `make bench-bad-release`
(docs/benchmarks.md). The rules without engines (bad templates, the crash-loop back-off) are
tested at the end.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from ministream_loadtest.bad_release import (
    BACKOFF_INITIAL_SECONDS,
    CrashLoop,
    bad_template,
)
from ministream_loadtest.chart_pod import LOCAL_RUN_VALUES
from ministream_loadtest.fleet import Pod, PodTemplate
from ministream_loadtest.haproxy import Slot
from ministream_loadtest.kube_play import pod_manifest
from ministream_loadtest.podman_fleet import template_values
from ministream_sidecar.processes import Child
from ministream_testkit.helm import render
from tests.loadtest.test_loadtest_rollout import CHART, run_experiment

DRAIN_TIMEOUT = {"sidecar.drainTimeoutSeconds": 10}


def rendered_deployment(sets: dict[str, Any]) -> dict[str, Any]:
    docs = render(CHART, (), {**LOCAL_RUN_VALUES, **sets})
    return next(d for d in docs if d["kind"] == "Deployment")


@pytest.fixture(scope="module")
def crash(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    output = tmp_path_factory.mktemp("bad-release") / "bad-release.json"
    args = ["--replicas", "1", "--kind", "crash", "--stall-seconds", "0", "--rate", "4"]
    args += ["--lead-in", "3", "--tail", "3"]
    args += [f"--chart-set={k}={json.dumps(v)}" for k, v in DRAIN_TIMEOUT.items()]
    report, stdout = run_experiment("bad-release", tiny_model_dir, output, args, timeout=1800)
    report["_stdout"] = stdout
    return report


@pytest.mark.engine
@pytest.mark.network
@pytest.mark.timeout(1900)
def test_a_crashing_release_stalls_and_rolls_back_without_a_failed_request(
    crash: dict[str, Any],
) -> None:
    report = crash
    (release,) = report["bad_releases"]
    assert report["sent"] > 0 and report["failed"] == 0, report["failures"]
    # Load ran through the stall and the rollback, and none of it failed.
    assert release["stall"]["sent"] > 0 and release["stall"]["failed"] == 0
    assert release["rollback"]["sent"] > 0 and release["rollback"]["failed"] == 0
    # The new pod crashed, was never in service, and the stall ended at its failure.
    assert not release["became_ready"]
    assert release["failed_starts"] >= 1 and release["first_failed_start_s"] > 0
    assert release["stall_observed_s"] >= release["first_failed_start_s"]
    assert not release["progress_deadline_replayed"]
    # The crash is the one the release was made to have: vLLM refused the max-model-len.
    log_dir = Path(report["artifacts_dir"]) / "pods"
    vllm_log = (log_dir / f"{release['pod']}-vllm.log").read_text(errors="replace")
    assert "max_model_len" in vllm_log.replace("max-model-len", "max_model_len")
    # The deadline is the rendered Deployment's, with the run's chart values.
    deployment = rendered_deployment(DRAIN_TIMEOUT)
    assert release["progress_deadline_s"] == deployment["spec"]["progressDeadlineSeconds"]
    # The old pod served throughout: never left the load balancer, same vLLM process.
    assert release["old_pods_lb_changes"] == []
    assert list(release["old_pods_served"]) == ["v1-0"] and release["old_pods_served"]["v1-0"] > 0
    assert report["old_pods"]["v1-0"]["vllm_running_at_end"]
    assert report["goal_met"] is True
    assert "crash" in report["_stdout"]  # the table names the kind


# --- rules, no engines ------------------------------------------------------------------------
def _template(model: Path) -> PodTemplate:
    return PodTemplate(
        model=str(model),
        served_name="m",
        vllm_args=("--max-model-len", "64"),
        chart=None,  # type: ignore[arg-type]  # bad_template does not read the chart
        log_dir=model.parent / "logs",
    )


def test_bad_templates_change_what_the_upgrade_changes(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 77}))
    good = _template(model)
    missing = bad_template("missing-model", good, None)
    assert not Path(missing.model).exists() and missing.vllm_args == good.vllm_args
    crash = bad_template("crash", good, None)
    # Last on the line (vLLM takes the last of a repeated flag), above the model's limit.
    assert crash.vllm_args[-2:] == ("--max-model-len", "154") and crash.model == good.model
    shards = tmp_path / "shards"
    shards.mkdir()
    wrong = bad_template("wrong-tp", good, str(shards))
    assert wrong.model == str(shards)
    assert wrong.vllm_args[-2:] == ("--load-format", "sharded_state")


def test_bad_templates_name_what_is_missing(tmp_path: Path) -> None:
    good = _template(tmp_path / "model")
    with pytest.raises(ValueError, match=r"--shards DIR.*ministream shard"):
        bad_template("wrong-tp", good, None)
    with pytest.raises(ValueError, match="no such directory"):
        bad_template("wrong-tp", good, str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        bad_template("crash", good, None)


def test_the_crash_loop_restarts_with_the_kubelets_back_off(tmp_path: Path) -> None:
    pod = Pod("bad", Slot(0, 1, 2), _template(tmp_path / "model"))
    (tmp_path / "logs").mkdir()
    fail = [sys.executable, "-c", "raise SystemExit(3)"]
    pod.vllm = Child("vLLM", fail, {}).start(tmp_path / "logs" / "first.log")
    pod.vllm.proc.wait(30)  # type: ignore[union-attr]
    loop = CrashLoop(pod)
    loop.poll(100.0)  # the exit is seen
    assert loop.failed_starts == [100.0]
    first = pod.vllm
    loop.poll(100.0 + BACKOFF_INITIAL_SECONDS - 0.1)  # still backing off
    assert pod.vllm is first
    loop.poll(100.0 + BACKOFF_INITIAL_SECONDS)  # restarted, same command
    assert pod.vllm is not first and pod.vllm.argv == fail
    pod.vllm.proc.wait(30)  # type: ignore[union-attr]
    loop.poll(200.0)
    assert loop.failed_starts == [100.0, 200.0]
    assert loop.restart_at == 200.0 + 2 * BACKOFF_INITIAL_SECONDS  # doubled
    assert (tmp_path / "logs" / "bad-vllm-1.log").exists()


def test_podman_renders_each_bad_release_into_the_charts_pod(tmp_path: Path) -> None:
    """`--runtime podman`: each bad template reaches the rendered pod through the chart's values
    (what `helm upgrade` would render), and the pod does not restart itself (the experiment
    replays the kubelet's back-off). Real helm; no podman needed."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 77}))
    shards = tmp_path / "shards-tp2"
    shards.mkdir()
    good = _template(model)

    def rendered_vllm(template: PodTemplate) -> tuple[list[str], str, dict[str, Any]]:
        deployment = rendered_deployment(template_values(template))
        manifest = pod_manifest(deployment, "bad", restart_policy="Never")
        for folder in manifest.memory_dirs:  # made for podman; not run here
            shutil.rmtree(folder)
        volume = next(v for v in manifest.pod["spec"]["volumes"] if v["name"] == "model")
        vllm = manifest.container("vllm")
        return [*vllm.get("command", []), *vllm["args"]], volume["hostPath"]["path"], manifest.pod

    def flag(args: list[str], name: str) -> str:
        return args[len(args) - 1 - args[::-1].index(name) + 1]  # the last one wins in vLLM

    args, host, pod = rendered_vllm(good)
    assert flag(args, "--model").endswith("/model") and host == str(tmp_path)
    assert pod["spec"]["restartPolicy"] == "Never"
    args, host, _ = rendered_vllm(bad_template("missing-model", good, None))
    assert flag(args, "--model").endswith("/model-missing") and host == str(tmp_path)
    args, host, _ = rendered_vllm(bad_template("wrong-tp", good, str(shards)))
    assert flag(args, "--model").endswith("/shards-tp2") and host == str(tmp_path)
    assert flag(args, "--load-format") == "sharded_state"
    args, _, _ = rendered_vllm(bad_template("crash", good, None))
    assert flag(args, "--max-model-len") == "154" and flag(args, "--model").endswith("/model")
