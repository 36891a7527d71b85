"""ministream.atomic_file: a file is replaced whole or not at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from ministream import atomic_file
from ministream.atomic_file import write_atomic


def test_a_new_file_gets_the_default_permissions_and_an_old_one_keeps_its_own(
    tmp_path: Path,
) -> None:
    new = tmp_path / "sub" / "refused"
    write_atomic(new, "one\n")
    plain = tmp_path / "plain"
    plain.write_text("")
    assert new.read_text() == "one\n"
    assert new.stat().st_mode == plain.stat().st_mode  # not owner-only: another pod reads it
    new.chmod(0o600)
    write_atomic(new, "two\n")
    assert new.read_text() == "two\n" and new.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in new.parent.iterdir()) == ["refused"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "report.json"
    path.write_text("old")

    def no_rename(src: Path, dst: Path) -> None:
        raise OSError("rename refused")

    monkeypatch.setattr(atomic_file.os, "replace", no_rename)
    with pytest.raises(OSError, match="rename refused"):
        write_atomic(path, "new")
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
