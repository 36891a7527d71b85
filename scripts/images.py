#!/usr/bin/env python3
"""Build the project's container images with buildah, no Docker daemon needed (`make images`).

    scripts/images.py build [--image cpu|sidecar|router|serving ...]
                            [--base auto|upstream|bootstrap]
    scripts/images.py env          # `export CONTAINERS_CONF=... CONTAINERS_STORAGE_CONF=...`

`build` (default images: cpu, sidecar, router, serving) runs `buildah bud --layers` on the
repository's own Dockerfiles and tags the results with the names the chart's defaults pull
(`image.cpuRepository`, `sidecar.image.repository`, `router.image.repository`, tag = the
chart's appVersion), so that
`podman kube play` of the rendered chart finds them locally. It prints each image's size and
build time and writes them to .artifacts/images/report.json.

- Base image: the Dockerfiles' default `python:3.12-slim-bookworm` when it can be pulled (or
  is present); otherwise (no registry reachable, as on the project's CI machines) a local base
  bootstrapped from Debian packages with mmdebstrap and `podman import`, passed as
  `--build-arg PYTHON_IMAGE=...`. Its tag carries a hash of the recipe, so it is built once
  per machine and recipe.
- `serving` (the GPU image) cannot be built here: its base, vllm/vllm-openai, is out of reach
  and needs a GPU. Its own steps run for real on the CPU image as a stand-in base (vLLM 0.32.0
  and torch already installed, as in the official image): tag `localhost/...-steps`.
- pip inside a build uses this host's pip configuration (index, find-links, constraints, CA
  bundle): `pip config list` is written to one pip.conf, which is mounted, with every local
  file or folder it names, into the RUN steps only (`buildah bud -v`, read-only, under /mnt),
  and named by the build ARG PIP_CONFIG_FILE. Nothing of the host is written into an image.
- podman/buildah read CONTAINERS_CONF and CONTAINERS_STORAGE_CONF written by `env` into
  .artifacts/oci/: runtime runc, storage driver overlay, and default ulimits equal to this
  host's own limits (crun and podman's defaults fail on these machines: docs/images.md).

Needs root (buildah's chroot isolation, podman with runc) and scripts/install_oci.sh's tools.
Standard library only: `make images` needs no project virtualenv.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"
OCI_DIR = Path(os.environ.get("MINISTREAM_OCI_DIR", ARTIFACTS / "oci"))
REPORT = ARTIFACTS / "images" / "report.json"
UPSTREAM_BASE = "docker.io/library/python:3.12-slim-bookworm"
# The local base: what python:3.12-slim-bookworm gives the Dockerfiles (a python3 whose pip
# may install into it, python3 -m venv, CA certificates), from Debian bookworm packages.
# merged-usr hook: usr-is-merged instead of usrmerge, which would pull perl (55 MB).
# EXTERNALLY-MANAGED is removed: the upstream image's python is not Debian-managed either.
BOOTSTRAP_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
BOOTSTRAP_OPTIONS = (
    "--variant=minbase",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    "--dpkgopt=force-unsafe-io",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/info/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
    '--customize-hook=rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
)
# Image config the upstream image has and a plain rootfs import lacks (without PATH, podman
# kube play finds no python3).
BOOTSTRAP_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
BOOTSTRAP_REPO = "localhost/ministream-python-base"
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# Where the host's pip files appear inside RUN steps: /mnt, an empty folder of every Debian-based
# image (FHS: "temporarily mounted file systems"). A temporary folder of this host is mounted
# there, and every other file under it, so the mount points buildah creates lie in that
# folder, not in the image (mount points elsewhere stay in the image as empty files). The
# Dockerfiles read PIP_CONFIG_FILE as a build ARG: set in RUN steps, absent from the image.
HOST_PIP_DIR = "/mnt"
PIP_CONFIG_FILE = f"{HOST_PIP_DIR}/pip.conf"
# Size budgets (MB, 10^6 bytes), checked by tests/images/ and recorded in docs/images.md.
BUDGET_MB = {"sidecar": 250, "router": 300, "cpu": 4000}
IMAGES = ("cpu", "sidecar", "router", "serving")


@dataclass(frozen=True)
class Image:
    key: str
    dockerfile: Path
    tag: str


def _chart_value(text: str, pattern: str) -> str:
    found = re.search(pattern, text, re.M)
    if not found:
        raise SystemExit(f"images: cannot find {pattern!r} in the chart")
    return found.group(1).strip().strip("\"'")


def images() -> dict[str, Image]:
    """The images and the names the chart's defaults pull (regex, not YAML: stdlib only;
    tests/images/ checks them against the parsed chart)."""
    chart = ROOT / "charts" / "ministream"
    version = _chart_value((chart / "Chart.yaml").read_text(), r"^appVersion:\s*(\S+)")
    values = (chart / "values.yaml").read_text()
    cpu_repo = _chart_value(values, r"^image:\n(?:[ #].*\n)*?  cpuRepository:\s*(\S+)")
    sidecar_repo = _chart_value(
        values, r"^sidecar:\n(?:[ #].*\n)*?  image:\n(?:    .*\n)*?    repository:\s*(\S+)"
    )
    router_repo = _chart_value(
        values, r"^router:\n(?:[ #].*\n)*?  image:\n(?:    .*\n)*?    repository:\s*(\S+)"
    )
    docker = ROOT / "docker"
    return {
        "cpu": Image("cpu", docker / "Dockerfile.cpu", f"{cpu_repo}:{version}"),
        "sidecar": Image("sidecar", docker / "Dockerfile.sidecar", f"{sidecar_repo}:{version}"),
        "router": Image("router", docker / "Dockerfile.router", f"{router_repo}:{version}"),
        "serving": Image(
            "serving",
            docker / "Dockerfile.serving",
            f"localhost/ministream-serving-steps:{version}",
        ),
    }


# --------------------------------------------------------------------- podman configuration
# buildah's chroot isolation runs RUN steps with RLIMIT_NPROC at most 32768 and then fails
# to raise it to a larger default (seen here: "setting RLIMIT_NPROC ... was 32768").
_NPROC_CAP = 32768


def _limit(which: int, cap: int | None = None) -> str | None:
    """`soft:hard` of this process's limit (at most `cap`); None when unlimited."""
    soft, hard = resource.getrlimit(which)
    if cap is not None:
        soft, hard = (cap if v == resource.RLIM_INFINITY else min(v, cap) for v in (soft, hard))
    if resource.RLIM_INFINITY in (soft, hard):
        return None
    return f"{soft}:{hard}"


