"""Fetch LoRA adapters for a serving pod and admit only those that are safe to serve.

The chart's `fetch-adapters` init container runs `ministream fetch-adapters` before vLLM
starts. Each configured adapter (an `s3://` URL, read with the pod's S3 settings and
identity like the model, or a directory on the model volume) is copied into a staging
directory next to its destination and checked there:

- its manifest (`ministream verify`): every file's size and sha256, no stray weights;
- it is an adapter written for *this* base: the manifest's `base_model_hash` equals the
  served model's hash (`MINISTREAM_MODEL_HASH`, the chart's `model.hash`);
- `adapter_config.json`: a rank within `--max-rank` (vLLM's `--max-lora-rank`), a positive
  `lora_alpha`, and only target modules the MiniStream model has;
- every tensor finite (no NaN or Inf) and no value or `lora_alpha / r` scale above the
  converter's bound: the rules `convert-lora` applies (ministream.adapter_rules).

An admitted adapter is renamed into `<output-dir>/<name>` (atomic: vLLM never sees half an
adapter). A refused one is not written; the reason goes to `<output-dir>/.refused/<name>`
and to stderr, and the command still exits 0, so that the pod serves the base model and
the other adapters (`ministream_sidecar.serve_vllm` leaves the refused one out of vLLM's
`--lora-modules`; the sidecar reports it). Storage that cannot be reached is no verdict on
the adapter: the command fails and the kubelet retries the init container.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ministream import adapter_rules as rules
from ministream import s3
from ministream.atomic_file import write_atomic
from ministream.errors import CheckpointError
from ministream.manifest import MANIFEST_NAME, verify_dir
from ministream.names import RULES

REFUSED_DIR = ".refused"
MODEL_HASH_ENV = "MINISTREAM_MODEL_HASH"


def adapter_modules() -> frozenset[str]:
    """The linear modules of a MiniStream layer an adapter may target (from the name table)."""
    return frozenset(
        hf.removesuffix(".weight").rsplit(".", 1)[-1]
        for rule in RULES
        if rule.per_layer and rule.cols != "vec"
        for hf, _ in rule.parts
    )


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    uri: str

    @classmethod
    def parse(cls, text: str) -> AdapterSpec:
        name, sep, uri = text.partition("=")
        if not sep or not name or not uri:
            raise ValueError(f"--adapter {text!r}: expected NAME=URI (s3://... or a directory)")
        if "/" in name or name.startswith("."):
            raise ValueError(f"--adapter {text!r}: the name must not contain '/' or start with '.'")
        return cls(name, uri)


@dataclass(frozen=True)
class FetchOutcome:
    name: str
    path: Path | None  # None: refused
    reason: str | None = None


def _copy_in(uri: str, dest: Path) -> None:
    """Copy the adapter's files into `dest`; StorageError when the store cannot be read."""
    if s3.is_s3(uri):
        url = s3.parse_url(uri)
        client = s3.make_client()
        names = sorted(s3.list_objects(client, url))
        if not names:
            raise CheckpointError(f"{uri}: no objects under this prefix")
        s3.download(client, url, names, dest)
        return
    src = Path(uri)
    if not src.is_dir():
        raise CheckpointError(f"{uri}: not a directory on the model volume")
    for path in src.rglob("*"):
        if path.is_symlink():
            # A link could point anywhere on the node's volume; an adapter has no reason to.
            raise CheckpointError(f"{uri}: {path.relative_to(src)} is a symbolic link")
    shutil.copytree(src, dest, dirs_exist_ok=True)


def check_fetched_adapter(path: Path, *, max_rank: int, base_model_hash: str | None) -> None:
    """Every reason the converted adapter directory `path` must not be served, in one
    CheckpointError (none: it may be)."""
    manifest = verify_dir(path)
    problems: list[str] = []
    wanted = manifest.source.get("base_model_hash")
    if base_model_hash and wanted != base_model_hash:
        problems.append(
            f"made for base model {str(wanted)[:16]}, this pod serves {base_model_hash[:16]} "
            "(convert it against this base with `ministream convert-lora`)"
        )
    try:
        config = json.loads((path / rules.ADAPTER_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{rules.ADAPTER_CONFIG}: unreadable ({exc})") from None
    rank, alpha = config.get("r"), config.get("lora_alpha")
    problems += rules.reported(
        rules.rank_problem(
            rank, max_rank, field=f"{rules.ADAPTER_CONFIG} r", maximum="lora.maxRank"
        ),
        rules.alpha_problem(alpha, field=f"{rules.ADAPTER_CONFIG} lora_alpha"),
    )
    if rules.is_rank(rank) and rules.is_alpha(alpha):
        problems += rules.reported(rules.scale_problem(alpha, rank, field="lora_alpha"))
    targets = config.get("target_modules") or []
    unknown = sorted(set(targets) - adapter_modules())
    if unknown:
        problems.append(
            f"unknown target modules {', '.join(map(str, unknown))} "
            f"(MiniStream has {', '.join(sorted(adapter_modules()))})"
        )
    problems += _bad_values(path)
    if problems:
        raise CheckpointError("; ".join(problems))


def _bad_values(path: Path) -> list[str]:
    from safetensors import safe_open

    problems: list[str] = []
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                problems += rules.reported(rules.values_problem(key, fh.get_tensor(key)))
    return problems


def fetch_one(
    spec: AdapterSpec, output_dir: Path, *, max_rank: int, base_model_hash: str | None
) -> FetchOutcome:
    output_dir.mkdir(parents=True, exist_ok=True)
    refused = output_dir / REFUSED_DIR / spec.name
    target = output_dir / spec.name
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=output_dir))
    try:
        try:
            _copy_in(spec.uri, staging)
            if not (staging / MANIFEST_NAME).is_file():
                raise CheckpointError(
                    f"no {MANIFEST_NAME} (not written by `ministream convert-lora`)"
                )
            check_fetched_adapter(staging, max_rank=max_rank, base_model_hash=base_model_hash)
        except CheckpointError as exc:
            reason = f"adapter {spec.name!r} ({spec.uri}) refused: {exc}"
            write_atomic(refused, reason + "\n")
            if target.exists():  # left by an earlier run of this init container
                shutil.rmtree(target)
            return FetchOutcome(spec.name, None, reason)
        for p in [staging, *staging.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
        refused.unlink(missing_ok=True)
        return FetchOutcome(spec.name, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch_all(
    specs: list[AdapterSpec], output_dir: Path, *, max_rank: int, base_model_hash: str | None
) -> list[FetchOutcome]:
    names = [s.name for s in specs]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"adapter names must be unique: {', '.join(dupes)} repeated")
    return [
        fetch_one(s, output_dir, max_rank=max_rank, base_model_hash=base_model_hash) for s in specs
    ]
