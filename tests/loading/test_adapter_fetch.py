"""`ministream fetch-adapters`, the pod's init step for LoRA adapters (chart: fetch-adapters).

Real adapters from `ministream convert-lora` for the tiny model, one read from the real S3
server (moto, signatures on) and one from a directory; hostile ones are the good adapter
rewritten the way a hostile producer would, with a manifest that matches the bad files, so
only the content checks can catch them. A refused adapter is left out and named, the command
still succeeds, and the good ones are admitted whole.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from ministream.adapter_fetch import REFUSED_DIR, AdapterSpec, fetch_all
from ministream.manifest import MANIFEST_NAME, Manifest, verify_dir
from tests.loading.conftest import BUCKET, run_cli
from tests.support.hostile_adapters import resealed, weights_file, with_nan
from tests.support.models import ModelFactory

RANK = 8
TARGETS = ("attn.Wqkv", "mlp.w12")


@pytest.fixture(scope="module")
def adapter(models: ModelFactory, tiny_model_dir: Path) -> Path:
    return models.adapter(tiny_model_dir, rank=RANK, targets=TARGETS)[1]


@pytest.fixture(scope="module")
def base_hash(tiny_model_dir: Path) -> str:
    return Manifest.load(tiny_model_dir).model_hash


def _unknown_target(d: Path) -> None:
    config = json.loads((d / "adapter_config.json").read_text())
    config["target_modules"] = [*config["target_modules"], "lm_head"]
    (d / "adapter_config.json").write_text(json.dumps(config))


def _alpha(value: object) -> Callable[[Path], None]:
    def edit(d: Path) -> None:
        config = json.loads((d / "adapter_config.json").read_text())
        config["lora_alpha"] = value
        (d / "adapter_config.json").write_text(json.dumps(config))

    return edit


def _other_base(d: Path) -> None:
    raw = json.loads((d / MANIFEST_NAME).read_text())
    raw["source"]["base_model_hash"] = "f" * 64
    (d / MANIFEST_NAME).write_text(json.dumps(raw))


def _huge(d: Path) -> None:
    tensors = load_file(str(weights_file(d)))
    key = sorted(tensors)[0]
    tensors[key][0, 0] = 1e6
    save_file(tensors, str(weights_file(d)), metadata={"format": "pt"})


HOSTILE = {
    "nan": (with_nan, ["1 NaN/Inf value(s)"]),
    "huge": (_huge, ["values up to 1e+06, absurdly large (> 1000)"]),
    "unknown-target": (_unknown_target, ["unknown target modules lm_head"]),
    "huge-scale": (_alpha(1e9), ["scale lora_alpha / r = 1.25e+08 is absurdly large"]),
    "no-alpha": (_alpha(None), ["lora_alpha must be a positive finite number, got None"]),
}


@pytest.mark.parametrize(("edit", "words"), HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_adapter_is_refused_by_name_and_the_good_one_admitted(
    tmp_path: Path, adapter: Path, base_hash: str, edit: Callable[[Path], None], words: list[str]
) -> None:
    bad = resealed(adapter, tmp_path / "bad", edit)
    out = tmp_path / "out"
    results = fetch_all(
        [AdapterSpec("good", str(adapter)), AdapterSpec("bad", str(bad))],
        out,
        max_rank=RANK,
        base_model_hash=base_hash,
    )
    assert [(r.name, r.path) for r in results] == [("good", out / "good"), ("bad", None)]
    verify_dir(out / "good")
    assert not (out / "bad").exists()
    reason = (out / REFUSED_DIR / "bad").read_text()
    for word in ["'bad'", *words]:
        assert word in reason, reason
    assert sorted(p.name for p in out.iterdir()) == [REFUSED_DIR, "good"]  # no staging left


def test_rank_above_max_rank_and_another_base_are_refused(
    tmp_path: Path, adapter: Path, base_hash: str
) -> None:
    [low] = fetch_all(
        [AdapterSpec("a", str(adapter))], tmp_path / "o1", max_rank=RANK // 2, base_model_hash=None
    )
    above = f"rank {RANK} is above the maximum rank {RANK // 2} (lora.maxRank"
    assert low.path is None and above in str(low.reason)
    [other] = fetch_all(
        [AdapterSpec("a", str(adapter))], tmp_path / "o2", max_rank=RANK, base_model_hash="e" * 64
    )
    assert other.path is None and "made for base model" in str(other.reason)
    assert base_hash[:16] in str(other.reason)


def test_tampered_file_and_link_out_of_the_directory_are_refused(
    tmp_path: Path, adapter: Path
) -> None:
    tampered = tmp_path / "tampered"
    shutil.copytree(adapter, tampered)
    with weights_file(tampered).open("r+b") as fh:
        fh.seek(-4, 2)
        fh.write(b"\0\0\0\0")
    linked = tmp_path / "linked"
    shutil.copytree(adapter, linked)
    (linked / "extra").symlink_to("/etc/hostname")
    results = fetch_all(
        [AdapterSpec("t", str(tampered)), AdapterSpec("l", str(linked))],
        tmp_path / "out",
        max_rank=RANK,
        base_model_hash=None,
    )
    assert "sha256 mismatch" in str(results[0].reason)
    assert "symbolic link" in str(results[1].reason)


def test_a_refetch_replaces_an_adapter_that_is_now_refused(tmp_path: Path, adapter: Path) -> None:
    out = tmp_path / "out"
    fetch_all([AdapterSpec("a", str(adapter))], out, max_rank=RANK, base_model_hash=None)
    assert (out / "a").is_dir()
    fetch_all([AdapterSpec("a", str(adapter))], out, max_rank=1, base_model_hash=None)
    assert not (out / "a").exists() and (out / REFUSED_DIR / "a").is_file()


def test_cli_fetches_from_s3_and_a_directory_and_survives_a_refusal(
    tmp_path: Path, adapter: Path, base_hash: str, s3_env: dict[str, str]
) -> None:
    """The command the chart renders: one adapter from S3 (the pod's S3 environment), one
    from a directory, one for another base; exit 0, the refusal named on stderr."""
    url = f"s3://{BUCKET}/adapters/support"
    run_cli("upload", str(adapter), url, "--quiet", env=s3_env)
    other = resealed(adapter, tmp_path / "other", _other_base)
    out = tmp_path / "adapters"
    proc = run_cli(
        "fetch-adapters",
        "--adapter",
        f"support={url}",
        "--adapter",
        f"legal={adapter}",
        "--adapter",
        f"foreign={other}",
        "--output-dir",
        str(out),
        "--max-rank",
        str(RANK),
        env={**s3_env, "MINISTREAM_MODEL_HASH": base_hash},
    )
    assert verify_dir(out / "support").model_hash == Manifest.load(adapter).model_hash
    verify_dir(out / "legal")
    assert not (out / "foreign").exists()
    assert "adapter 'foreign'" in proc.stderr and "made for base model" in proc.stderr


def test_cli_fails_when_storage_is_unreachable(tmp_path: Path, s3_env: dict[str, str]) -> None:
    """No verdict on the adapter: the init container fails and the kubelet retries it."""
    env = {**s3_env, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    proc = run_cli(
        "fetch-adapters",
        "--adapter",
        f"x=s3://{BUCKET}/adapters/x",
        "--output-dir",
        str(tmp_path / "o"),
        "--max-rank",
        "8",
        env=env,
        check=False,
    )
    assert proc.returncode == 2 and "cannot reach" in proc.stderr