def oci_env(folder: Path = OCI_DIR) -> dict[str, str]:
    """Write containers.conf and storage.conf for this host; the variables that select them."""
    limits = {
        "nofile": _limit(resource.RLIMIT_NOFILE),
        "nproc": _limit(resource.RLIMIT_NPROC, _NPROC_CAP),
    }
    ulimits = [f'"{name}={value}"' for name, value in limits.items() if value]
    files = {
        "containers.conf": (
            "# Written by scripts/images.py for this host (docs/images.md).\n"
            "[containers]\n"
            "# podman's default ulimits exceed this host's hard limits; runc then fails.\n"
            f"default_ulimits = [{', '.join(ulimits)}]\n"
            "[engine]\n"
            "# crun fails on setrlimit and on this machine's cgroup v1 hierarchy.\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
        ),
        "storage.conf": (
            "# Written by scripts/images.py: the tools' own place, overlay driver.\n"
            "[storage]\n"
            'driver = "overlay"\n'
            'runroot = "/run/containers/storage"\n'
            'graphroot = "/var/lib/containers/storage"\n'
        ),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = folder / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
    return {
        "CONTAINERS_CONF": str(folder / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(folder / "storage.conf"),
    }


def _run(cmd: list[str], env: dict[str, str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env={**os.environ, **env}, text=True, **kwargs)  # type: ignore[call-overload]


def image_exists(tag: str, env: dict[str, str]) -> bool:
    return _run(["podman", "image", "exists", tag], env).returncode == 0


def image_size(tag: str, env: dict[str, str]) -> int:
    out = _run(
        ["podman", "image", "inspect", "--format", "{{.Size}}", tag],
        env,
        capture_output=True,
        check=True,
    )
    return int(out.stdout.strip())


# --------------------------------------------------------------------------- the base image
def _host_apt_sources() -> list[str]:
    """The host's Debian sources, for mmdebstrap (the host's mirror, proxy-free or not)."""
    for path in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
        if path.is_file() and path.read_text().strip():
            return [str(path)]
    return []


def bootstrap_tag() -> str:
    recipe = json.dumps([BOOTSTRAP_PACKAGES, BOOTSTRAP_OPTIONS, BOOTSTRAP_CHANGES, "bookworm"])
    return f"{BOOTSTRAP_REPO}:bookworm-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def bootstrap_base(env: dict[str, str]) -> str:
    tag = bootstrap_tag()
    if image_exists(tag, env):
        print(f"images: base {tag} (bootstrapped before)", flush=True)
        return tag
    print(f"images: bootstrapping {tag} from Debian bookworm packages (mmdebstrap)", flush=True)
    with tempfile.TemporaryDirectory(prefix="ministream-base-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(
            [
                "mmdebstrap",
                *BOOTSTRAP_OPTIONS,
                f"--include={','.join(BOOTSTRAP_PACKAGES)}",
                "bookworm",
                str(tar),
                *_host_apt_sources(),
            ],
            check=True,
        )
        changes = [arg for change in BOOTSTRAP_CHANGES for arg in ("--change", change)]
        _run(["podman", "import", *changes, str(tar), tag], env, check=True)
    return tag


def pull_upstream(env: dict[str, str], timeout: float = 90.0) -> bool:
    if image_exists(UPSTREAM_BASE, env):
        return True
    try:
        proc = _run(
            ["podman", "pull", "--quiet", UPSTREAM_BASE], env, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def resolve_base(mode: str, env: dict[str, str]) -> str:
    if mode == "bootstrap":
        return bootstrap_base(env)
    if pull_upstream(env):
        print(f"images: base {UPSTREAM_BASE}", flush=True)
        return UPSTREAM_BASE
    if mode == "upstream":
        raise SystemExit(f"images: cannot pull {UPSTREAM_BASE}")
    print(f"images: {UPSTREAM_BASE} cannot be pulled here; using a bootstrapped base", flush=True)
    return bootstrap_base(env)


# ----------------------------------------------------------- the host's pip configuration
_PATH_KEYS = {"cert", "client-cert", "constraint", "requirement", "find-links"}


def host_pip_config(python: str = sys.executable) -> tuple[str, list[tuple[str, str]]]:
    """This host's effective pip configuration as one pip.conf whose local paths point under
    HOST_PIP_DIR, and the (host path, container path) pairs to mount there."""
    out = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    sections: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        section, _, name = key.rpartition(".")
        section = "global" if section in ("", ":env:") else section
        sections.setdefault(section, {})[name] = raw.strip().strip("'\"")
    if "cert" not in sections.get("global", {}):
        for variable in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
            if os.environ.get(variable):
                sections.setdefault("global", {})["cert"] = os.environ[variable]
                break
    mounts: dict[str, str] = {}

    def local(path: Path) -> str:
        if str(path) not in mounts:
            mounts[str(path)] = f"{HOST_PIP_DIR}/{len(mounts)}-{path.name or 'root'}"
        return mounts[str(path)]

    for values in sections.values():
        for name, value in values.items():
            words = []
            for word in value.split():
                path = Path(word.removeprefix("file://"))
                if word.startswith("file://") and path.is_dir() and name != "find-links":
                    # A local index (PEP 503): its pages may link to files beside it
                    # (`../../files/...`), so its parent folder goes in whole.
                    word = f"file://{local(path.parent)}/{path.name}"
                elif (word.startswith("file://") or name in _PATH_KEYS) and path.exists():
                    word = ("file://" if word.startswith("file://") else "") + local(path)
                words.append(word)
            values[name] = " ".join(words)
    text = "# pip configuration of the build host, mounted into RUN steps only\n"
    for section, values in sections.items():
        text += f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())
    return text, sorted(mounts.items())


def torch_index_reachable(url: str = DEFAULT_TORCH_INDEX, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return bool(resp.status < 500)
    except OSError:
        return False


# ---------------------------------------------------------------------------------- build
def build(
    image: Image, build_args: dict[str, str], mounts: list[tuple[str, str]], env: dict[str, str]
) -> float:
    ignore = image.dockerfile.with_name(image.dockerfile.name + ".dockerignore")
    cmd = [
        "buildah",
        "bud",
        "--isolation",
        "chroot",
        "--layers",
        "--force-rm",  # no working container left behind by a failed step
        "-f",
        str(image.dockerfile),
        "--ignorefile",
        str(ignore),
        "-t",
        image.tag,
    ]
    for key, value in build_args.items():
        cmd += ["--build-arg", f"{key}={value}"]
    for host, container in mounts:
        cmd += ["-v", f"{host}:{container}:ro"]
    print(f"images: building {image.tag} from {image.dockerfile.relative_to(ROOT)}", flush=True)
    began = time.monotonic()
    _run([*cmd, str(ROOT)], env, check=True)
    return time.monotonic() - began


def write_report(report: dict[str, dict[str, object]]) -> None:
    """The build report, with the provenance block every result carries (commit, command,
    machine, versions; docs/benchmarks.md, "How results are recorded")."""
    # The writer and what it imports (ministream.atomic_file, ministream_testkit.provenance)
    # are standard library only, as this script is: `make images` runs it from the checkout
    # with the system python3, no project virtualenv needed.
    for folder in (str(ROOT / "devtools"), str(ROOT / "plugins")):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    from ministream_testkit.results import write_json

    write_json(REPORT, report)


def cmd_build(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        why = "needs root (buildah --isolation chroot, podman with runc)"
        if args.skip_without_root:
            print(f"images: SKIPPED: {why}; tests/images will be skipped too", file=sys.stderr)
            return 0
        print(f"images: {why}", file=sys.stderr)
        return 2
    missing = [t for t in ("buildah", "podman", "runc", "mmdebstrap") if not shutil.which(t)]
    if missing:
        print(f"images: missing {missing}: run scripts/install_oci.sh", file=sys.stderr)
        return 2
    env = oci_env()
    wanted = args.image or list(IMAGES)
    all_images = images()
    report: dict[str, dict[str, object]] = {}
    began = time.monotonic()
    base = resolve_base(args.base, env)
    report["base"] = {"tag": base, "seconds": round(time.monotonic() - began, 1)}
    pip_conf, host_files = host_pip_config()
    with tempfile.TemporaryDirectory(prefix="ministream-pip-") as tmp:
        folder = Path(tmp)
        (folder / "pip.conf").write_text(pip_conf)
        for host, container in host_files:  # the mount points, in the mounted folder
            point = folder / Path(container).relative_to(HOST_PIP_DIR)
            point.mkdir() if Path(host).is_dir() else point.touch()
        mounts = [(tmp, HOST_PIP_DIR), *host_files]
        common = {"PYTHON_IMAGE": base, "PIP_CONFIG_FILE": PIP_CONFIG_FILE}
        cpu_args = dict(common)
        if not torch_index_reachable():
            print(
                f"images: {DEFAULT_TORCH_INDEX} unreachable: torch comes from this host's pip "
                "configuration",
                flush=True,
            )
            cpu_args["TORCH_INDEX_URL"] = ""
        order = [k for k in IMAGES if k in wanted]
        if (
            "serving" in order
            and "cpu" not in order
            and not image_exists(all_images["cpu"].tag, env)
        ):
            order.insert(0, "cpu")
        for key in order:
            image = all_images[key]
            if key == "cpu":
                seconds = build(image, cpu_args, mounts, env)
            elif key in ("sidecar", "router"):
                seconds = build(image, common, mounts, env)
            else:  # the GPU image's own steps, on the CPU image standing in for vllm-openai
                serving_args = {
                    "VLLM_IMAGE": all_images["cpu"].tag,
                    "PIP_CONFIG_FILE": PIP_CONFIG_FILE,
                }
                seconds = build(image, serving_args, mounts, env)
            report[key] = {
                "tag": image.tag,
                "size_bytes": image_size(image.tag, env),
                "build_seconds": round(seconds, 1),
                "budget_mb": BUDGET_MB.get(key),
            }
    report["total_seconds"] = {"seconds": round(time.monotonic() - began, 1)}
    write_report(report)
    print(f"\n{'image':<52} {'size':>9} {'build':>8}")
    for key in order:
        row = report[key]
        size_mb = int(str(row["size_bytes"])) / 1e6
        budget = f" (budget {row['budget_mb']} MB)" if row["budget_mb"] else ""
        print(f"{row['tag']:<52} {size_mb:>6.0f} MB {row['build_seconds']:>7}s{budget}")
    print(f"base: {base}; report: {REPORT.relative_to(ROOT)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="build the images (default)")
    b.add_argument("--image", action="append", choices=IMAGES, help="default: all")
    b.add_argument("--base", choices=["auto", "upstream", "bootstrap"], default="auto")
    b.add_argument(
        "--skip-without-root",
        action="store_true",
        help="exit 0 with a SKIPPED line when not root (`make test`)",
    )
    sub.add_parser("env", help="print the podman/buildah configuration as shell exports")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv if argv and not argv[0].startswith("-") else ["build", *argv])
    if args.command == "env":
        for key, value in oci_env().items():
            print(f"export {key}={value}")
        return 0
    return cmd_build(args)


if __name__ == "__main__":
    sys.exit(main())
