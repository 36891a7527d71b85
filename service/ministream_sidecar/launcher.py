"""`ministream up`: vLLM and the sidecar together on one machine.

    ministream up --model DIR [--port 8000] [--sidecar-port 8081] [--host 127.0.0.1]
                  [--from-hub] [--access-log-probes] [-- EXTRA_VLLM_ARGS...]

Starts `python -m vllm.entrypoints.openai.api_server` (the CPU build's `vllm` console script is
broken, docs/architecture.md §3) and `python -m ministream_sidecar`, each in its own session so that
a terminal's Ctrl-C reaches only this launcher (`processes.Child`, the lifecycle the rollout
experiment's pods use too). On SIGINT or SIGTERM it drains through the sidecar with `client.drain`,
the client the chart's preStop hook runs, then sends SIGTERM to vLLM (which got
`--shutdown-timeout`), then stops the sidecar. A second signal skips what is left of the drain. If
vLLM or the sidecar dies on its own, the other is stopped and the exit status is non-zero; when
vLLM is the one that exited, the last line is vLLM's own reason (from the tail of its output, which
still reaches the terminal live).

`--model` is a local directory or an s3:// URI; anything else is refused before anything
starts, and vLLM runs with `HF_HUB_OFFLINE=1`, so a mistyped path never becomes a Hugging
Face hub id that downloads and serves someone else's model. `--from-hub` asks for the hub.

vLLM's `/health` (polled by the sidecar) and `/metrics` are left out of its access log, and
the sidecar's probes that went well out of its own (`access_log.py`) unless
`--access-log-probes`.

On vLLM's CPU build the KV cache is sized to fit this machine (`cpu_memory`) unless the user
sized it: vLLM's own default reserves 92 % of the memory and refuses to start when that much
is not free.

This module imports neither torch nor vLLM: vLLM runs in its own process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from pydantic import ValidationError

from ministream import startup_log

from . import client, cpu_memory
from .client import ENV_PREFIX
from .engine_client import LOAD_PATH, LOAD_TRACKING_FLAG
from .output_tail import exit_reason
from .processes import Child
from .serve_vllm import VLLM_SERVER
from .settings import SidecarSettings

DEFAULT_SHUTDOWN_TIMEOUT = 30  # seconds vLLM lets in-flight requests finish after SIGTERM
_POLL_SECONDS = 0.5
_SIDECAR_STOP_SECONDS = 10.0
_VLLM_STOP_MARGIN_SECONDS = 15.0  # beyond --shutdown-timeout, for vLLM's own teardown
_VLLM_TAIL_LINES = 200  # a refusal's traceback and the worker's error lines above it
_TAIL_DRAIN_SECONDS = 5.0  # for the last lines still in the pipes after vLLM exited
# vLLM's paths that the sidecar's health loop and drain and Prometheus ask for: left out of
# vLLM's access log (the chart renders the same list; a chart test holds the two equal).
VLLM_QUIET_PATHS = ("/health", "/metrics", LOAD_PATH)
QUIET_FLAG = "--disable-access-log-for-endpoints"


class _ForceStop(Exception):
    """A second signal: stop now, skip the rest of the drain."""


@dataclass(frozen=True)
class UpArgs:
    model: str
    port: int
    sidecar_port: int
    host: str
    vllm_args: list[str]
    from_hub: bool = False
    access_log_probes: bool = False


def parse_args(argv: list[str]) -> UpArgs:
    own, extra = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :])
        if "--" in argv
        else (
            argv,
            [],
        )
    )
    parser = argparse.ArgumentParser(
        prog="ministream up",
        description="Serve a converted MiniStream model directory with vLLM behind the "
        "MiniStream sidecar. Arguments after `--` go to vLLM unchanged.",
        allow_abbrev=False,
    )
    parser.add_argument("--model", required=True, help="model directory (or s3:// URI)")
    parser.add_argument("--port", type=int, default=8000, help="vLLM OpenAI API port")
    parser.add_argument("--sidecar-port", type=int, default=8081, help="sidecar port")
    parser.add_argument("--host", default="127.0.0.1", help="bind address of both servers")
    parser.add_argument(
        "--from-hub",
        action="store_true",
        help="let vLLM take a --model that is not a local directory as a Hugging Face hub id "
        "and download it (without it, vLLM runs offline: HF_HUB_OFFLINE=1)",
    )
    parser.add_argument(
        "--access-log-probes",
        action="store_true",
        help="access-log every health check, probe and metrics scrape (vLLM's /health and "
        "/metrics, the sidecar's /livez, /readyz and /metrics); without it only failed and "
        "slow ones are",
    )
    ns = parser.parse_args(own)
    if ns.port == ns.sidecar_port:
        parser.error("--port and --sidecar-port must differ")
    if problem := local_model_problem(ns.model, from_hub=ns.from_hub):
        parser.error(problem)
    if problem := tensor_parallel_problem(ns.model, extra):
        parser.error(problem)
    return UpArgs(
        ns.model, ns.port, ns.sidecar_port, ns.host, extra, ns.from_hub, ns.access_log_probes
    )


def local_model_problem(model: str, *, from_hub: bool = False) -> str | None:
    """Why `model` cannot be served (checked before anything starts); None for a servable
    directory, an s3:// URI, or (only with `from_hub`) a hub id that vLLM resolves."""
    if "://" in model:
        return None
    path = Path(model).expanduser()
    if not path.exists():
        if from_hub:
            return None
        return (
            f"--model {model}: no such directory; pass a directory written by "
            "`ministream convert` (or an s3:// URI). To serve a Hugging Face hub model "
            "instead, add --from-hub."
        )
    if not (path / "config.json").is_file():
        return (
            f"--model {model}: no config.json there; pass a directory written by "
            "`ministream convert`, not the raw training checkpoint"
        )
    return None


