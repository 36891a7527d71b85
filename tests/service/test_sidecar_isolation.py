"""The sidecar image has no torch or vLLM: importing the sidecar must not need them, and of the
plugin package it may load only the torch-free startup-log module the two sides share
(docs/architecture.md §1.6)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.test_layers import SIDECAR_FROM_PLUGIN

# Each forbidden name is poisoned in sys.modules (None makes `import x` raise ImportError),
# so any import of it, direct or transitive, fails the child process.
FORBIDDEN = ("torch", "vllm", "transformers", "triton", "numpy")
# The torch-free modules of the plugin package the sidecar may load: the layer rule's own list.
FROM_PLUGIN = tuple(sorted(SIDECAR_FROM_PLUGIN))

CHILD = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    for name in {forbidden!r}:
        sys.modules[name] = None
    import ministream_sidecar
    names = [m.name for m in pkgutil.walk_packages(ministream_sidecar.__path__,
                                                   "ministream_sidecar.")]
    for name in names:
        importlib.import_module(name)
    from ministream_sidecar.app import create_app
    from ministream_sidecar.settings import SidecarSettings
    create_app(SidecarSettings())
    loaded = sorted(n for n in sys.modules if n.split(".")[0] in {forbidden!r}
                    and sys.modules[n] is not None)
    assert not loaded, loaded
    plugin = sorted(n for n in sys.modules if n.split(".")[0] == "ministream")
    assert set(plugin) <= set({from_plugin!r}), plugin
    # Outside a cluster, the Kubernetes client is not even imported.
    assert "kubernetes" not in sys.modules
    print("imported", len(names), "modules")
    """
)


def test_sidecar_imports_without_torch_vllm_or_the_model_code() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(forbidden=FORBIDDEN, from_plugin=FROM_PLUGIN)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},  # no MINISTREAM_SIDECAR_*, no KUBERNETES_SERVICE_HOST
    )
    assert proc.returncode == 0, proc.stderr
    assert "imported" in proc.stdout
