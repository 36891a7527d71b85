"""A real HAProxy (Debian's package) standing in for the Kubernetes Service of the replicas.

How it follows readiness the way a Service does:
- one server per *slot* (a place a pod can run: an API port and a sidecar port); HAProxy's
  health check is the pod's readiness probe: GET /readyz on the sidecar port, every
  `probes.readiness.periodSeconds`, timing out after `timeoutSeconds`, DOWN after
  `failureThreshold` failures, UP after Kubernetes' default successThreshold of 1;
- a new pod enters the endpoints not ready (`set server … state ready; … health down`) and
  gets traffic only after its first passing probe;
- a terminating pod leaves the endpoints whatever its probe says (EndpointSlice marks it
  terminating): the orchestrator puts its server in DRAIN (no new requests, in-flight ones
  continue, as kube-proxy leaves established connections alone) after the endpoint
  propagation delay;
- no retries and no redispatch: a Service does not retry a request on another pod.
It balances per request (`mode http`), like an ingress or gateway in front of the Service.

The access log records each request's `x-request-id` (the engine sends one per request), the
server that took it and the status, so failures can be traced to a slot.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ministream_testkit.net import free_port

from .chart_pod import ChartPod

INSTALL_HINT = "HAProxy is not installed: run scripts/install_haproxy.sh (apt-get install haproxy)"
BACKEND = "replicas"
_LOG_RE = re.compile(
    r"rid=\{?(?P<rid>[^ }]*)\}? srv=(?P<srv>\S+) status=(?P<status>-?\d+) "
    r"ta=(?P<ta>-?\d+) term=(?P<term>\S+)"
)


def find_haproxy() -> str:
    for candidate in (shutil.which("haproxy"), "/usr/sbin/haproxy"):
        if candidate and Path(candidate).is_file():
            return candidate
    raise FileNotFoundError(INSTALL_HINT)


@dataclass(frozen=True)
class Slot:
    """Where one pod runs: its address (127.0.0.1 for local processes, the pod's own IP for
    podman pods), its vLLM API port and its sidecar port."""

    index: int
    api_port: int
    sidecar_port: int
    host: str = "127.0.0.1"
    # Where the sidecar listens when not at `host`: a local pod on its own loopback address
    # keeps its sidecar on 127.0.0.1, where the rendered preStop command finds it.
    sidecar_host: str | None = None

    @property
    def server(self) -> str:
        return f"slot{self.index}"

    @property
    def sidecar_url(self) -> str:
        return f"http://{self.sidecar_host or self.host}:{self.sidecar_port}"


@dataclass(frozen=True)
class AccessLogEntry:
    request_id: str
    server: str  # "<NOSRV>" when HAProxy had no server for it
    status: int
    total_ms: int
    termination: str  # HAProxy's two-letter session state, "--" for a normal end


def render_config(
    *,
    frontend_port: int,
    socket_path: Path,
    slots: list[Slot],
    enabled: set[int],
    probe: ChartPod,
) -> str:
    readiness = probe.readiness_probe
    servers = []
    for slot in slots:
        disabled = "" if slot.index in enabled else " disabled"
        servers.append(
            f"  server {slot.server} {slot.host}:{slot.api_port} check port {slot.sidecar_port} "
            f"inter {readiness.period_seconds:g}s "
            f"fall {readiness.failure_threshold} "
            f"rise {readiness.success_threshold}{disabled}"
        )
    return "\n".join(
        [
            "global",
            f"  stats socket {socket_path} mode 600 level admin",
            "  log stdout format raw local0 info",
            "  nbthread 1",
            "defaults",
            "  mode http",
            "  log global",
            '  log-format "rid=%[capture.req.hdr(0)] srv=%s status=%ST ta=%Ta term=%ts"',
            "  timeout connect 3s",
            "  timeout client 600s",
            "  timeout server 600s",
            # Longer than any client keeps an idle connection (the engine's aiohttp pool: 60 s),
            # so the client always closes first: the other order races a new request against
            # the close and drops it ("Server disconnected"), a harness fault, not the service's.
            "  timeout http-keep-alive 600s",
            # A Kubernetes Service neither retries nor moves a failed request to another pod.
            "  retries 0",
            # A new server connection per request: no idle HAProxy->vLLM connection that vLLM's
            # 5 s keep-alive timeout (VLLM_HTTP_TIMEOUT_KEEP_ALIVE) could close under a request.
            "  option http-server-close",
            "frontend api",
            f"  bind 127.0.0.1:{frontend_port}",
            "  capture request header x-request-id len 96",
            f"  default_backend {BACKEND}",
            f"backend {BACKEND}",
            "  balance roundrobin",
            "  option httpchk GET /readyz",
            "  http-check expect status 200",
            f"  timeout check {readiness.timeout_seconds:g}s",
            *servers,
            "",
        ]
    )


class HAProxy:
    name = "haproxy"

    def __init__(
        self, workdir: Path, slots: list[Slot], enabled: set[int], probe: ChartPod
    ) -> None:
        self.binary = find_haproxy()
        self.workdir = workdir
        self.slots = slots
        self.port = free_port()
        # Absolute: HAProxy reads a relative `stats socket` path as a host:port address.
        self.socket_path = workdir.resolve() / "haproxy.sock"
        self.config_path = workdir / "haproxy.cfg"
        self.log_path = workdir / "haproxy.log"
        self.config_path.write_text(
            render_config(
                frontend_port=self.port,
                socket_path=self.socket_path,
                slots=slots,
                enabled=enabled,
                probe=probe,
            )
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> HAProxy:
        check = subprocess.run(
            [self.binary, "-c", "-f", str(self.config_path)], capture_output=True, text=True
        )
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refused its config:\n{check.stdout}{check.stderr}")
        # A socket left by an earlier run in this workdir would pass the wait below at once.
        self.socket_path.unlink(missing_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - owned by the child process
        self.proc = subprocess.Popen(
            [self.binary, "-db", "-f", str(self.config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not self.socket_path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haproxy did not start:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        return self

    def command(self, line: str) -> str:
        """One runtime-API command line (several may be joined with `;`)."""
        with self._lock, socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode()

    def states(self) -> dict[str, str]:
        """Server name -> HAProxy status (UP, DOWN, MAINT, DRAIN, 'UP 1/2', ...)."""
        out: dict[str, str] = {}
        for line in self.command("show stat").splitlines():
            fields = line.split(",")
            if len(fields) > 17 and fields[0] == BACKEND and fields[1] != "BACKEND":
                out[fields[1]] = fields[17]
        return out

    def mark_unready(self, slot: Slot) -> None:
        """Forget the server's health: UP again only after a passing check. (HAProxy starts
        servers UP before their first check; a pod is not ready before its first probe.)"""
        self.command(f"set server {BACKEND}/{slot.server} health down")

    def add_endpoint(self, slot: Slot) -> None:
        """A new pod: in the endpoints, not ready until its first passing probe."""
        self.command(
            f"set server {BACKEND}/{slot.server} state ready; "
            f"set server {BACKEND}/{slot.server} health down"
        )

    def remove_endpoint(self, slot: Slot) -> None:
        """A terminating pod: no new requests; requests in flight run on."""
        self.command(f"set server {BACKEND}/{slot.server} state drain")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)  # soft stop: finish, then exit
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def describe(self, t0: float) -> dict[str, Any]:
        """The front for the report (`t0`: the run's time origin; HAProxy's events are the
        StateWatcher's)."""
        return {
            "name": self.name,
            "config": str(self.config_path),
            "failure_tracing": "HAProxy's access log (the x-request-id of each request)",
        }

    def access_log(self) -> dict[str, AccessLogEntry]:
        entries: dict[str, AccessLogEntry] = {}
        with contextlib.suppress(FileNotFoundError):
            for line in self.log_path.read_text(errors="replace").splitlines():
                if m := _LOG_RE.search(line):
                    entries[m["rid"]] = AccessLogEntry(
                        request_id=m["rid"],
                        server=m["srv"],
                        status=int(m["status"]),
                        total_ms=int(m["ta"]),
                        termination=m["term"],
                    )
        return entries


class ServerStates(Protocol):
    """What the StateWatcher polls: each server's state (HAProxy's words: UP, DOWN, DRAIN,
    MAINT, ...)."""

    def states(self) -> dict[str, str]: ...


class StateWatcher:
    """Polls the load balancer's view of every server; keeps each change with its
    perf_counter() time."""

    def __init__(
        self,
        haproxy: ServerStates,
        interval: float = 0.25,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.haproxy = haproxy
        self.interval = interval
        self.clock = clock
        self.current: dict[str, str] = {}
        self.changes: list[tuple[float, str, str, str]] = []  # (t, server, before, after)
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StateWatcher:
        self._poll()
        self._thread.start()
        return self

    def _poll(self) -> None:
        states = self.haproxy.states()
        now = self.clock()
        with self._changed:
            for server, state in states.items():
                before = self.current.get(server)
                if before != state:
                    self.changes.append((now, server, before or "", state))
            self.current = states
            self._changed.notify_all()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OSError):
                self._poll()

    def wait_for(self, predicate: Callable[[dict[str, str]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate(self.current):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 1.0))
        return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
