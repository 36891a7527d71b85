"""Where `convert`, `convert-lora` and `shard` write, and what `--force` may replace.

Each writes a temporary directory beside its output and renames it into place. A missing
output or an empty directory is simply written. An existing output is replaced only with
`--force`, and only when it is one of ours: a directory that holds a
`ministream_manifest.json` (a converted model, an adapter or a shard set). Anything else (a
user's data, a mount point full of models) is refused, even with `--force`, and the refusal
says what is there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ministream.manifest import MANIFEST_NAME

# How many entries a refusal lists before it counts the rest.
_SHOWN = 5


def describe_entries(names: Iterable[str]) -> str:
    """`b/, a, c and 4 more`: what a refused output holds, folders first, a few names."""
    names = sorted(names, key=lambda n: (not n.endswith("/"), n))
    shown = ", ".join(names[:_SHOWN])
    return shown if len(names) <= _SHOWN else f"{shown} and {len(names) - _SHOWN} more"


def refusal(output: str, entries: Iterable[str]) -> str:
    return (
        f"{output} exists and holds no {MANIFEST_NAME}, so it is not a MiniStream model, "
        f"adapter or shard set (it holds {describe_entries(entries)}); --force replaces only "
        "those. Remove it yourself if it can go, or choose another --output."
    )


def check_replaceable(output: Path, force: bool) -> None:
    """Raise FileExistsError unless writing `output` loses nothing the user did not ask to lose.

    A missing output or an empty directory is fine; one of ours needs `force`; anything
    else is refused with or without it (so `--force` is never suggested where it would not
    help).
    """
    if not output.exists() and not output.is_symlink():
        return
    if not output.is_dir():
        raise FileExistsError(
            f"{output} exists and is not a directory; --force replaces only a MiniStream "
            "model, adapter or shard set directory. Remove it yourself if it can go, or "
            "choose another --output."
        )
    entries = [f"{p.name}/" if p.is_dir() else p.name for p in output.iterdir()]
    if not entries:
        return
    if not (output / MANIFEST_NAME).is_file():
        raise FileExistsError(refusal(str(output), entries))
    if not force:
        raise FileExistsError(f"{output} already exists; pass --force to replace it")


def make_world_readable(root: Path) -> None:
    """mkdtemp makes 0700 dirs (and safetensors 0600 files); serving runs as another user."""
    root.chmod(0o755)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def replace_dir(new: Path, target: Path, *, force: bool) -> None:
    """Move `new` to `target`; an existing target (checked again here) is swapped out, then
    removed."""
    check_replaceable(target, force)
    old = None
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
