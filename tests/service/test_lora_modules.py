"""serve_vllm leaves adapters the fetch step refused out of vLLM's --lora-modules, and the
sidecar reads the adapter list the chart renders."""

from __future__ import annotations

import json
from pathlib import Path

from ministream_sidecar.lora_modules import admitted
from ministream_sidecar.settings import SidecarSettings


def test_missing_adapter_directories_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "c").mkdir()
    as_json = json.dumps({"name": "c", "path": str(tmp_path / "c")})
    argv = ["--enable-lora", "--lora-modules", f"a={tmp_path}/a", f"b={tmp_path}/b", as_json]
    argv += ["--max-loras", "4"]
    kept, dropped = admitted(argv)
    assert kept == [
        "--enable-lora",
        "--lora-modules",
        f"a={tmp_path}/a",
        as_json,
        "--max-loras",
        "4",
    ]
    assert dropped == [f"b={tmp_path}/b"]


def test_no_admitted_adapter_drops_the_flag(tmp_path: Path) -> None:
    kept, dropped = admitted(["--lora-modules", f"b={tmp_path}/b", "--port", "1"])
    assert kept == ["--port", "1"] and dropped == [f"b={tmp_path}/b"]


def test_args_without_adapters_pass_unchanged() -> None:
    argv = ["--model", "/m", "--enable-lora"]
    assert admitted(argv) == (argv, [])


def test_adapter_list_is_read_comma_separated(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MINISTREAM_SIDECAR_LORA_ADAPTERS", "support, legal,")
    assert SidecarSettings().lora_adapters == ("support", "legal")
    monkeypatch.setenv("MINISTREAM_SIDECAR_LORA_ADAPTERS", "")
    assert SidecarSettings().lora_adapters == ()
