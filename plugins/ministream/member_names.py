"""File names that a manifest, a shard-set description or a tokenizer config may hold.

Every such name is read as a path under the model directory (verify, upload, download,
load). A hostile or corrupt file naming `../../etc/passwd`, `/etc/shadow` or `C:\\x` would
make those read or write outside it, so a name must be a plain relative POSIX
path of ordinary parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath


def is_member_name(name: object) -> bool:
    """A relative POSIX path without `..`, `.`, empty parts, backslashes, NULs or drives."""
    if not isinstance(name, str) or not name or len(name) > 1024:
        return False
    if "\\" in name or "\0" in name or name.startswith("/") or ":" in name:
        return False
    parts = name.split("/")
    return (
        all(part not in ("", ".", "..") for part in parts) and not PurePosixPath(name).is_absolute()
    )


def outside_names(names: Iterable[object]) -> list[str]:
    """The names among `names` that would leave the model directory (sorted, as repr)."""
    return sorted(repr(n) for n in names if not is_member_name(n))
