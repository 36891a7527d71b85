"""A real S3-compatible server process for tests and benchmarks: moto in server mode.

`python -m ministream_testkit.s3_server --port P [--request-log F] [--delay-get S] [--delay-put S]
[--fast-ranges]` serves moto's S3 (and IAM) on 127.0.0.1 through werkzeug, the way
`moto_server` does, with a WSGI middleware that appends every request to a JSON-lines log
(method, key, Range header, status, body bytes sent) and can slow weight transfers down. The
log is how tests measure bytes served per object; the delays make "interrupted upload" and
"S3 server stopped during a load" land mid-transfer instead of racing a millisecond-long copy.

`--fast-ranges` (the load benchmark): moto 5.2 answers a ranged GET by copying the *whole*
object and slicing it (`FakeKey.value`), so an 8 MiB range of a 1.2 GB object costs 1.2 GB
of copying (measured ~3 s per request, and the Run:ai streamer's requests time out). With
the flag, a ranged GET of an existing object is answered from moto's stored bytes with a
seek; everything else still goes through moto.

`S3Server` (below) runs that process: free port, wait until it answers, stop by PID. With
`auth=True` moto checks SigV4 signatures and IAM policies (env INITIAL_NO_AUTH_ACTION_COUNT):
the first three calls create a user, its policy and its access key; every later request
must be signed with that key, so "wrong credentials" is a real refusal, not a mock.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from ministream_testkit.net import accepts, free_port
from ministream_testkit.processes import stop_process
from ministream_testkit.waiting import wait_until

REGION = "us-east-1"
_ALLOW_ALL_S3 = json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class RequestLog:
    """WSGI middleware: log each request; optionally delay weight GETs and all PUTs."""

    def __init__(
        self,
        app: WSGIApp,
        log_path: Path | None,
        delay_get: float,
        delay_put: float,
        fast_ranges: bool = False,
    ) -> None:
        self.app, self.delay_get, self.delay_put = app, delay_get, delay_put
        self.fast_ranges = fast_ranges
        self.lock = threading.Lock()
        self.log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterator[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        # When the request came: the log is written once the body is sent, so a request sent
        # after another's answer can be logged before it ("t" is that end).
        arrived = time.time()
        if method == "GET" and path.endswith(".safetensors") and self.delay_get:
            time.sleep(self.delay_get)
        if method == "PUT" and self.delay_put:
            time.sleep(self.delay_put)
        status: list[str] = []

        def _start(st: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            status.append(st)
            return start_response(st, headers, *exc)

        body = self._ranged_get(environ, _start) if self.fast_ranges else None
        sent = 0
        for chunk in body if body is not None else self.app(environ, _start):
            sent += len(chunk)
            yield chunk
        if self.log is not None:
            record = {
                "t": time.time(),
                "arrived": arrived,
                "method": method,
                "path": path,
                "query": environ.get("QUERY_STRING", ""),
                "range": environ.get("HTTP_RANGE"),
                "status": int(status[0].split()[0]) if status else 0,
                "bytes": sent,
                "client_port": environ.get("REMOTE_PORT"),
            }
            with self.lock:
                self.log.write(json.dumps(record) + "\n")

    @staticmethod
    def _ranged_get(environ: dict[str, Any], start_response: StartResponse) -> list[bytes] | None:
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", environ.get("HTTP_RANGE") or "")
        if environ["REQUEST_METHOD"] != "GET" or not match or environ.get("QUERY_STRING"):
            return None
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        bucket, _, key = unquote(environ.get("PATH_INFO", "")).lstrip("/").partition("/")
        try:
            obj = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, key)
        except Exception:  # missing bucket etc.: moto answers with the proper error
            return None
        if obj is None or int(match[1]) >= obj.size:
            return None
        start = int(match[1])
        end = min(int(match[2]) if match[2] else obj.size - 1, obj.size - 1)
        with obj.lock:
            obj._value_buffer.seek(start)
            data = obj._value_buffer.read(end - start + 1)
        start_response(
            "206 Partial Content",
            [
                ("Content-Type", "binary/octet-stream"),
                ("Content-Length", str(len(data))),
                ("Content-Range", f"bytes {start}-{end}/{obj.size}"),
                ("ETag", obj.etag),
                ("Accept-Ranges", "bytes"),
                ("Last-Modified", obj.last_modified_RFC1123),
            ],
        )
        return [data]


def serve(
    port: int, log_path: Path | None, delay_get: float, delay_put: float, fast_ranges: bool = False
) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = RequestLog(
        DomainDispatcherApplication(create_backend_app), log_path, delay_get, delay_put, fast_ranges
    )
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"s3 server on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


@dataclass
class S3Server:
    """One moto server process on loopback; `env()` is what clients need to reach it."""

    workdir: Path
    auth: bool = False
    delay_get: float = 0.0
    delay_put: float = 0.0
    fast_ranges: bool = False
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    access_key: str = "testing"
    secret_key: str = "testing"

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def request_log(self) -> Path:
        return self.workdir / f"s3-requests-{self.port}.jsonl"

    def env(
        self, *, access_key: str | None = None, secret_key: str | None = None
    ) -> dict[str, str]:
        """Standard AWS variables (boto3, the AWS C++ SDK inside runai-model-streamer)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": access_key or self.access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
        }

    def start(self) -> S3Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
        cmd = [
            sys.executable,
            "-m",
            "ministream_testkit.s3_server",
            "--port",
            str(self.port),
            "--request-log",
            str(self.request_log),
            "--delay-get",
            str(self.delay_get),
            "--delay-put",
            str(self.delay_put),
            *(["--fast-ranges"] * self.fast_ranges),
        ]
        log = open(self.workdir / f"s3-server-{self.port}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.workdir,
        )
        self._wait_ready()
        if self.auth:
            self._create_user()
        return self

    def _wait_ready(self, timeout: float = 30.0) -> None:
        def listening() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"S3 server exited with {self.process.returncode}")
            return accepts(self.port)

        wait_until(listening, timeout, what=f"the S3 server on port {self.port}")

    def _create_user(self) -> None:
        import boto3

        iam = boto3.client(
            "iam",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="ministream")
        iam.put_user_policy(UserName="ministream", PolicyName="s3", PolicyDocument=_ALLOW_ALL_S3)
        key = iam.create_access_key(UserName="ministream")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def requests(self) -> list[dict[str, Any]]:
        if not self.request_log.exists():
            return []
        return [
            json.loads(line) for line in self.request_log.read_text().splitlines() if line.strip()
        ]

    def stop(self) -> None:
        stop_process(self.process)

    def kill(self) -> None:
        """Stop abruptly (SIGKILL), as a crashed or partitioned store would."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--request-log", type=Path)
    parser.add_argument(
        "--delay-get",
        type=float,
        default=0.0,
        help="seconds to wait before each GET of a *.safetensors object",
    )
    parser.add_argument(
        "--delay-put",
        type=float,
        default=0.0,
        help="seconds to wait before each PUT (object or part)",
    )
    parser.add_argument(
        "--fast-ranges",
        action="store_true",
        help="answer ranged GETs with a seek instead of moto's full copy",
    )
    args = parser.parse_args(argv)
    serve(args.port, args.request_log, args.delay_get, args.delay_put, args.fast_ranges)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
