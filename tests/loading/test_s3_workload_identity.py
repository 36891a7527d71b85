"""S3 without static keys: the credentials a Kubernetes pod gets from its service account.

The server is tests/loading/identity_server.py: moto with SigV4 and IAM checks on, plus STS
`AssumeRoleWithWebIdentity` authenticated by its token (IRSA, and GKE/Azure federation into
AWS) and a container credentials endpoint (EKS Pod Identity). Its request log records which
key signed each request, so every test can tell a role session's temporary key (ASIA…, with a
session token) from a static one.

Each process gets what the chart renders for the vLLM container in `runaiStreamer` mode with
no key Secret (the plain env values of `helm template`), plus what the identity webhook injects
(IRSA: AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE, AWS_STS_REGIONAL_ENDPOINTS; Pod Identity:
AWS_CONTAINER_CREDENTIALS_FULL_URI, AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE). No static key.
AWS_EC2_METADATA_DISABLED=true is added for these test processes only, so nothing can fall
through to a metadata service of the machine running the tests (loopback only); the chart
itself leaves instance metadata on.

Findings (runai-model-streamer 0.17.1, the version vLLM 0.32 uses here):
- boto3 (`ministream upload`, `ministream.s3`, and the streamer's own listing and file pulls)
  resolves web identity and container credentials against the configured endpoint.
- The streamer's C++ reader, with its default `RUNAI_STREAMER_NO_BOTO3_SESSION=1`, resolves web
  identity itself through aws-c-auth, which asks `sts.<region>.amazonaws.com` and ignores
  AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_STS: against any other STS it falls back to unsigned
  requests (`test_streamer_own_chain_ignores_the_sts_endpoint` reproduces it). The chart
  therefore sets `RUNAI_STREAMER_NO_BOTO3_SESSION=0` without a key Secret: the streamer takes
  the credentials boto3 resolved. Its C++ chain does read container credentials (EKS Pod
  Identity) on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ministream_reference.golden import reference_completions
from ministream_testkit.helm import render
from ministream_testkit.net import accepts, free_port
from ministream_testkit.processes import stop_process
from ministream_testkit.waiting import wait_until
from tests.loading.helpers import PROMPTS, assert_same_tokens, serve

pytestmark = [pytest.mark.network]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ministream"
REGION = "us-east-1"
BUCKET = "models"
ROLE_ARN = "arn:aws:iam::123456789012:role/ministream-models"  # moto's default account
# What a projected service account token looks like (a JWT); STS here accepts exactly this one.
TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6c2VydmluZzptcyJ9.c2ln"
ALLOW_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@dataclass
class IdentityServer:
    endpoint: str
    log: Path
    process: subprocess.Popen[bytes]

    def requests(self, since: int = 0) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()[since:]]

    def mark(self) -> int:
        return len(self.log.read_text().splitlines())


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IdentityServer]:
    """The server, an admin (the three unauthenticated calls), the role and the bucket."""
    import boto3

    workdir = tmp_path_factory.mktemp("identity")
    port = free_port()
    env = {
        **os.environ,
        "MOTO_ALLOW_NONEXISTENT_REGION": "true",
        "INITIAL_NO_AUTH_ACTION_COUNT": "3",
    }
    cmd = [
        sys.executable,
        "-m",
        "tests.loading.identity_server",
        "--port",
        str(port),
        "--token",
        TOKEN,
        "--role-arn",
        ROLE_ARN,
        "--log",
        str(workdir / "requests.jsonl"),
    ]
    with open(workdir / "server.log", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = IdentityServer(f"http://127.0.0.1:{port}", workdir / "requests.jsonl", proc)
    try:
        wait_until(
            lambda: proc.poll() is None and accepts(port),
            30,
            what="the identity server",
            detail=lambda: (workdir / "server.log").read_text(),
        )
        bootstrap = {"endpoint_url": server.endpoint, "region_name": REGION}
        iam = boto3.client("iam", aws_access_key_id="x", aws_secret_access_key="x", **bootstrap)
        iam.create_user(UserName="admin")
        iam.put_user_policy(
            UserName="admin",
            PolicyName="all",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
                }
            ),
        )
        key = iam.create_access_key(UserName="admin")["AccessKey"]
        admin = {
            "aws_access_key_id": key["AccessKeyId"],
            "aws_secret_access_key": key["SecretAccessKey"],
            **bootstrap,
        }
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "sts:AssumeRoleWithWebIdentity",
                    "Principal": {
                        "Federated": "arn:aws:iam::123456789012:oidc-provider/oidc.cluster"
                    },
                }
            ],
        }
        role = boto3.client("iam", **admin).create_role(
            RoleName="ministream-models", AssumeRolePolicyDocument=json.dumps(trust)
        )["Role"]
        assert role["Arn"] == ROLE_ARN
        boto3.client("iam", **admin).put_role_policy(
            RoleName="ministream-models", PolicyName="s3", PolicyDocument=json.dumps(ALLOW_S3)
        )
        boto3.client("s3", **admin).create_bucket(Bucket=BUCKET)
        yield server
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def vllm_container(identity: IdentityServer) -> dict[str, Any]:
    """The vLLM container as the chart renders it in `runaiStreamer` mode without a key Secret."""
    sets = [
        "apiKey.enabled=false",
        "loading.mode=runaiStreamer",
        f"loading.s3.bucket={BUCKET}",
        f"loading.s3.region={REGION}",
        f"loading.s3.endpoint={identity.endpoint}",
        "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=" + ROLE_ARN,
    ]
    docs = render(CHART, set_args=sets, namespace="serving")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (vllm,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"
    ]
    return vllm


@pytest.fixture(scope="module")
def chart_env(vllm_container: dict[str, Any]) -> dict[str, str]:
    """The vLLM container's plain environment (no key Secret)."""
    return {e["name"]: e["value"] for e in vllm_container["env"] if "value" in e}


