"""One LeaderWorkerSet group on one machine: the chart's own Ray commands start two Ray nodes
on two loopback addresses, as the group's two pods would, and vLLM serves across them with its
Ray executor (TP=2, one rank per node), the real sidecar in front of it.

- The commands are the ones `helm template` renders for a 2-node layout (tensor 2, one rank
  per node): the leader's `ray start --head ... && exec python3 -m vllm...` and the worker's
  wait-for-the-head-then-`ray start --block`. Translated for one machine, and nothing else:
  the head's port (6379 in the chart) becomes a free one; `VLLM_HOST_IP` and
  `LWS_LEADER_ADDRESS` (the downward API and LWS in a cluster) are 127.0.0.3 for the leader and
  127.0.0.2 for the worker; vLLM's arguments are the tiny test model's.
- What stands in for a GPU: vLLM 0.32's CPU build refuses Ray outright
  (`test_the_cpu_build_refuses_ray_without_a_device_key` keeps that on record), and its Ray
  executor places each rank on a Ray "GPU". `cpu_ranks_as_ray_gpus/sitecustomize.py`, on
  PYTHONPATH of the Ray nodes and vLLM, names "GPU" as the CPU platform's Ray device; the
  chart's `--num-gpus` lends those slots. Everything else (Ray, vLLM, its executor, gloo
  between the ranks, the sidecar) is the real thing.

The worker starts first and waits for the head, as LWS starts a group's pods together. Then
the group serves the reference model's tokens, the sidecar turns ready after warmup, and a
killed worker pod (its process group: the Ray node and the rank on it) makes vLLM's /health
fail and the sidecar's readiness with it, which is what takes a group out of the Service.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml

from ministream_reference.golden import DEFAULT_PROMPTS, reference_completions
from ministream_sidecar import cpu_memory
from ministream_testkit.helm import render
from ministream_testkit.net import answers, free_port
from ministream_testkit.processes import stop_group
from ministream_testkit.sidecar_process import SidecarProcess, start_sidecar
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS
from ministream_testkit.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.network, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"
SHIM = Path(__file__).with_name("cpu_ranks_as_ray_gpus")
LEADER_IP, WORKER_IP = "127.0.0.3", "127.0.0.2"  # Ray maps 127.0.0.1 to the host's own IP
CHART_RAY_PORT = "6379"
SERVED = "ministream-tiny"
START_TIMEOUT = 600.0


@dataclass
class RenderedGroup:
    leader_command: list[str]  # sh -c '<ray start --head ...> && exec python3 -m vllm...' vllm
    worker_command: list[str]  # sh -c '<wait for the head> && exec ray start ... --block'
    leader_args: list[str]  # vLLM's arguments as rendered (replaced here: other model)


def render_two_node_group(tmp_path: Path) -> RenderedGroup:
    overrides = tmp_path / "two-nodes.yaml"
    overrides.write_text(
        yaml.safe_dump({"parallelism": {"tensor": 2, "pipeline": 1}, "accelerator": {"perNode": 1}})
    )
    docs = render(CHART, [CHART / "ci" / "multinode-2x8-values.yaml", overrides])
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    leader = {c["name"]: c for c in template["leaderTemplate"]["spec"]["containers"]}["vllm"]
    worker = {c["name"]: c for c in template["workerTemplate"]["spec"]["containers"]}
    return RenderedGroup(leader["command"], worker["ray-worker"]["command"], leader["args"])


def on_this_machine(command: list[str], port: int) -> list[str]:
    """The one translation of a rendered command: the head's port."""
    script = command[2]
    assert script.count(f":{CHART_RAY_PORT}") + script.count(f"={CHART_RAY_PORT}") >= 1
    return [
        *command[:2],
        re.sub(rf"([:=]){CHART_RAY_PORT}\b", rf"\g<1>{port}", script),
        *command[3:],
    ]


@dataclass
class Group:
    root: Path
    model: Path
    vllm_url: str
    leader: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]
    sidecar: SidecarProcess | None = None
    logs: dict[str, Path] = field(default_factory=dict)

    def log(self, name: str) -> str:
        return self.logs[name].read_text(errors="replace")


def _environment(ray_tmp: Path, host_ip: str, leader_ip: str) -> dict[str, str]:
    venv_bin = str(Path(sys.executable).parent)
    return {
        **os.environ,
        # `ray` and `python3` as the image's PATH would find them: this interpreter's.
        "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SHIM), os.environ.get("PYTHONPATH")])),
        "VLLM_HOST_IP": host_ip,
        "LWS_LEADER_ADDRESS": leader_ip,
        "RAY_TMPDIR": str(ray_tmp),  # the nodes' sessions, sockets and logs
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_NO_USAGE_STATS": "1",
        **cpu_memory.pinned(),  # two nodes' ranks on one machine
    }


