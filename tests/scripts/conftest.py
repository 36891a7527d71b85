"""Fixtures of the tests of scripts/ and scripts/gpu/ (tests/support/scripts.py)."""

from __future__ import annotations

import importlib

import pytest

from tests.support.scripts import GPU_SCRIPTS, SCRIPTS, ScriptImporter


@pytest.fixture
def import_script(monkeypatch: pytest.MonkeyPatch) -> ScriptImporter:
    """`import_script("bench_plugin")`: a module of scripts/ or scripts/gpu/, imported as the
    scripts import each other, with both folders on sys.path for the test only."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    monkeypatch.syspath_prepend(str(GPU_SCRIPTS))
    return importlib.import_module
