"""A real vLLM OpenAI server process for tests (CPU build), started once and shared.

`python -m vllm.entrypoints.openai.api_server` is used instead of the `vllm` console
script, which the CPU build breaks (docs/architecture.md §3).

The benchmark scripts start their servers through it too (scripts/gpu/cold_start.py and
kv_offload.py on a GPU host): a subclass gives a pod's own command line, `test_env=False`
leaves the tests' environment out, and `on_line` sees each output line as it arrives.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ministream.startup_log import ENV as STARTUP_LOG_ENV
from ministream_sidecar import cpu_memory
from ministream_sidecar.engine_client import LOAD_PATH, RequestCounts, parse_request_counts
from ministream_testkit.local_server import LocalServer
from ministream_testkit.net import answers
from ministream_testkit.processes import stop_group
from ministream_testkit.waiting import wait_until

if TYPE_CHECKING:
    import psutil

# The engine arguments of every tiny-model server in the tests (float32 so that numerics
# compare tightly; eager, as compiling costs minutes on CPU). Servers whose results are
# compared with each other must use the same ones.
TINY_ENGINE_ARGS = ("--dtype", "float32", "--max-model-len", "512", "--enforce-eager")

# For offline `vllm.LLM` runs (golden numerics, the GPU scripts' CPU smoke runs): the engine
# core runs in the calling process instead of a spawned one that imports torch and vLLM all
# over again. Same model code, same outputs (the golden JSON of the tiny model is identical
# byte for byte, at TP=1 and TP=2); a TP=1 run starts in about half the time on 2 vCPUs.
# Not for API servers: production's `vllm serve` keeps its engine-core process.
IN_PROCESS_ENGINE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def sum_samples(metrics_text: str, name: str, **labels: str) -> float:
    """The samples called `name` in Prometheus text (vLLM's /metrics) whose labels include
    `labels` (`finished_reason="error"`), summed over the rest."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def request_counts(url: str) -> RequestCounts:
    """Running and waiting requests of the vLLM server at `url`, read as the sidecar's drain
    reads them (ministream_sidecar.engine_client.parse_request_counts)."""
    return parse_request_counts(metrics_text(url))


def server_load(url: str) -> int:
    """The requests vLLM's HTTP server holds (GET /load; a server started with
    `--enable-server-load-tracking`), which the sidecar's drain counts beside the gauges."""
    response = httpx.get(f"{url}{LOAD_PATH}", timeout=30)
    response.raise_for_status()
    return int(response.json()["server_load"])


def idle_server_load(url: str) -> int:
    """GET /load of a server with nothing in flight, read to compare a busy reading against.
    It is not always 0: in a fresh-clone CI run (2026-12-05) the session's shared server read
    at most 0 through a minute of four streams in flight (219 streams, 6 000 reads), in two
    tests, so its counter had gone below 0 and stayed there (and in the next run the
    streaming-drain test's never rose above its idle reading: it can drift meanwhile too).
    What drove it there was not found (plain and streamed requests cut by a client timeout
    left it at 0 here). Idle is read from the engine's gauges first."""
    wait_until(lambda: request_counts(url).idle, 60, 0.1, what="vLLM idle")
    return server_load(url)


def engine_core(server: VLLMServer) -> psutil.Process:
    """The server's one engine-core process (vLLM spawns it under the API server)."""
    import psutil

    assert server.process is not None
    cores = [
        p
        for p in psutil.Process(server.process.pid).children(recursive=True)
        if "EngineCore" in p.name()
    ]
    assert len(cores) == 1, f"expected one engine-core process, found {cores}"
    return cores[0]


def metrics_text(url: str) -> str:
    """The /metrics page of the vLLM server at `url`."""
    return httpx.get(f"{url}/metrics", timeout=10).text


@dataclass
class VLLMServer(LocalServer):
    """One vLLM OpenAI server in its own process group, its output in `log_path`.

    `test_env=False`: the process gets this process's environment and `env` only, without
    the tests' pinned CPU cache, offline hub and startup log (a benchmark that starts what a
    pod runs). `on_line`: called with each line of output (newline removed) as it arrives,
    from a reader thread; the lines still go to `log_path`.
    """

    model: str
    log_path: Path
    served_name: str = "ministream"
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    test_env: bool = True
    on_line: Callable[[str], None] | None = None

    @property
    def startup_log(self) -> Path:
        """The file the plugin stamps this server's start into (a sidecar's STARTUP_LOG)."""
        return self.log_path.with_name(f"{self.log_path.stem}.startup.log")

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.args,
        ]

    def environment(self) -> dict[str, str]:
        """The server process's environment: this process's, the tests' (unless `test_env`
        is off), then `env`."""
        tests = {
            # Several test servers run side by side: the same small cache on every machine.
            **cpu_memory.pinned(),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            STARTUP_LOG_ENV: str(self.startup_log),
        }
        return {**os.environ, **(tests if self.test_env else {}), **self.env}

    def start(self) -> VLLMServer:
        self.launch(
            self.command(),
            self.log_path,
            env=self.environment(),
            own_group=True,
            on_line=self.on_line,
        )
        return self

    def wait_healthy(self, timeout: float = 600.0, interval: float = 0.5) -> VLLMServer:
        def healthy() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            return answers(f"{self.url}/health")

        wait_until(
            healthy, timeout, interval, what=f"vLLM healthy at {self.url}", detail=self.log_tail
        )
        return self

    def wait_exit(self, timeout: float = 600.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the server's process group (it spawns the engine core), then SIGKILL
        after `grace_s`; with `on_line`, wait up to 5 s for the last lines."""
        stop_group(self.process, grace_s)
        self.join_reader(timeout=5)

    @contextmanager
    def running(self) -> Iterator[VLLMServer]:
        """Start, wait until healthy, yield; stop on the way out (a no-op once it exited)."""
        self.start()
        try:
            self.wait_healthy()
            yield self
        finally:
            self.stop()