def _spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _leftovers(marker: str) -> list[int]:
    """PIDs of processes whose command line names this test's directory: the Ray daemons that
    `ray start` detached from the group leaders' process groups."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def group(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    if shutil.which("ray", path=str(Path(sys.executable).parent)) is None:
        raise RuntimeError("ray is not installed in this environment: run `make setup-test`")
    root = tmp_path_factory.mktemp("ray-group")
    # Ray's own folder: short, because a Unix socket's path has at most 107 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="ms-ray-"))
    rendered = render_two_node_group(root)
    port, vllm_port = free_port(), free_port()
    logs = {name: root / f"{name}.log" for name in ("leader", "worker", "sidecar")}
    # The worker first: it waits for the head, as in a group whose pods start together.
    worker = _spawn(
        on_this_machine(rendered.worker_command, port),
        _environment(ray_tmp, WORKER_IP, LEADER_IP),
        logs["worker"],
    )
    args = [
        "--model",
        str(tiny_model_dir),
        "--served-model-name",
        SERVED,
        "--host",
        "127.0.0.1",
        "--port",
        str(vllm_port),
        *TINY_ENGINE_ARGS,
        *rendered.leader_args[rendered.leader_args.index("--tensor-parallel-size") :],
    ]
    leader = _spawn(
        [*on_this_machine(rendered.leader_command, port), *args],
        _environment(ray_tmp, LEADER_IP, LEADER_IP),
        logs["leader"],
    )
    g = Group(root, tiny_model_dir, f"http://127.0.0.1:{vllm_port}", leader, worker, logs=logs)
    try:

        def serving() -> bool:
            for name, proc in (("leader", leader), ("worker", worker)):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"the {name} exited {proc.returncode}:\n{g.log(name)[-4000:]}"
                    )
            return answers(f"{g.vllm_url}/health")

        wait_until(
            serving,
            START_TIMEOUT,
            1.0,
            what="vLLM on the Ray group",
            detail=lambda: g.log("leader")[-3000:],
        )
        g.sidecar = start_sidecar(g.vllm_url, SERVED, logs["sidecar"])
        yield g
    finally:
        if g.sidecar is not None:
            g.sidecar.stop()
        stop_group(leader)
        stop_group(worker)
        _kill(_leftovers(str(ray_tmp)))
        wait_until(lambda: not _leftovers(str(ray_tmp)), 60, 0.5, what="the Ray processes gone")
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_the_chart_renders_rays_commands_and_the_ray_executor(tmp_path: Path) -> None:
    rendered = render_two_node_group(tmp_path)
    assert "ray start --head" in rendered.leader_command[2]
    assert (
        "--num-gpus=1" in rendered.leader_command[2]
        and "--num-gpus=1" in rendered.worker_command[2]
    )
    tail = rendered.leader_args[rendered.leader_args.index("--tensor-parallel-size") :]
    assert tail[:4] == ["--tensor-parallel-size", "2", "--distributed-executor-backend", "ray"]


def test_the_group_serves_the_reference_tokens_with_a_rank_on_each_node(group: Group) -> None:
    prompt = list(DEFAULT_PROMPTS[0])
    expected = reference_completions(group.model, [prompt], 16)[0].tokens
    reply = httpx.post(
        f"{group.vllm_url}/v1/completions",
        timeout=120,
        json={
            "model": SERVED,
            "prompt": prompt,
            "max_tokens": 16,
            "temperature": 0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
        },
    ).json()
    tokens = [int(t.split(":")[1]) for t in reply["choices"][0]["logprobs"]["tokens"]]
    assert tokens == expected
    leader_log = group.log("leader")
    # Ray prefixes a remote process's lines with its node's address: one rank ran there.
    assert re.search(rf"\(RayWorkerProc pid=\d+, ip={re.escape(WORKER_IP)}\)", leader_log)
    assert "Ray runtime started" in group.log("worker")  # it joined the head it waited for


def test_the_sidecar_is_ready_after_warmup_and_not_after_a_worker_dies(group: Group) -> None:
    assert group.sidecar is not None
    assert group.sidecar.get("/readyz").status_code == 503  # not warmed up yet
    warm = group.sidecar.post("/warmup")
    assert warm.status_code == 200, warm.text
    wait_until(lambda: group.sidecar.get("/readyz").status_code == 200, 60, 0.5, what="ready")
    # The worker pod dies: its process group (the `ray start --block` node and what it runs).
    os.killpg(group.worker.pid, signal.SIGKILL)
    _kill(_leftovers(f"node_ip_address={WORKER_IP}") + _leftovers(f"node-ip-address={WORKER_IP}"))
    wait_until(lambda: not answers(f"{group.vllm_url}/health"), 120, 0.5, what="vLLM unhealthy")
    wait_until(lambda: group.sidecar.get("/readyz").status_code == 503, 60, 0.5, what="readyz 503")
    body = group.sidecar.get("/readyz").json()
    assert body["upstream_up"] is False and "upstream_unhealthy" in body["reasons"], body


def test_the_cpu_build_refuses_ray_without_a_device_key() -> None:
    """Why the shim exists, kept on record: when a vLLM release gives its CPU platform a Ray
    device, this fails, and the shim should go."""
    code = (
        "import inspect\n"
        "from vllm.platforms.cpu import CpuPlatform\n"
        "from vllm.v1.executor import ray_utils\n"
        "print(repr(CpuPlatform.ray_device_key))\n"
        "print('does not support ray' in inspect.getsource(ray_utils.initialize_ray_cluster))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # without the shim
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["''", "True"]
