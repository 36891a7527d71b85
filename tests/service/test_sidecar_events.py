"""Kubernetes Events. No API server runs on these machines, so a local HTTPS server stands in
for it (`FakeApiServer`): it speaks the one call the sidecar makes
(`POST /api/v1/namespaces/{ns}/events`) over TLS with a certificate of a throwaway CA, and
records what it was sent. The sidecar side is real: its httpx client, the CA file and the
token file of a projected service-account volume, the JSON it posts."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ministream_sidecar.events import (
    EventReason,
    EventRecorder,
    EventType,
    InClusterConfig,
    KubernetesEventRecorder,
    NullEventRecorder,
    build_event_recorder,
)
from ministream_sidecar.metrics import SidecarMetrics
from ministream_sidecar.settings import SidecarSettings
from ministream_testkit.waiting import wait_until_async

pytestmark = pytest.mark.network


def _tls_files(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a server certificate it signed for 127.0.0.1: (ca.crt, server.crt, server.key)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-kubernetes-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(2)
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = folder / "ca.crt", folder / "server.crt", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


@dataclass
class FakeApiServer:
    """Stands in for the Kubernetes API server: answers 201 with the event (or `status`)."""

    url: str
    status: int = 201
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture()
def api_server(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    """The fake API server and a service-account folder (token, ca.crt) that trusts it."""
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    ca_file, cert, key = _tls_files(tmp_path)
    (sa / "ca.crt").write_bytes(ca_file.read_bytes())
    (sa / "token").write_text("token-1\n")
    state = FakeApiServer(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(
                {"path": self.path, "authorization": self.headers["Authorization"], "body": body}
            )
            answer = json.dumps(body if state.status < 300 else {"kind": "Status"}).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    state.url = f"https://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, sa
    finally:
        server.shutdown()
        server.server_close()


def _recorder(server: FakeApiServer, sa: Path, metrics: SidecarMetrics) -> EventRecorder:
    host, port = server.url.removeprefix("https://").split(":")
    settings = SidecarSettings(
        pod_name="ms-0", pod_namespace="serving", pod_uid="uid-1", kubernetes_service_host=host
    )
    return build_event_recorder(
        settings, metrics, env={"KUBERNETES_SERVICE_PORT": port}, service_account_dir=sa
    )


def _emit(recorder: EventRecorder, *events: tuple[EventReason, str, EventType]) -> None:
    async def go() -> None:
        for reason, message, type_ in events:
            recorder.emit(reason, message, type_)
            await asyncio.sleep(0)
        await recorder.aclose()

    asyncio.run(go())


def test_event_names_the_pod(api_server: tuple[FakeApiServer, Path]) -> None:
    server, sa = api_server
    metrics = SidecarMetrics()
    recorder = _recorder(server, sa, metrics)
    assert isinstance(recorder, KubernetesEventRecorder)
    _emit(recorder, (EventReason.WARMUP_FAILED, "boom", EventType.WARNING))
    [request] = server.requests
    assert request["path"] == "/api/v1/namespaces/serving/events"
    assert request["authorization"] == "Bearer token-1"
    body = request["body"]
    assert (body["apiVersion"], body["kind"]) == ("v1", "Event")
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "ms-0",
        "namespace": "serving",
        "uid": "uid-1",
    }
    assert (body["reason"], body["type"], body["message"]) == ("WarmupFailed", "Warning", "boom")
    assert body["metadata"]["generateName"] == "ms-0."
    assert body["source"]["component"] == body["reportingComponent"] == "ministream-sidecar"
    assert body["count"] == 1 and body["firstTimestamp"].endswith("Z")
    assert metrics.kubernetes_events.labels("success")._value.get() == 1


def test_rotated_token_is_read_for_each_event(api_server: tuple[FakeApiServer, Path]) -> None:
    """The kubelet rotates projected tokens: every event carries the token file's content."""
    server, sa = api_server
    recorder = _recorder(server, sa, SidecarMetrics())

    async def go() -> None:
        recorder.emit(EventReason.DRAIN_STARTED, "draining")

        async def first_sent() -> bool:  # rotate only after the first event went out
            return len(server.requests) >= 1

        await wait_until_async(first_sent, timeout=30, what="the first event to reach the API")
        (sa / "token").write_text("token-2\n")
        recorder.emit(EventReason.DRAIN_FINISHED, "idle")
        await recorder.aclose()

    asyncio.run(go())
    assert [r["authorization"] for r in server.requests] == ["Bearer token-1", "Bearer token-2"]


def test_rbac_refusal_is_logged_and_counted_never_raised(
    api_server: tuple[FakeApiServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    server, sa = api_server
    server.status = 403
    metrics = SidecarMetrics()
    _emit(_recorder(server, sa, metrics), (EventReason.WARMUP_FAILED, "boom", EventType.WARNING))
    assert metrics.kubernetes_events.labels("failure")._value.get() == 1
    warnings = [r for r in caplog.records if "could not create Kubernetes event" in r.getMessage()]
    assert warnings and "403" in warnings[0].__dict__["error"]


def test_untrusted_api_server_is_a_failure(
    api_server: tuple[FakeApiServer, Path], tmp_path: Path
) -> None:
    """The server's certificate is checked against the service account's ca.crt."""
    server, sa = api_server
    (tmp_path / "other").mkdir()
    other_ca, _, _ = _tls_files(tmp_path / "other")
    (sa / "ca.crt").write_bytes(other_ca.read_bytes())
    metrics = SidecarMetrics()
    _emit(_recorder(server, sa, metrics), (EventReason.DRAIN_STARTED, "x", EventType.NORMAL))
    assert server.requests == []
    assert metrics.kubernetes_events.labels("failure")._value.get() == 1


def test_events_only_in_a_cluster(tmp_path: Path) -> None:
    metrics = SidecarMetrics()
    outside = SidecarSettings(pod_name="ms-0", pod_namespace="serving")
    assert isinstance(build_event_recorder(outside, metrics), NullEventRecorder)
    # In a cluster but without a service-account token: disabled with a warning, no crash.
    inside = SidecarSettings(
        pod_name="ms-0", pod_namespace="serving", kubernetes_service_host="10.0.0.1"
    )
    assert inside.in_kubernetes
    recorder = build_event_recorder(inside, metrics, service_account_dir=tmp_path)
    assert isinstance(recorder, NullEventRecorder)


def test_ipv6_service_host_is_bracketed(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    (tmp_path / "ca.crt").write_text("")
    config = InClusterConfig.load("fd00::1", {"KUBERNETES_SERVICE_PORT": "6443"}, tmp_path)
    assert config.api_url == "https://[fd00::1]:6443"
