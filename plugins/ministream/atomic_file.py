"""Writing a file whole or not at all.

The text goes to a temporary name beside the file (the same filesystem), then is renamed over
it: a reader never sees half a file, and an interrupted or failed write leaves the old file as
it was and no temporary behind. A file that already exists keeps its permissions; a new one
gets the process's default ones (a file another container reads, such as the adapter fetcher's
refusal note, must not come out owner-only).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text)
        if path.exists():
            shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
