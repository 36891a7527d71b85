"""Helpers for the loading-path tests: serve once, read greedy tokens, measure per-rank reads.

Every path is checked through what a user gets: a real `vllm.entrypoints.openai.api_server`
process (ministream_testkit/vllm_server.py), greedy completions over the OpenAI API, compared
with `ministream.golden.compare` against the local TP=1 load.

Which rank reads what (local files), two measurements:
- who opens each shard file: fanotify (FAN_OPEN on the shard files' inodes) reports the pid
  of every process that opens one; a process that never opens a file cannot read it, mmap
  included. Worker pids map to ranks by their process titles (`VLLM::Worker_TP<r>`).
- how much each worker read: shard files are evicted from the page cache first (fsync +
  POSIX_FADV_DONTNEED, on these files only); once the server is healthy, `read_bytes` of
  each worker from /proc/<pid>/io is what that process fetched from storage (mmap page
  faults included). It must cover its own shard; it also counts unrelated first-time reads
  (libraries), about 1 MB here, more than a tiny shard, so it is not used as an upper bound.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from ministream_reference.golden import DEFAULT_PROMPTS, Completion, compare
from ministream_testkit.net import answers
from ministream_testkit.vllm_server import TINY_ENGINE_ARGS, VLLMServer
from ministream_testkit.waiting import wait_until

PROMPTS = [list(p) for p in DEFAULT_PROMPTS]
MAX_TOKENS = 16
ATOL = 2e-3  # float32: TP=1 vs TP=2 differ only by summation order
BASE_ARGS = TINY_ENGINE_ARGS  # as the session's `vllm_server`, the baseline every path matches
# Engine starts take ~1 min on an idle 2-core box and >7 min when other engineers' engines
# share it (load average 25 seen): generous limits, so only a real hang fails.
START_TIMEOUT = 1800.0
TP2_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}  # docs/architecture.md §3: TP=2 on two cores


@dataclass
class Served:
    completions: list[Completion]
    read_bytes: dict[int, int] = field(default_factory=dict)  # TP rank -> bytes from storage
    worker_pids: dict[int, int] = field(default_factory=dict)
    log: str = ""


def complete(server: VLLMServer, prompt: list[int]) -> Completion:
    reply = httpx.post(
        f"{server.url}/v1/completions",
        timeout=120,
        json={
            "model": server.served_name,
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "logprobs": 5,
            "return_tokens_as_token_ids": True,
        },
    )
    reply.raise_for_status()
    lp = reply.json()["choices"][0]["logprobs"]
    tokens = [int(t.split(":")[1]) for t in lp["tokens"]]
    top = [{int(k.split(":")[1]): float(v) for k, v in step.items()} for step in lp["top_logprobs"]]
    return Completion(prompt, tokens, top)


def worker_pids(server: VLLMServer) -> dict[int, int]:
    """TP rank -> pid of the vLLM worker processes below the server (by process title)."""
    assert server.process is not None
    found = {}
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        try:
            title = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "VLLM::Worker_TP" in title:
            found[int(title.split("VLLM::Worker_TP")[1].split()[0].split("_")[0])] = proc.pid
    return found


def proc_read_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError(f"no read_bytes for {pid}")


class OpenWatch:
    """fanotify FAN_OPEN on some files: (pid, path) of every open while active (needs root)."""

    _FAN_CLOEXEC, _FAN_NONBLOCK, _FAN_OPEN, _FAN_MARK_ADD, _AT_FDCWD = 1, 2, 0x20, 1, -100

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = [Path(p).resolve() for p in paths]
        self.opened: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._fd = -1

    def __enter__(self) -> OpenWatch:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fanotify_mark.argtypes = [
            ctypes.c_int,
            ctypes.c_uint,
            ctypes.c_uint64,
            ctypes.c_int,
            ctypes.c_char_p,
        ]
        self._fd = libc.fanotify_init(
            self._FAN_CLOEXEC | self._FAN_NONBLOCK, os.O_RDONLY | os.O_CLOEXEC
        )
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "fanotify_init (needs CAP_SYS_ADMIN)")
        for path in self.paths:
            if (
                libc.fanotify_mark(
                    self._fd, self._FAN_MARK_ADD, self._FAN_OPEN, self._AT_FDCWD, str(path).encode()
                )
                != 0
            ):
                raise OSError(ctypes.get_errno(), f"fanotify_mark {path}")
        self._thread.start()
        return self

    def _run(self) -> None:
        # Events are queued when a file is opened; after `stop`, read until the queue is empty.
        while True:
            if not select.select([self._fd], [], [], 0.2)[0]:
                if self._stop.is_set():
                    return
                continue
            data = os.read(self._fd, 65536)
            offset = 0
            while offset < len(data):
                length, _, _, _, _, fd, pid = struct.unpack_from("IBBHQii", data, offset)
                if fd >= 0:
                    self.opened.append((pid, os.readlink(f"/proc/self/fd/{fd}")))
                    os.close(fd)
                offset += length

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        os.close(self._fd)


def _server(
    model: str,
    log_path: Path,
    extra_args: Sequence[str],
    env: Mapping[str, str] | None,
    tp: int,
) -> VLLMServer:
    return VLLMServer(
        model=model,
        log_path=log_path,
        args=[*BASE_ARGS, "--tensor-parallel-size", str(tp), *extra_args],
        env={**(env or {}), **(TP2_ENV if tp == 2 else {})},
    )


def serve(
    model: str,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    tp: int = 1,
) -> Served:
    """Start a server, wait for /health, take greedy completions (and per-rank reads), stop."""
    server = _server(model, log_path, extra_args, env, tp).start()
    try:
        server.wait_healthy(timeout=START_TIMEOUT)
        pids = worker_pids(server)
        read = {rank: proc_read_bytes(pid) for rank, pid in pids.items()}
        completions = [complete(server, p) for p in PROMPTS]
    finally:
        server.stop()
    return Served(completions, read, pids, log_path.read_text(errors="replace"))


def expect_start_failure(
    model: str,
    log_path: Path,
    *,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    tp: int = 1,
    timeout: float = START_TIMEOUT,
) -> str:
    """Start a server that must exit without ever answering /health OK; return its log."""
    server = _server(model, log_path, extra_args, env, tp).start()

    def exited_without_serving() -> bool:
        assert server.process is not None
        if server.process.poll() is not None:
            return True
        healthy = answers(f"{server.url}/health")
        assert not healthy, "the server became healthy: it serves a broken model"
        return False

    try:
        wait_until(
            exited_without_serving, timeout, 0.5, what="vLLM to exit", detail=server.log_tail
        )
        assert server.process is not None and server.process.returncode != 0
    finally:
        server.stop()
    return log_path.read_text(errors="replace")


def assert_same_tokens(expected: list[Completion], actual: list[Completion]) -> None:
    problems = compare(expected, actual, atol=ATOL, require_identical=True)
    assert not problems, "\n".join(
        f"prompt {p.prompt_index} pos {p.position}: {p.detail}" for p in problems
    )
