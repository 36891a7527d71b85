"""A stand-in for the one thing vLLM's router asks of a Kubernetes API server: a LIST and a
WATCH of a namespace's pods (its `--service-discovery`). No API server runs on these
machines, so this serves the pods a test or an experiment declares, each with its labels,
address, readiness and deletion, and streams every change to every open watch as the API
server would (ADDED, MODIFIED, DELETED events, one JSON object per chunk). The router does
its own label selection, its own health checks and its own routing; only the cluster's view
of the pods is played here.

    api = StandInKubeApi("serving").start()
    api.apply(StandInPod("p0", labels, "127.0.0.2", ready=True))
    env = {"KUBECONFIG": str(api.write_kubeconfig(tmp / "kubeconfig"))}
    ...
    api.apply(StandInPod("p0", labels, "127.0.0.2", ready=True, deleting=True))
    api.stop()
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

# Any deletion timestamp: the router reads only whether the field is there.
_DELETION_TIMESTAMP = "2026-01-01T00:00:00Z"


@dataclass(frozen=True)
class StandInPod:
    """A pod as the API server reports it: Running, at `ip`, Ready or not, being deleted or
    not (a pod with a deletionTimestamp, as during its termination grace period)."""

    name: str
    labels: dict[str, str]
    ip: str
    ready: bool = False
    deleting: bool = False

    def manifest(self, namespace: str, version: int) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": namespace,
            "uid": self.name,
            "resourceVersion": str(version),
            "labels": dict(self.labels),
        }
        if self.deleting:
            meta["deletionTimestamp"] = _DELETION_TIMESTAMP
        condition = {"type": "Ready", "status": "True" if self.ready else "False"}
        status = {"phase": "Running", "podIP": self.ip, "conditions": [condition]}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


@dataclass
class StandInKubeApi:
    namespace: str
    version: int = 100
    _pods: dict[str, StandInPod] = field(default_factory=dict)
    _watches: list[queue.Queue[dict[str, Any]]] = field(default_factory=list)
    _history: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _closed: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the stand-in API first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> StandInKubeApi:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._closed.set()  # open watches end their stream
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that points a client (the router, through KUBECONFIG) here."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": "stand-in"}}],
            "contexts": [
                {"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in"}}
            ],
            "current-context": "stand-in",
        }
        path.write_text(json.dumps(config))
        return path

    # --- the cluster's changes -----------------------------------------------------------
    def apply(self, pod: StandInPod) -> None:
        """Create or change a pod: ADDED the first time, MODIFIED after."""
        with self._lock:
            kind = "MODIFIED" if pod.name in self._pods else "ADDED"
            self._pods[pod.name] = pod
            self._publish(kind, pod)

    def set(self, name: str, *, ready: bool | None = None, deleting: bool | None = None) -> None:
        """Change a pod's readiness or deletion (`ready=False`, `deleting=True`)."""
        with self._lock:
            pod = self._pods[name]
        ready = pod.ready if ready is None else ready
        self.apply(
            replace(pod, ready=ready, deleting=pod.deleting if deleting is None else deleting)
        )

    def delete(self, name: str) -> None:
        """The pod is gone (its containers have exited): DELETED, after the MODIFIED that marks
        it for deletion if it was not marked yet (the API server's graceful deletion always
        sets the deletion timestamp first)."""
        with self._lock:
            pod = self._pods.pop(name, None)
            if pod is None:
                return
            if not pod.deleting:
                pod = replace(pod, deleting=True)
                self._publish("MODIFIED", pod)
            self._publish("DELETED", pod)

    def _publish(self, kind: str, pod: StandInPod) -> None:
        """Under `_lock`: a new resource version, the event to every open watch."""
        self.version += 1
        event = {"type": kind, "object": pod.manifest(self.namespace, self.version)}
        self._history.append((self.version, event))
        for watch in self._watches:
            watch.put(event)

    # --- what the handler serves ---------------------------------------------------------
    def listing(self) -> dict[str, Any]:
        with self._lock:
            items = [p.manifest(self.namespace, self.version) for p in self._pods.values()]
            meta = {"resourceVersion": str(self.version)}
        return {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items}

    def open_watch(self, since: int | None) -> queue.Queue[dict[str, Any]]:
        """A new watch's queue, first holding every change after resource version `since`
        (the version of the LIST the client read), as the API server replays them."""
        watch: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            for version, event in self._history:
                if since is not None and version > since:
                    watch.put(event)
            self._watches.append(watch)
        return watch

    def close_watch(self, watch: queue.Queue[dict[str, Any]]) -> None:
        with self._lock:
            if watch in self._watches:
                self._watches.remove(watch)


def _handler(api: StandInKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            if not self.path.startswith(f"/api/v1/namespaces/{api.namespace}/pods"):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if "watch=true" not in self.path:  # a LIST
                body = json.dumps(api.listing()).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            query = parse_qs(urlsplit(self.path).query)
            since = query.get("resourceVersion", [""])[0]
            self._stream(api.open_watch(int(since) if since.isdigit() else None))

        def _stream(self, watch: queue.Queue[dict[str, Any]]) -> None:
            """A watch: one JSON event per chunk, for as long as the client keeps it open
            (changes made before it opened are in the LIST the client read first)."""
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while not api._closed.is_set():
                    try:
                        event = watch.get(timeout=1)
                    except queue.Empty:
                        continue
                    line = (json.dumps(event) + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
            except OSError:  # the client closed the watch
                pass
            finally:
                api.close_watch(watch)

    return Handler