LOADER_FLAGS = ("--load-format", "--model-loader-extra-config")


def chart_loader_args(vllm_container: dict[str, Any]) -> list[str]:
    """The loader flags the chart passes to vLLM (the load format and the streamer's
    concurrency and memory limit), each with its value."""
    args = [str(a) for a in vllm_container["args"]]
    picked = [[flag, args[args.index(flag) + 1]] for flag in LOADER_FLAGS]
    return [item for pair in picked for item in pair]


def test_chart_renders_no_keys_and_keeps_instance_metadata(chart_env: dict[str, str]) -> None:
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(chart_env)
    assert "AWS_EC2_METADATA_DISABLED" not in chart_env
    assert chart_env["RUNAI_STREAMER_NO_BOTO3_SESSION"] == "0"


def _pod_env(
    chart_env: dict[str, str], tmp_path: Path, token: str, **identity: str
) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "RUNAI_STREAMER_"))}
    token_file = tmp_path / f"token-{hashlib.sha256(token.encode()).hexdigest()[:8]}"
    token_file.write_text(token)
    injected = {k: v.format(token_file=token_file) for k, v in identity.items()}
    return {**clean, **chart_env, **injected, "AWS_EC2_METADATA_DISABLED": "true"}


def irsa(chart_env: dict[str, str], tmp_path: Path, token: str = TOKEN) -> dict[str, str]:
    """What the EKS pod identity webhook injects for IRSA."""
    return _pod_env(
        chart_env,
        tmp_path,
        token,
        AWS_ROLE_ARN=ROLE_ARN,
        AWS_WEB_IDENTITY_TOKEN_FILE="{token_file}",
        AWS_STS_REGIONAL_ENDPOINTS="regional",
    )


def pod_identity(
    chart_env: dict[str, str], tmp_path: Path, endpoint: str, token: str = TOKEN
) -> dict[str, str]:
    """What EKS Pod Identity injects (its agent listens on 169.254.170.23; loopback here)."""
    return _pod_env(
        chart_env,
        tmp_path,
        token,
        AWS_CONTAINER_CREDENTIALS_FULL_URI=f"{endpoint}/pod-identity/credentials",
        AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE="{token_file}",
    )


