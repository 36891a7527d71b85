"""`ministream up` (ministream_sidecar.launcher.main) with the real vLLM engine and the
MiniStream plugin: both servers start, SIGTERM drains then stops both, exit status 0;
a vLLM that dies makes the launcher exit non-zero, its last line vLLM's reason; and on a
machine where vLLM's own default memory share would refuse to start, the launcher's KV-cache
size (ministream_sidecar.cpu_memory) starts it. The last two tests ask their questions of one
launcher started that way (`served`): one engine start for both."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sidecarkit import sample

from ministream_sidecar import cpu_memory
from ministream_sidecar.client import ENV_PREFIX
from ministream_sidecar.cpu_memory import GiB
from ministream_sidecar.launcher import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    Launcher,
    hub_env,
    parse_args,
    vllm_command,
)
from ministream_sidecar.metrics import ColdStartPhase
from ministream_sidecar.settings import SidecarSettings
from ministream_testkit.net import answers, free_port
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS
from ministream_testkit.waiting import wait_until
from tests.conftest import TINY_SERVED_NAME

VLLM_ARGS = ["--served-model-name", TINY_SERVED_NAME, *TINY_ENGINE_ARGS]


def test_arguments_after_double_dash_go_to_vllm(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    m = str(tmp_path)
    args = parse_args(["--model", m, "--port", "9000", "--", "--dtype", "float32"])
    assert (args.model, args.port, args.sidecar_port, args.host) == (m, 9000, 8081, "127.0.0.1")
    cmd = vllm_command(args)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[-2:] == ["--dtype", "float32"]
    assert cmd[cmd.index("--shutdown-timeout") + 1] == str(DEFAULT_SHUTDOWN_TIMEOUT)
    own = vllm_command(parse_args(["--model", m, "--", "--shutdown-timeout=5"]))
    assert "--shutdown-timeout" not in own and own[-1] == "--shutdown-timeout=5"
    with pytest.raises(SystemExit):
        parse_args(["--model", m, "--dtype", "float32"])  # vLLM flags only after --


def test_ministream_up_refuses_a_missing_or_raw_model_before_starting_anything(
    tmp_path: Path,
) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "model.pt").write_bytes(b"")
    for model, words in (
        (str(tmp_path / "absent"), "no such directory"),
        (str(tmp_path / "raw"), "no config.json"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "ministream.cli", "up", "--model", model],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert "ministream convert" in proc.stderr


@pytest.mark.parametrize("model", ["conv2", "models/ministream", "org/name"])
def test_up_never_takes_a_missing_path_for_a_hub_id(
    model: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths with at most one slash, absent here
    with pytest.raises(SystemExit):
        parse_args(["--model", model])
    err = capsys.readouterr().err
    assert f"--model {model}: no such directory" in err and "--from-hub" in err


def test_up_runs_vllm_offline_unless_asked_for_the_hub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conv").mkdir()
    (tmp_path / "conv" / "config.json").write_text("{}")
    assert hub_env(parse_args(["--model", "conv"])) == {"HF_HUB_OFFLINE": "1"}
    args = parse_args(["--model", "org/name", "--from-hub"])
    assert args.model == "org/name" and hub_env(args) == {}
    assert vllm_command(args)[vllm_command(args).index("--model") + 1] == "org/name"


@contextlib.contextmanager
def _launcher(argv: list[str]) -> Iterator[Launcher]:
    """A launcher that is never run (its scratch directory removed after)."""
    up = Launcher(parse_args(argv))
    try:
        yield up
    finally:
        shutil.rmtree(up.scratch, ignore_errors=True)


def _sidecar_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> SidecarSettings:
    """The sidecar's settings as the environment the launcher gives it makes them."""
    for name, value in env.items():
        if name.startswith(ENV_PREFIX):
            monkeypatch.setenv(name, value)
    return SidecarSettings()


