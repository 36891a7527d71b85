"""S3 access for upload, shard and the load guard: URLs, a client, listings, clear errors.

The endpoint and credentials come from the standard AWS chain that boto3 reads
(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`,
`~/.aws/config`, IRSA/instance roles), so any S3-compatible store works. vLLM's Run:ai
streamer reads the same variables (vLLM 0.32 copies `AWS_ENDPOINT_URL` into
`RUNAI_STREAMER_S3_ENDPOINT`); path-style stores also need
`RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0` there.

Every boto3 failure leaves this module as a `StorageError` that names the URL, the
endpoint and what to check.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ministream.errors import StorageError

SCHEME = "s3://"
# Checksum of each uploaded file, stored as user metadata (x-amz-meta-sha256): the same
# sha256 the manifest lists, so "already uploaded" is decided without downloading.
SHA256_META = "sha256"
_CREDENTIAL_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AuthorizationHeaderMalformed",
    "Forbidden",
    "403",
}


def is_s3(path: str | Path) -> bool:
    return isinstance(path, str) and path.lower().startswith(SCHEME)


@dataclass(frozen=True)
class S3Url:
    bucket: str
    prefix: str  # without leading or trailing "/"; "" is the bucket root

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def child(self, name: str) -> str:
        return f"{self}/{name}"

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}" if self.prefix else f"{SCHEME}{self.bucket}"


def parse_url(url: str) -> S3Url:
    if not is_s3(url):
        raise StorageError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len(SCHEME) :].partition("/")
    if not bucket:
        raise StorageError(f"{url!r} has no bucket name (expected s3://BUCKET/PREFIX)")
    return S3Url(bucket, prefix.strip("/"))


def endpoint() -> str:
    return (
        os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or "the default AWS S3 endpoint"
    )


def make_client(max_connections: int = 16) -> Any:
    """A boto3 S3 client from the standard AWS configuration chain."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StorageError(
            "S3 support is not installed: pip install 'ministream-serving[s3]'"
        ) from None
    config = Config(
        max_pool_connections=max_connections,
        connect_timeout=10,
        read_timeout=120,
        retries={"max_attempts": 5, "mode": "standard"},
    )
    return boto3.session.Session().client("s3", config=config)


@contextmanager
def storage_errors(url: S3Url | str, action: str) -> Iterator[None]:
    """Turn boto3/botocore exceptions into one-line StorageErrors that say what to check."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    try:
        yield
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code = str(err.get("Code", "?"))
        message = err.get("Message") or str(exc)
        if code in ("NoSuchBucket",):
            bucket = parse_url(str(url)).bucket if is_s3(str(url)) else url
            raise StorageError(
                f"{action} {url}: bucket {bucket!r} does not exist at {endpoint()}"
            ) from None
        if code in _CREDENTIAL_CODES:
            raise StorageError(
                f"{action} {url}: {endpoint()} refused the credentials ({code}: {message}). "
                "Check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and the "
                "bucket policy."
            ) from None
        raise StorageError(f"{action} {url}: {code}: {message}") from None
    except NoCredentialsError:
        raise StorageError(
            f"{action} {url}: no AWS credentials found (set "
            "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or a "
            "role)"
        ) from None
    except EndpointConnectionError as exc:
        raise StorageError(
            f"{action} {url}: cannot reach {endpoint()} ({exc}); check "
            "AWS_ENDPOINT_URL and the network"
        ) from None
    except BotoCoreError as exc:
        raise StorageError(f"{action} {url}: {type(exc).__name__}: {exc}") from None


@dataclass(frozen=True)
class ObjectInfo:
    size: int
    etag: str


def list_objects(client: Any, url: S3Url) -> dict[str, ObjectInfo]:
    """Objects under the prefix, by name relative to it (a missing bucket is an error)."""
    prefix = f"{url.prefix}/" if url.prefix else ""
    found: dict[str, ObjectInfo] = {}
    with storage_errors(url, "listing"):
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=url.bucket, Prefix=prefix)
        for page in pages:
            for obj in page.get("Contents", []):
                found[obj["Key"][len(prefix) :]] = ObjectInfo(obj["Size"], obj["ETag"].strip('"'))
    return found


def head(client: Any, url: S3Url, name: str) -> dict[str, Any] | None:
    """HEAD one object; None when it does not exist."""
    from botocore.exceptions import ClientError

    with storage_errors(url, f"reading {name} under"):
        try:
            meta: dict[str, Any] = client.head_object(Bucket=url.bucket, Key=url.key(name))
            return meta
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise


def read_bytes(client: Any, url: S3Url, name: str, byte_range: str | None = None) -> bytes | None:
    """GET one object (or a byte range of it); None when it does not exist."""
    from botocore.exceptions import ClientError

    kwargs: dict[str, Any] = {"Bucket": url.bucket, "Key": url.key(name)}
    if byte_range:
        kwargs["Range"] = byte_range
    with storage_errors(url, f"reading {name} under"):
        try:
            body: bytes = client.get_object(**kwargs)["Body"].read()
            return body
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise


def read_text(client: Any, url: S3Url, name: str) -> str | None:
    data = read_bytes(client, url, name)
    return None if data is None else data.decode()


def put_bytes(client: Any, url: S3Url, name: str, data: bytes, sha256: str) -> None:
    with storage_errors(url, f"writing {name} under"):
        client.put_object(
            Bucket=url.bucket, Key=url.key(name), Body=data, Metadata={SHA256_META: sha256}
        )


def delete(client: Any, url: S3Url, names: list[str]) -> None:
    with storage_errors(url, "deleting from"):
        for start in range(0, len(names), 1000):
            batch = [{"Key": url.key(n)} for n in names[start : start + 1000]]
            if batch:
                client.delete_objects(Bucket=url.bucket, Delete={"Objects": batch})


def download(client: Any, url: S3Url, names: list[str], dest: Path) -> None:
    with storage_errors(url, "downloading from"):
        for name in names:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(url.bucket, url.key(name), str(target))
