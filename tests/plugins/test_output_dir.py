"""What `--force` may replace: only a directory that holds a MiniStream manifest (no engine).

`convert`, `convert-lora` and `shard` share the replace code; each is driven through the CLI
as a user would, against a directory of someone else's data, a plain file, an empty
directory and a previous output of ours.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ministream.cli import main as cli_main
from ministream.demo import convert_argv, random_adapter
from ministream.lora_convert import read_base
from ministream.manifest import MANIFEST_NAME, verify_dir
from tests.support.models import ModelFactory


@pytest.fixture(scope="module")
def base(models: ModelFactory) -> Path:
    return models.converted("tiny", "float32")


@pytest.fixture(scope="module")
def adapter(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg, model_hash = read_base(base)
    path = tmp_path_factory.mktemp("adapter") / "adapter.pt"
    torch.save(random_adapter(cfg, rank=2, targets=["mlp.w3"], base_model_hash=model_hash), path)
    return path


def _user_data(root: Path) -> Path:
    """A directory that was never an output of ours: `sub/data.txt` and a few files."""
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "data.txt").write_text("important")
    for i in range(6):
        (root / f"notes-{i}.txt").write_text("mine")
    return root


def _argv(command: str, models: ModelFactory, base: Path, adapter: Path, out: Path) -> list[str]:
    if command == "convert":
        raw = models.raw("tiny")
        return [*convert_argv(raw, out), "--dtype", "float32", "--quiet"]
    if command == "convert-lora":
        return ["convert-lora", "--adapter", str(adapter), "--base", str(base),
                "--output", str(out), "--quiet"]  # fmt: skip
    # The refusal comes before any rank (and so any vLLM engine) starts.
    return ["shard", "--model", str(base), "-tp", "1", "--output", str(out), "--quiet"]


COMMANDS = ["convert", "convert-lora", "shard"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("force", [False, True])
def test_force_never_deletes_a_directory_that_is_not_ours(
    command: str,
    force: bool,
    models: ModelFactory,
    base: Path,
    adapter: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = _user_data(tmp_path / "existing2")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    argv = _argv(command, models, base, adapter, out) + (["--force"] if force else [])
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert f"{out} exists and holds no {MANIFEST_NAME}" in err
    # It says what is there, a few names and a count, and never suggests --force as the fix.
    assert "notes-0.txt" in err and "sub/" in err and "and 2 more" in err
    assert "pass --force" not in err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert (out / "sub" / "data.txt").read_text() == "important"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


@pytest.mark.parametrize("command", COMMANDS)
def test_force_never_replaces_a_file(
    command: str,
    models: ModelFactory,
    base: Path,
    adapter: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "models.tar"
    out.write_text("an archive")
    assert cli_main([*_argv(command, models, base, adapter, out), "--force"]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
    assert out.read_text() == "an archive"


@pytest.mark.parametrize("command", ["convert", "convert-lora"])
def test_force_replaces_a_previous_output(
    command: str, models: ModelFactory, base: Path, adapter: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    argv = _argv(command, models, base, adapter, out)
    assert cli_main(argv) == 0
    (out / "stale.txt").write_text("left by an older run")
    assert cli_main(argv) == 2  # ours, but not without --force
    assert cli_main([*argv, "--force"]) == 0
    verify_dir(out)
    assert not (out / "stale.txt").exists()


@pytest.mark.parametrize("command", ["convert", "convert-lora"])
def test_an_empty_directory_is_written_without_force(
    command: str, models: ModelFactory, base: Path, adapter: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    assert cli_main(_argv(command, models, base, adapter, out)) == 0
    verify_dir(out)
