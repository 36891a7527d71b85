"""scripts/ and scripts/gpu/ as the tests reach them (tests/scripts/conftest.py imports them).

Neither folder is a package: a script imports its neighbours by bare name (`import
interval_stats`), as `python scripts/x.py` and `python3 scripts/gpu/x.py` run them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
GPU_SCRIPTS = SCRIPTS / "gpu"
# The `import_script` fixture: a module of either folder by its bare name.
ScriptImporter = Callable[[str], ModuleType]