def test_up_starts_vllm_offline_and_the_sidecar_with_its_probe_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the children are started with, not only what the argument parser says."""
    for name in [n for n in os.environ if n.startswith(ENV_PREFIX) or n == "HF_HUB_OFFLINE"]:
        monkeypatch.delenv(name)
    (tmp_path / "config.json").write_text("{}")
    with _launcher(["--model", str(tmp_path)]) as up:
        env = up.vllm_env(os.environ)
        assert env["HF_HUB_OFFLINE"] == "1"
        assert up.vllm_env({"HF_HUB_OFFLINE": "0"})["HF_HUB_OFFLINE"] == "0"  # the user's own
        assert _sidecar_settings(up.sidecar_env(env), monkeypatch).access_log_probes is False
    with _launcher(["--model", "org/name", "--from-hub", "--access-log-probes"]) as up:
        env = up.vllm_env(os.environ)
        assert "HF_HUB_OFFLINE" not in env
        assert _sidecar_settings(up.sidecar_env(env), monkeypatch).access_log_probes is True


def test_up_refuses_a_tp_that_does_not_divide_the_heads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text('{"num_attention_heads": 12}')
    for tp in (["--tensor-parallel-size", "5"], ["-tp=5"]):
        with pytest.raises(SystemExit):
            parse_args(["--model", str(tmp_path), "--", *tp])
        err = capsys.readouterr().err
        assert "--tensor-parallel-size 5 does not divide the model's 12 attention heads" in err
        assert "Pick one of 1, 2, 3, 4, 6, 12." in err
    assert parse_args(["--model", str(tmp_path), "--", "-tp", "4"]).vllm_args == ["-tp", "4"]


def test_up_keeps_vllms_health_and_metrics_out_of_its_access_log(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    m = str(tmp_path)
    quiet = vllm_command(parse_args(["--model", m]))
    quieted = quiet[quiet.index("--disable-access-log-for-endpoints") + 1]
    assert quieted == "/health,/metrics,/load"  # the health loop, Prometheus, the drain
    loud = vllm_command(parse_args(["--model", m, "--access-log-probes"]))
    assert "--disable-access-log-for-endpoints" not in loud
    own = vllm_command(parse_args(["--model", m, "--", "--disable-access-log-for-endpoints=/x"]))
    assert [a for a in own if "disable-access-log" in a] == [
        "--disable-access-log-for-endpoints=/x"
    ]


def launch(
    argv: list[str], tmp_path: Path, *, size_kv_cache: bool = False, **env: str
) -> tuple[subprocess.Popen[str], Path]:
    """`ministream up` with its output in a log; the tests' small KV cache unless
    `size_kv_cache` leaves the size to the launcher (and any VLLM_CPU_KVCACHE_SPACE out)."""
    log = tmp_path / "launcher.log"
    outer = {k: v for k, v in os.environ.items() if k != cpu_memory.ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ministream.cli", "up", *argv],  # the README's `ministream up`
        stdout=open(log, "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **outer,
            **({} if size_kv_cache else cpu_memory.pinned()),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "MINISTREAM_SIDECAR_WARMUP_REQUESTS": "4",
            "MINISTREAM_SIDECAR_WARMUP_PROMPT_TOKENS": "128",
            "MINISTREAM_SIDECAR_WARMUP_MAX_TOKENS": "32",
            "MINISTREAM_SIDECAR_HEALTH_INTERVAL_SECONDS": "0.5",
            "MINISTREAM_SIDECAR_DRAIN_POLL_INTERVAL_SECONDS": "0.2",
            **env,
        },
        start_new_session=True,
    )
    return proc, log


def pid_of(log: Path, name: str) -> int:
    match = re.search(rf"{name} pid (\d+)", log.read_text())
    assert match, log.read_text()
    return int(match.group(1))


def stop_everything(proc: subprocess.Popen[str], log: Path) -> None:
    """Teardown after a failure: the launcher, then the process groups it started."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)  # the second signal skips the drain
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for match in re.finditer(r"(?:vLLM|sidecar) pid (\d+)", log.read_text()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(match.group(1)), signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too (its parent may not have reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.engine  # vLLM starts, then fails on the model
@pytest.mark.network  # the sidecar listens on loopback meanwhile
def test_up_exits_non_zero_when_vllm_dies(tmp_path: Path) -> None:
    # Passes the launcher's own checks (a directory with a config.json); vLLM then fails on
    # a config without the model's fields and no weights.
    model = tmp_path / "broken-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "ministream"}')
    proc, log = launch(
        [
            "--model",
            str(model),
            "--port",
            str(free_port()),
            "--sidecar-port",
            str(free_port()),
            "--",
            *VLLM_ARGS,
        ],
        tmp_path,
    )
    output = failed_output(proc, log)
    assert "vLLM exited with status" in output
    assert gone(pid_of(log, "sidecar"))
    # The last line is vLLM's own reason (an exception line from its output), not a status.
    last = last_line(output)
    assert re.match(r"ministream up: vLLM exited with status \d+: \w+(Error|Exception): ", last), (
        last
    )


def failed_output(proc: subprocess.Popen[str], log: Path) -> str:
    """The output of a launch that must exit non-zero by itself (within 300 s)."""
    try:
        status = proc.wait(300)
    finally:
        stop_everything(proc, log)
    output = log.read_text()
    assert status != 0, output
    return output


def last_line(output: str) -> str:
    return output.rstrip().splitlines()[-1]


# --- vLLM's own memory check, and one launcher serving beside it ---------------------------
# Without a KV-cache size, vLLM 0.32's CPU worker reserves --gpu-memory-utilization (0.92) of
# its memory node and refuses to start unless that much is available (cpu_worker.py). The
# fixtures below put the machine into that state, the one `ministream up` failed in, by holding
# anonymous memory (which vLLM cannot count as available, unlike the page cache) until vLLM's
# own numbers say it would refuse, with a margin for memory other processes free meanwhile.
_REFUSING_SHARE = 0.80  # available below this share of the total: 0.92 refuses with room
_HOLD_STEP = 256 << 20
_KEEP_AVAILABLE = 6 * GiB  # MemAvailable left to the engine and the machine's other users


def vllm_memory() -> tuple[int, int]:
    """(total, available) of the node vLLM's CPU worker binds to, by vLLM's own functions."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    info = get_memory_node_info(get_allowed_cpu_list()[0].numa_node)
    return info.total_memory, info.available_memory


def vllm_default_refuses(total: int, available: int) -> bool:
    """cpu_worker.py's startup check at its default share."""
    return math.ceil(total * 0.92) > available


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemAvailable in /proc/meminfo")


class MemoryHold:
    """Anonymous memory this process holds, topped up on each call until vLLM's default share
    would refuse: other processes free memory meanwhile, so each launch asks again."""

    def __init__(self) -> None:
        self.held: list[bytes] = []

    def until_vllm_refuses(self) -> dict[str, float]:
        """Hold more until vLLM's default would refuse; the figures (GiB) it saw. Raises
        MemoryUnsafe where that would leave the machine less than _KEEP_AVAILABLE."""
        total, available = vllm_memory()
        figures = {"node_total": total / GiB, "node_available": available / GiB}
        while available >= _REFUSING_SHARE * total:
            if _mem_available() - _HOLD_STEP < _KEEP_AVAILABLE:
                raise MemoryUnsafe(f"{figures}, held {len(self.held)} steps")
            self.held.append(b"\1" * _HOLD_STEP)  # written: resident, not reclaimable
            total, available = vllm_memory()
        figures |= {
            "held": len(self.held) * _HOLD_STEP / GiB,
            "node_total_then": total / GiB,
            "node_available_then": available / GiB,
            "vllm_default_requests": math.ceil(total * 0.92) / GiB,
            "kv_cache_rule": cpu_memory.default_gib(cpu_memory.MemoryView.read().available),
        }
        print("memory (GiB):", {k: round(v, 2) for k, v in figures.items()})
        assert vllm_default_refuses(total, available), figures  # the state ministream up failed in
        return figures


class MemoryUnsafe(Exception):
    """Not enough memory on this machine to hold vLLM's default into refusing, safely."""


@pytest.fixture(scope="module")
def memory_hold() -> Iterator[MemoryHold]:
    """One hold for the module's launches under memory pressure, released after the last."""
    hold = MemoryHold()
    try:
        yield hold
    finally:
        hold.held.clear()


@pytest.fixture
def vllm_default_would_refuse(memory_hold: MemoryHold) -> dict[str, float]:
    """Memory held until vLLM's default share would refuse; the figures (GiB) it saw."""
    try:
        return memory_hold.until_vllm_refuses()
    except MemoryUnsafe as unsafe:
        pytest.skip(f"cannot take enough memory safely: {unsafe}")


def up_args(model: Path, *vllm_args: str, ports: tuple[int, int] | None = None) -> list[str]:
    port, sidecar_port = ports or (free_port(), free_port())
    return ["--model", str(model), "--port", str(port), "--sidecar-port", str(sidecar_port),
            "--", *VLLM_ARGS, *vllm_args]  # fmt: skip


@pytest.mark.engine
@pytest.mark.network
def test_up_ends_with_vllms_reason_and_what_to_set_when_it_refuses_for_memory(
    tiny_model_dir: Path, tmp_path: Path, vllm_default_would_refuse: dict[str, float]
) -> None:
    # vLLM's own default, asked for explicitly: the user's flag wins over the launcher's size,
    # so this is `ministream up` as it was before it sized the cache.
    args = up_args(tiny_model_dir, "--gpu-memory-utilization", "0.92")
    proc, log = launch(args, tmp_path, size_kv_cache=True)
    output = failed_output(proc, log)
    assert "ministream up: KV cache" not in output  # the size is left to the user's flag
    last = last_line(output)
    assert last.startswith("ministream up: vLLM exited with status 1: ValueError: Available "), last
    assert "is less than desired CPU memory utilization (0.92, " in last, last
    what_to_set = r"set VLLM_CPU_KVCACHE_SPACE=\d+ .* `-- --gpu-memory-utilization 0\.\d\d`"
    assert re.search(what_to_set, last), last


@dataclass
class Served:
    """A `ministream up` that is ready; the memory figures it started under, or None where
    memory could not be held (then it runs on the tests' small KV cache)."""

    proc: subprocess.Popen[str]
    log: Path
    port: int
    sidecar_port: int
    memory: dict[str, float] | None

    @property
    def sidecar(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"


@pytest.fixture(scope="module")
def served(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, memory_hold: MemoryHold
) -> Iterator[Served]:
    """One launcher for the last two tests (one engine start for both): started where vLLM's
    default share would refuse and left to size the KV cache, which the first of them checks;
    the last serves through it, drains it on SIGTERM and sees it exit."""
    try:
        memory: dict[str, float] | None = memory_hold.until_vllm_refuses()
    except MemoryUnsafe as unsafe:
        print(f"cannot take enough memory safely ({unsafe}): the tests' KV cache instead")
        memory = None
    ports = free_port(), free_port()
    args = up_args(tiny_model_dir, ports=ports)
    proc, log = launch(args, tmp_path_factory.mktemp("served"), size_kv_cache=memory is not None)
    up = Served(proc, log, *ports, memory)
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            return answers(f"{up.sidecar}/readyz")

        wait_until(ready, 600, 0.5, what="ready through the launcher")
        yield up
    finally:
        stop_everything(proc, log)


@pytest.mark.engine
@pytest.mark.network
def test_up_sizes_the_kv_cache_and_starts_where_vllms_default_refuses(served: Served) -> None:
    if served.memory is None:
        pytest.skip("cannot take enough memory safely: the launcher runs on a fixed KV cache")
    wait_until(lambda: "ready after" in served.log.read_text(), 10, what="ready announced")
    output = served.log.read_text()
    gib = int(served.memory["kv_cache_rule"])
    sized = re.search(r"ministream up: KV cache (\d+) GiB \(VLLM_CPU_KVCACHE_SPACE; ", output)
    assert sized and abs(int(sized.group(1)) - gib) <= 1, output  # memory moves meanwhile
    took = re.search(r"Explicitly set \((\d+)\.0+/[\d.]+\) GiB for KV cache", output)
    assert took and took.group(1) == sized.group(1), output  # vLLM took that size
    assert vllm_default_refuses(*vllm_memory())  # and its default still would not start
    # SIGTERM, then exit status 0: the next test, on the same launcher.


@pytest.mark.engine
@pytest.mark.network
def test_up_serves_drains_on_sigterm_and_exits_cleanly(served: Served, tmp_path: Path) -> None:
    """The last test on `served`: it stops the launcher."""
    proc, log, port, sidecar = served.proc, served.log, served.port, served.sidecar
    assert proc.poll() is None, log.read_text()
    try:
        vllm_pid, sidecar_pid = pid_of(log, "vLLM"), pid_of(log, "sidecar")
        text = httpx.get(f"{sidecar}/metrics", timeout=5).text
        phases = {
            p.value: sample(text, "ministream_cold_start_phase_seconds", phase=p.value)
            for p in ColdStartPhase
            if f'phase="{p.value}"' in text
        }
        (tmp_path / "cold_start.json").write_text(json.dumps(phases))
        print("cold start phases (s):", phases)
        assert phases["engine_start"] > 1  # counted from the launcher's start, not the sidecar's
        # vLLM's own phases, from the startup log the plugin stamped (the CPU build captures
        # no CUDA graphs, so graph_capture is absent): consecutive, inside engine_start.
        inside = ("imports", "engine_core_start", "weights", "profiling_and_compile")
        assert all(phases[p] > 0 for p in inside), phases
        assert sum(phases[p] for p in inside) < phases["engine_start"]
        wait_until(lambda: "ready after" in log.read_text(), 10, what="ready announced")

        # A request in flight while SIGTERM arrives must complete. Streamed, and the client
        # thread itself sends SIGTERM on the first token, before it reads the rest: the tiny
        # model generates 480 tokens in about a second, and a fresh-clone CI run saw the whole
        # stream end in the time the main thread took to wake up after the first token.
        outcome: dict[str, Any] = {}
        first_token = threading.Event()
        max_tokens = 480

        def streamed_request() -> None:
            payload = {
                "model": TINY_SERVED_NAME,
                "prompt": "hello",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            url = f"http://127.0.0.1:{port}/v1/completions"
            try:
                with httpx.stream("POST", url, json=payload, timeout=120) as response:
                    outcome["status"] = response.status_code
                    for line in response.iter_lines():
                        if line == "data: [DONE]":
                            outcome["done"] = True
                        elif line.startswith("data: "):
                            chunk = json.loads(line.removeprefix("data: "))
                            if chunk.get("usage"):  # the last chunk counts the tokens
                                outcome["tokens"] = chunk["usage"]["completion_tokens"]
                            if chunk["choices"] and not first_token.is_set():
                                outcome["signalled_while_streaming"] = "done" not in outcome
                                proc.send_signal(signal.SIGTERM)
                                first_token.set()
            except httpx.HTTPError as exc:
                outcome["error"] = repr(exc)

        client = threading.Thread(target=streamed_request)
        client.start()

        def streaming() -> bool:
            assert client.is_alive() or first_token.is_set(), f"no token came: {outcome}"
            return first_token.is_set()

        wait_until(streaming, 120, 0.01, what="the request's first token (and SIGTERM)")
        assert proc.wait(DEFAULT_SHUTDOWN_TIMEOUT + 60) == 0, log.read_text()
        client.join(30)
        assert outcome == {
            "status": 200,
            "signalled_while_streaming": True,
            "tokens": max_tokens,
            "done": True,
        }, outcome
        output = log.read_text()
        assert "'outcome': 'idle'" in output
        # vLLM's access log shows the completion but none of the sidecar's /health polls.
        assert '"POST /v1/completions HTTP/1.1" 200' in output, output
        assert '"GET /health HTTP/1.1"' not in output, output
        assert gone(vllm_pid) and gone(sidecar_pid)
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{sidecar}/livez", timeout=2)
    finally:
        stop_everything(proc, log)
