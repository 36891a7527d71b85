"""An S3 server with workload identity, for tests/loading/test_s3_workload_identity.py.

moto in server mode (as `ministream_testkit/s3_server.py` runs it), with SigV4 and IAM checks on
(`INITIAL_NO_AUTH_ACTION_COUNT=3`: an admin user, its policy and its key, then every request
must be signed by a known key and allowed by its policies), plus the two credential sources a
Kubernetes pod gets from its service account instead of static keys:

- STS `AssumeRoleWithWebIdentity` (IRSA, GKE/Azure federation through AWS): the call is
  unsigned in AWS and authenticated by the token alone. moto would demand a signature (its
  auth check fails on the missing Authorization header: HTTP 500), and it accepts any token.
  Here the call is checked as STS does, against the expected token and role, then served by
  moto's own STS with moto's signature check off for that one request. The credentials it
  issues are moto's: temporary keys with a session token, checked against the role's
  policies on every S3 request.
- The container credentials endpoint (EKS Pod Identity agent, ECS task roles):
  `GET /pod-identity/credentials` with `Authorization: <token>` answers a role session's keys
  as JSON, the way the agent does; a wrong token gets 401.

Every request is appended to a JSON-lines log with the access key id it was signed with and
whether it carried a session token, so a test can tell static keys from role sessions.
Requests are served one at a time: the STS exemption switches moto's process-wide auth flag.

`python -m tests.loading.identity_server --port P --token T --role-arn A --log F`
"""

from __future__ import annotations

import argparse
import io
import json
import re
import signal
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

CREDENTIALS_PATH = "/pod-identity/credentials"
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


class WorkloadIdentity:
    """WSGI middleware in front of moto: token-authenticated STS and the credentials endpoint."""

    def __init__(self, app: WSGIApp, token: str, role_arn: str, log_path: Path) -> None:
        self.app, self.token, self.role_arn = app, token, role_arn
        self.lock = threading.Lock()
        self.log = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the server

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        status: list[str] = []

        def _start(st: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            status.append(st)
            return start_response(st, headers, *exc)

        with self.lock:
            params = parse_qs(environ.get("QUERY_STRING", ""))
            if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
                # Query-protocol calls (STS) carry their parameters in a form body.
                body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                environ["wsgi.input"] = io.BytesIO(body)
                params |= parse_qs(body.decode("utf-8", "replace"))
            action = (params.get("Action") or [""])[0]
            if environ.get("PATH_INFO") == CREDENTIALS_PATH:
                out = self._container_credentials(environ, _start)
            elif action == "AssumeRoleWithWebIdentity":
                out = self._web_identity(params, environ, _start)
            else:
                out = list(self.app(environ, _start))
            auth = environ.get("HTTP_AUTHORIZATION", "")
            key = _CREDENTIAL.search(auth)
            record = {
                "method": environ["REQUEST_METHOD"],
                "path": environ.get("PATH_INFO", ""),
                "action": action,
                "access_key": key.group(1) if key else None,
                "session_token": "HTTP_X_AMZ_SECURITY_TOKEN" in environ,
                "status": int(status[0].split()[0]) if status else 0,
            }
            self.log.write(json.dumps(record) + "\n")
            return out

    def _web_identity(
        self, params: dict[str, list[str]], environ: dict[str, Any], start: StartResponse
    ) -> list[bytes]:
        from moto.core.authorization import disable_iam_authentication

        token = (params.get("WebIdentityToken") or [""])[0]
        role = (params.get("RoleArn") or [""])[0]
        if token != self.token:
            return _sts_error(start, "InvalidIdentityToken", "The web identity token is not valid")
        if role != self.role_arn:
            return _sts_error(start, "AccessDenied", f"Not authorized to assume {role}")
        with disable_iam_authentication():  # the token was the authentication
            return list(self.app(environ, start))

    def _container_credentials(self, environ: dict[str, Any], start: StartResponse) -> list[bytes]:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.sts.models import sts_backends

        if environ.get("HTTP_AUTHORIZATION") != self.token:
            start("401 Unauthorized", [("Content-Type", "application/json")])
            return [b'{"message": "invalid authorization token"}']
        session = sts_backends[DEFAULT_ACCOUNT_ID]["aws"].assume_role(
            region_name="us-east-1",
            role_session_name="pod-identity",
            role_arn=self.role_arn,
            policy="",
            duration=3600,
            external_id="",
        )
        expiration = datetime.now(UTC).replace(microsecond=0).timestamp() + 3600
        body = json.dumps(
            {
                "AccessKeyId": session.access_key_id,
                "SecretAccessKey": session.secret_access_key,
                "Token": session.session_token,
                "Expiration": datetime.fromtimestamp(expiration, UTC).strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                ),
            }
        ).encode()
        start("200 OK", [("Content-Type", "application/json")])
        return [body]


def _sts_error(start: StartResponse, code: str, message: str) -> list[bytes]:
    body = (
        '<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error>'
        f"<Type>Sender</Type><Code>{code}</Code><Message>{message}</Message>"
        "</Error><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>"
    ).encode()
    start("400 Bad Request", [("Content-Type", "text/xml"), ("Content-Length", str(len(body)))])
    return [body]


def serve(port: int, token: str, role_arn: str, log_path: Path) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = WorkloadIdentity(
        DomainDispatcherApplication(create_backend_app), token, role_arn, log_path
    )
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"identity server on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", required=True, help="the service account token to accept")
    parser.add_argument("--role-arn", required=True, help="the role the token may assume")
    parser.add_argument("--log", type=Path, required=True, help="JSON-lines request log")
    args = parser.parse_args(argv)
    serve(args.port, args.token, args.role_arn, args.log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