def _flag_value(args: list[str], *names: str) -> str | None:
    """The value of the last of `names` in `args` (`--flag V` or `--flag=V`)."""
    found = None
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in names:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    return found


def tensor_parallel_problem(model: str, vllm_args: list[str]) -> str | None:
    """A tensor-parallel size (after `--`) that does not divide the local model's attention
    heads, refused before vLLM starts (it would fail in every rank, after loading began)."""
    tp_text = _flag_value(vllm_args, "--tensor-parallel-size", "-tp")
    config = Path(model).expanduser() / "config.json"
    if tp_text is None or not tp_text.isdigit() or "://" in model or not config.is_file():
        return None
    import json

    heads = int(json.loads(config.read_text()).get("num_attention_heads") or 0)
    tp = int(tp_text)
    if tp and heads and heads % tp:
        fits = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0)
        return (
            f"--tensor-parallel-size {tp} does not divide the model's {heads} attention heads: "
            f"each rank serves whole heads. Pick one of {fits}."
        )
    return None


def hub_env(args: UpArgs) -> dict[str, str]:
    """vLLM's environment entries that keep it off the hub unless `--from-hub` asked for it
    (applied with setdefault: an HF_HUB_OFFLINE of the user's own wins)."""
    return {} if args.from_hub else {"HF_HUB_OFFLINE": "1"}


def vllm_command(args: UpArgs) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        VLLM_SERVER,
        "--model",
        args.model,
        "--port",
        str(args.port),
        "--host",
        args.host,
    ]
    if not any(
        a == "--shutdown-timeout" or a.startswith("--shutdown-timeout=") for a in args.vllm_args
    ):
        cmd += ["--shutdown-timeout", str(DEFAULT_SHUTDOWN_TIMEOUT)]
    # The drain waits for vLLM's own count of the requests its HTTP server holds (GET /load).
    if LOAD_TRACKING_FLAG not in args.vllm_args:
        cmd.append(LOAD_TRACKING_FLAG)
    if not args.access_log_probes and not any(
        a == QUIET_FLAG or a.startswith(f"{QUIET_FLAG}=") for a in args.vllm_args
    ):
        cmd += [QUIET_FLAG, ",".join(VLLM_QUIET_PATHS)]
    return cmd + args.vllm_args


def shutdown_timeout(cmd: list[str]) -> float:
    for i, arg in enumerate(cmd):
        if arg.startswith("--shutdown-timeout="):
            return float(arg.split("=", 1)[1])
        if arg == "--shutdown-timeout" and i + 1 < len(cmd):
            return float(cmd[i + 1])
    return 0.0


