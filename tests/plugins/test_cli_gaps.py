"""The `ministream` CLI's small things a newcomer meets first (no engine): `--version`, verify
of a path that is not there and its progress bar, the preset sizes in `demo --help`, a LoRA
serve hint a shell takes as written, and a tensor-parallel size that does not divide the
heads refused before any rank starts."""

from __future__ import annotations

import re
import shlex
import typing
from pathlib import Path

import pytest
import torch

from ministream.cli import main as cli_main
from ministream.demo import random_adapter
from ministream.lora_convert import read_base
from ministream.manifest import converter_version
from ministream.names import VLLM_MAX_LORA_RANKS, serving_max_lora_rank
from ministream.presets import PRESET_NAMES
from tests.support.models import ModelFactory


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli_main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"ministream {converter_version()}"


def test_verify_of_a_missing_directory_says_it_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["verify", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nope'} does not exist" in err and "ministream_manifest" not in err


def test_verify_shows_progress_unless_quiet(
    models: ModelFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.converted("tiny", "float32")
    assert cli_main(["verify", str(model)]) == 0
    assert re.search(r"verify: 100%", capsys.readouterr().err)
    assert cli_main(["verify", "--quiet", str(model)]) == 0
    assert "verify:" not in capsys.readouterr().err


def test_demo_help_gives_each_presets_size_and_it_is_right(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli_main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    sizes = dict(re.findall(r"([a-z0-9-]+) ~([0-9.]+ [kMG]B)", text))
    assert set(sizes) == set(PRESET_NAMES), text
    assert cli_main(["demo", "--preset", "tiny", "--output", str(tmp_path / "raw")]) == 0
    number, unit = sizes["tiny"].split()
    stated = float(number) * {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    actual = (tmp_path / "raw" / "model.pt").stat().st_size
    assert abs(actual - stated) / actual < 0.05, (actual, stated)


def test_vllm_max_lora_ranks_are_vllms() -> None:
    from vllm.config.lora import MaxLoRARanks

    assert typing.get_args(MaxLoRARanks) == VLLM_MAX_LORA_RANKS


def test_a_rank_beyond_vllms_largest_max_lora_rank_names_that_rank() -> None:
    largest = VLLM_MAX_LORA_RANKS[-1]
    with pytest.raises(ValueError, match=f"largest --max-lora-rank, {largest}$"):
        serving_max_lora_rank(largest + 1)


def test_the_lora_serve_hint_is_a_command_a_shell_takes_as_written(
    models: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = models.converted("tiny", "float32")
    cfg, model_hash = read_base(base)
    adapter = tmp_path / "a.pt"
    torch.save(random_adapter(cfg, rank=2, targets=["mlp.w3"], base_model_hash=model_hash), adapter)
    out = tmp_path / "my adapter"  # a space: the hint must quote it
    args = ["convert-lora", "--adapter", str(adapter), "--base", str(base), "--quiet"]
    assert cli_main([*args, "--output", str(out), "--name", "support"]) == 0
    hint = capsys.readouterr().out.split("Serve with: ", 1)[1].strip()
    assert ">" not in hint
    assert shlex.split(hint) == [
        "--enable-lora",
        "--max-lora-rank",
        "8",  # the smallest vLLM accepts above rank 2
        "--lora-modules",
        f"support={out}",
    ]


def test_shard_refuses_a_tp_that_does_not_divide_the_heads_before_starting(
    models: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = models.converted("tiny", "float32")  # 4 heads
    argv = ["shard", "--model", str(model), "-tp", "3", "--output", str(tmp_path / "s")]
    assert cli_main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--tensor-parallel-size 3 does not divide the model's 4 attention heads" in err
    assert "Pick one of 1, 2, 4." in err
    assert not (tmp_path / "s").exists()
