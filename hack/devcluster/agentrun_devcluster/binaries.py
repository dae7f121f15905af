"""Finding (or building) the control-plane binaries: etcd, kube-apiserver,
kube-controller-manager and kubectl."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = [
    "BIN_DIR_ENV",
    "BinariesError",
    "build_script",
    "cache_root",
    "helm_binary",
    "kstatus_bin_dir",
    "resolve_bin_dir",
    "run_build_script",
]

#: Environment variable naming a ready bin dir (skips the build script).
BIN_DIR_ENV = "AGENTRUN_CONTROLPLANE_BIN"
TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl")


def cache_root() -> Path:
    """The project's cache outside any checkout, where the build scripts put what they build
    and the tools keep state between runs: ``$AGENTRUN_CACHE_DIR``, else
    ``${XDG_CACHE_HOME:-~/.cache}/agentrun`` (as the scripts under hack/ compute it)."""
    explicit = os.environ.get("AGENTRUN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrun"


class BinariesError(RuntimeError):
    """The binaries could not be found or built."""


def build_script(start: Path | None = None, name: str = "build-controlplane.sh") -> Path | None:
    """``hack/<name>`` (default: the control-plane build) of the source checkout holding
    this package, or of the current directory or one of its parents."""
    candidates = [Path(__file__).resolve().parents[3]]
    here = (start or Path.cwd()).resolve()
    candidates += [here, *here.parents]
    for root in candidates:
        script = root / "hack" / name
        if script.is_file():
            return script
    return None


def check_bin_dir(bin_dir: Path) -> Path:
    """``bin_dir`` if it holds all four tools, else raise :class:`BinariesError`."""
    missing = [t for t in TOOLS if not os.access(bin_dir / t, os.X_OK)]
    if missing:
        raise BinariesError(f"{bin_dir}: missing or not executable: {', '.join(missing)}")
    return bin_dir


def resolve_bin_dir(explicit: Path | str | None = None, *, build: bool = True) -> Path:
    """The bin dir: ``explicit``, else ``$AGENTRUN_CONTROLPLANE_BIN``, else the output of
    ``hack/build-controlplane.sh`` (which builds on first use, then answers from its cache;
    its progress goes to our stderr)."""
    if explicit:
        return check_bin_dir(Path(explicit).resolve())
    env = os.environ.get(BIN_DIR_ENV)
    if env:
        return check_bin_dir(Path(env).resolve())
    if not build:
        raise BinariesError(f"no bin dir given and {BIN_DIR_ENV} is not set")
    script = build_script()
    if script is None:
        raise BinariesError(
            f"hack/build-controlplane.sh not found; pass --bin-dir or set {BIN_DIR_ENV}"
        )
    return check_bin_dir(run_build_script(script))


def run_build_script(script: Path) -> Path:
    """Run a ``hack/build-*.sh`` script (its progress goes to our stderr) and return the bin
    dir it prints as its last line."""
    proc = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    if proc.returncode != 0:
        raise BinariesError(f"{script} failed with exit code {proc.returncode} (see stderr)")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BinariesError(f"{script} printed no bin dir")
    return Path(lines[-1]).resolve()


def helm_binary() -> Path:
    """helm built by ``hack/build-helm.sh`` (from its pinned Go module, cached)."""
    script = build_script(name="build-helm.sh")
    if script is None:
        raise BinariesError("hack/build-helm.sh not found")
    return run_build_script(script) / "helm"


def kstatus_bin_dir() -> Path:
    """The bin dir of ``kstatus`` and ``argocd-health``, built by ``hack/build-kstatus.sh``
    (sigs.k8s.io/cli-utils and gopher-lua at the versions pinned in hack/kstatus, cached)."""
    script = build_script(name="build-kstatus.sh")
    if script is None:
        raise BinariesError("hack/build-kstatus.sh not found")
    return run_build_script(script)