def _local(host: str) -> str:
    """Where to connect to a server bound to `host` from this machine."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _say(message: str) -> None:
    print(f"ministream up: {message}", file=sys.stderr, flush=True)


class Launcher:
    def __init__(self, args: UpArgs) -> None:
        self.args = args
        self.vllm_cmd = vllm_command(args)
        self.vllm: Child | None = None
        self.sidecar: Child | None = None
        self.signals: list[int] = []
        self.scratch = Path(tempfile.mkdtemp(prefix="ministream-up-"))
        host = _local(args.host)
        self.api_url = f"http://{host}:{args.port}"
        self.sidecar_url = f"http://{host}:{args.sidecar_port}"

    # --- signals -------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        if len(self.signals) == 2:  # once: a third signal must not interrupt the kill
            raise _ForceStop

    # --- the run -------------------------------------------------------------------------
    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            return self._run()
        except _ForceStop:
            _say("second signal: stopping now")
            self._stop_all(drain=False)
            return 0
        finally:
            for child in (self.vllm, self.sidecar):
                if child is not None:
                    child.kill_group()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            shutil.rmtree(self.scratch, ignore_errors=True)

    # --- the children's environments -----------------------------------------------------
    def vllm_env(self, outer: Mapping[str, str]) -> dict[str, str]:
        """vLLM's environment: `outer` (ours), the start time and startup log the sidecar
        reads, and offline unless `--from-hub` (each only where `outer` has none)."""
        env = dict(outer)
        # The cold start counts from here, the moment vLLM is asked to start.
        env.setdefault(f"{ENV_PREFIX}PROCESS_START_TIME", repr(time.time()))
        # vLLM (through the plugin) stamps its start there; the sidecar splits it in phases.
        env.setdefault(startup_log.ENV, str(self.scratch / "vllm-startup.log"))
        for key, value in hub_env(self.args).items():
            env.setdefault(key, value)
        return env

    def sidecar_env(self, vllm_env: Mapping[str, str]) -> dict[str, str]:
        """The sidecar's environment: vLLM's, with where to listen, where vLLM is, and
        every probe access-logged with `--access-log-probes`."""
        env = {
            **vllm_env,
            f"{ENV_PREFIX}HOST": self.args.host,
            f"{ENV_PREFIX}PORT": str(self.args.sidecar_port),
            f"{ENV_PREFIX}VLLM_URL": self.api_url,
        }
        if self.args.access_log_probes:
            env[f"{ENV_PREFIX}ACCESS_LOG_PROBES"] = "true"
        return env

    def _run(self) -> int:
        env = self.vllm_env(os.environ)
        try:  # fail on a bad MINISTREAM_SIDECAR_* before starting anything
            settings = SidecarSettings()
        except ValidationError as exc:
            _say(f"invalid MINISTREAM_SIDECAR_* settings:\n{exc}")
            return 2
        view = cpu_memory.MemoryView.read()
        if sized := cpu_memory.kv_cache_env(env, self.args.vllm_args, view=view):
            env.update(sized)
            _say(cpu_memory.describe(int(sized[cpu_memory.ENV]), view))
        if sys.stdout.isatty():  # vLLM writes into a pipe now: keep the terminal's colours
            env.setdefault("VLLM_LOGGING_COLOR", "1")
        self.vllm = Child("vLLM", self.vllm_cmd, env).start(tail_lines=_VLLM_TAIL_LINES)
        _say(f"vLLM pid {self.vllm.pid}: {' '.join(self.vllm_cmd)}")
        sidecar_env = self.sidecar_env(env)
        self.sidecar = Child("sidecar", [sys.executable, "-m", "ministream_sidecar"], sidecar_env)
        _say(f"sidecar pid {self.sidecar.start().pid}")
        _say(
            f"OpenAI API at {self.api_url}/v1 (ready when {self.sidecar_url}/readyz says 200); "
            f"metrics: {self.api_url}/metrics (vLLM), {self.sidecar_url}/metrics (sidecar)"
        )
        announced = False
        started = time.monotonic()
        while not self.signals:
            for child, other in ((self.vllm, "the sidecar"), (self.sidecar, "vLLM")):
                if (rc := child.returncode) is not None:
                    _say(f"{child.name} exited with status {rc}; stopping {other}")
                    self._stop_all(drain=False)
                    if child is self.vllm:
                        _say(self._vllm_exit(rc))
                    return rc if rc != 0 else 1
            if not announced and client.ready(self.sidecar_url):
                announced = True
                _say(
                    f"ready after {time.monotonic() - started:.1f}s: "
                    f"try curl {self.api_url}/v1/models"
                )
            time.sleep(_POLL_SECONDS)
        _say(f"got {signal.Signals(self.signals[0]).name}: draining, then stopping")
        self._stop_all(drain=True, drain_timeout=settings.drain_timeout_seconds)
        return 0

    def _vllm_exit(self, rc: int) -> str:
        """The last line after vLLM exited on its own: its reason, and for a refusal over
        memory what to set."""
        assert self.vllm is not None and self.vllm.tail is not None
        self.vllm.tail.wait(_TAIL_DRAIN_SECONDS)
        reason = exit_reason(self.vllm.tail.lines())
        if reason is None:
            return f"vLLM exited with status {rc} (its output is above)"
        line = f"vLLM exited with status {rc}: {reason}"
        if "memory" in reason.lower() and cpu_memory.is_cpu_build():
            seen = cpu_memory.view_in(reason) or cpu_memory.MemoryView.read()
            line += f" -- {cpu_memory.advice(seen)}"
        return line

    # --- stopping ------------------------------------------------------------------------
    def _stop_all(self, *, drain: bool, drain_timeout: float = 0.0) -> None:
        both_alive = all(c is not None and c.alive for c in (self.vllm, self.sidecar))
        if drain and both_alive:
            token = os.environ.get(f"{ENV_PREFIX}TOKEN") or None
            result = client.drain(self.sidecar_url, timeout=drain_timeout, token=token)
            if result.ok:
                _say(f"drain: {result.body}")
            else:
                _say(f"drain failed ({result.status}: {result.error}); stopping anyway")
        if self.vllm is not None:
            _stop(self.vllm, shutdown_timeout(self.vllm_cmd) + _VLLM_STOP_MARGIN_SECONDS)
        if self.sidecar is not None:
            _stop(self.sidecar, _SIDECAR_STOP_SECONDS)


def _stop(child: Child, grace: float) -> None:
    status = child.stop(grace)
    if child.killed:
        _say(f"{child.name} did not stop within {grace:.0f}s; killed it")
    _say(f"{child.name} stopped (status {status})")


def main(argv: list[str]) -> int:
    """Entry point of `ministream up` (the CLI passes the arguments after `up`)."""
    return Launcher(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