def ministream(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ministream.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _to_bucket(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in requests if r["path"].startswith(f"/{BUCKET}")]


def _s3_requests(server: IdentityServer, since: int) -> list[dict[str, Any]]:
    return _to_bucket(server.requests(since))


def _assert_role_session(requests: list[dict[str, Any]]) -> None:
    """Every request signed with a role session's temporary key and authorized by the role's
    policy (a 404 for an object not uploaded yet is answered after authorization)."""
    assert requests
    for r in requests:
        assert r["access_key"] and r["access_key"].startswith("ASIA"), r
        assert r["session_token"] and r["status"] not in (401, 403) and r["status"] < 500, r


@dataclass
class IrsaUpload:
    url: str
    env: dict[str, str]
    requests: list[dict[str, Any]]  # what the identity server logged during the upload


@pytest.fixture(scope="module")
def irsa_upload(
    identity: IdentityServer,
    chart_env: dict[str, str],
    model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> IrsaUpload:
    """`ministream upload` with IRSA, once: its requests are checked, its objects streamed."""
    url = f"s3://{BUCKET}/wi/tiny"
    env = irsa(chart_env, tmp_path_factory.mktemp("uploader"))
    since = identity.mark()
    up = ministream("upload", str(model_dir), url, "--quiet", env=env)
    assert up.returncode == 0, up.stderr
    return IrsaUpload(url, env, identity.requests(since))


def test_upload_and_reads_with_web_identity(
    identity: IdentityServer, irsa_upload: IrsaUpload, model_dir: Path
) -> None:
    log = irsa_upload.requests
    assert [r["status"] for r in log if r["action"] == "AssumeRoleWithWebIdentity"] == [200]
    _assert_role_session(_to_bucket(log))
    # Again: it reads the remote manifest and objects back, finds them complete, writes nothing.
    since = identity.mark()
    again = ministream("upload", str(model_dir), irsa_upload.url, "--quiet", env=irsa_upload.env)
    assert again.returncode == 0, again.stderr
    reads = _s3_requests(identity, since)
    _assert_role_session(reads)
    assert {r["method"] for r in reads} <= {"GET", "HEAD"}


def test_a_wrong_token_gets_no_credentials(
    identity: IdentityServer, chart_env: dict[str, str], model_dir: Path, tmp_path: Path
) -> None:
    since = identity.mark()
    up = ministream(
        "upload",
        str(model_dir),
        f"s3://{BUCKET}/wi/refused",
        "--quiet",
        env=irsa(chart_env, tmp_path, token="eyJ.someone-else.sig"),
    )
    assert up.returncode != 0
    assert "InvalidIdentityToken" in up.stderr + up.stdout
    log = identity.requests(since)
    assert [r["status"] for r in log if r["action"] == "AssumeRoleWithWebIdentity"] == [400]
    assert not _s3_requests(identity, since)


@pytest.fixture(scope="module")
def uploaded(irsa_upload: IrsaUpload) -> str:
    return irsa_upload.url


# Streams the files named on its command line; prints {tensor name: sha256 of its bytes}.
STREAM = """
import hashlib, json, sys, torch
from runai_model_streamer import SafetensorsStreamer
def digest(t):
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
with SafetensorsStreamer() as streamer:
    streamer.stream_files(sys.argv[1:])
    print(json.dumps({name: digest(t) for name, t in streamer.get_tensors()}))
"""


def digest(tensor: Any) -> str:
    """sha256 of a tensor's bytes (as STREAM computes it)."""
    import torch

    raw = tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()


def _local_digests(model_dir: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    return {
        name: digest(t)
        for path in sorted(model_dir.glob("*.safetensors"))
        for name, t in load_file(path).items()
    }


def stream(url: str, model_dir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    files = [f"{url}/{p.name}" for p in sorted(model_dir.glob("*.safetensors"))]
    return subprocess.run(
        [sys.executable, "-c", STREAM, *files],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_runai_streamer_reads_with_web_identity(
    identity: IdentityServer,
    chart_env: dict[str, str],
    uploaded: str,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """The chart's env (RUNAI_STREAMER_NO_BOTO3_SESSION=0): boto3 resolves the role session,
    the C++ reader streams every tensor with it."""
    since = identity.mark()
    proc = stream(uploaded, model_dir, irsa(chart_env, tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == _local_digests(model_dir)
    gets = [r for r in _s3_requests(identity, since) if r["method"] == "GET"]
    _assert_role_session(gets)


def test_streamer_own_chain_ignores_the_sts_endpoint(
    identity: IdentityServer,
    chart_env: dict[str, str],
    uploaded: str,
    model_dir: Path,
    tmp_path: Path,
) -> None:
    """Reproduction of why the chart sets RUNAI_STREAMER_NO_BOTO3_SESSION=0: with the
    library's default (1), the C++ reader's web-identity provider never calls the configured
    STS (AWS_ENDPOINT_URL, and AWS_ENDPOINT_URL_STS too) and reads unsigned, refused.
    If this starts passing the other way, the chart's workaround can go."""
    env = {
        **irsa(chart_env, tmp_path),
        "RUNAI_STREAMER_NO_BOTO3_SESSION": "1",
        "AWS_ENDPOINT_URL_STS": identity.endpoint,
    }
    since = identity.mark()
    proc = stream(uploaded, model_dir, env)
    assert proc.returncode != 0
    log = identity.requests(since)
    assert not [r for r in log if r["action"] == "AssumeRoleWithWebIdentity"]
    gets = [r for r in _s3_requests(identity, since) if r["method"] == "GET"]
    assert gets and all(r["access_key"] is None and r["status"] == 403 for r in gets), gets


@pytest.mark.parametrize("boto3_session", ["0", "1"], ids=["chart-env", "streamer-own-chain"])
def test_pod_identity_container_credentials(
    identity: IdentityServer,
    chart_env: dict[str, str],
    uploaded: str,
    model_dir: Path,
    tmp_path: Path,
    boto3_session: str,
) -> None:
    """EKS Pod Identity: both boto3 and the streamer's own C++ chain read the container
    credentials endpoint, with the pod's token; a wrong token gets nothing."""
    env = {
        **pod_identity(chart_env, tmp_path, identity.endpoint),
        "RUNAI_STREAMER_NO_BOTO3_SESSION": boto3_session,
    }
    since = identity.mark()
    proc = stream(uploaded, model_dir, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == _local_digests(model_dir)
    log = identity.requests(since)
    assert any(r["path"] == "/pod-identity/credentials" and r["status"] == 200 for r in log)
    _assert_role_session([r for r in _s3_requests(identity, since) if r["method"] == "GET"])
    bad = {
        **pod_identity(chart_env, tmp_path, identity.endpoint, token="not-the-pod-token"),
        "RUNAI_STREAMER_NO_BOTO3_SESSION": boto3_session,
    }
    since = identity.mark()
    assert stream(uploaded, model_dir, bad).returncode != 0
    assert not [r for r in _s3_requests(identity, since) if r["status"] < 400]


@pytest.mark.engine
@pytest.mark.timeout(3600)
def test_vllm_serves_from_s3_with_web_identity(
    identity: IdentityServer,
    vllm_container: dict[str, Any],
    chart_env: dict[str, str],
    uploaded: str,
    model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole path: vLLM's runai_streamer loader (listing and config pulls by boto3,
    weights by the C++ reader) with the chart's env, loader flags (the streamer's concurrency
    and memory limit through --model-loader-extra-config) and IRSA, and the greedy tokens of
    the reference model.

    This is also docs/loading.md's `runai_streamer` path from S3, the one of its paths that
    test_paths.py does not serve: the local TP=1 load gives these reference tokens too
    (test_paths.py::test_local_tp1_matches_the_reference_model), and the C++ reader signing
    with a static key is served there (test_runai_streamer_sharded_tp2_from_s3)."""
    for key in list(os.environ):
        if key.startswith(("AWS_", "RUNAI_STREAMER_")):
            monkeypatch.delenv(key)  # the server inherits this process's environment
    env = {
        k: v
        for k, v in irsa(chart_env, tmp_path).items()
        if k.startswith(("AWS_", "RUNAI_STREAMER_"))
    }
    env["VLLM_ASSETS_CACHE"] = str(tmp_path / "assets")
    since = identity.mark()
    served = serve(
        uploaded, tmp_path / "vllm.log", env=env, extra_args=chart_loader_args(vllm_container)
    )
    assert "runai" in served.log.lower()
    assert_same_tokens(reference_completions(model_dir, PROMPTS, 16), served.completions)
    _assert_role_session([r for r in _s3_requests(identity, since) if r["method"] == "GET"])
