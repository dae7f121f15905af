"""Write a krew plugin manifest for ``kubectl agentrun`` (``make krew-manifest``).

krew installs a plugin from an archive it downloads and checks by sha256. The plugin is
Python, so the archive holds a small launcher, ``kubectl-agentrun``, that runs the
``kubectl-agentrun`` console script of this version of the ``agentrun-operator`` distribution
with ``uvx`` (or ``pipx run``), and the launcher's README. This script builds that archive
reproducibly (fixed times, owners and order: the same version gives the same sha256) and
writes the manifest beside it:

    dist/kubectl-agentrun-v<version>.tar.gz
    dist/agentrun.yaml

The version is ``[project].version`` of pyproject.toml. The archive must be published at
``<base-url>/v<version>/kubectl-agentrun-v<version>.tar.gz`` (``--base-url``, the Makefile's
``KREW_BASE_URL``) for ``kubectl krew install --manifest=dist/agentrun.yaml`` to work.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
NAME = "agentrun"
BIN = "kubectl-agentrun"
DISTRIBUTION = "agentrun-operator"
MTIME = 946684800  # 2000-01-01: the archive's bytes depend on its contents only

LAUNCHER = """#!/bin/sh
# kubectl agentrun {version}, installed by krew: runs the kubectl-agentrun command of the
# {distribution} distribution, version {version}, with uvx (or pipx), which fetch it once.
set -e
if command -v uvx >/dev/null 2>&1; then
    exec uvx --quiet --from "{distribution}=={version}" kubectl-agentrun "$@"
elif command -v pipx >/dev/null 2>&1; then
    exec pipx run --spec "{distribution}=={version}" kubectl-agentrun "$@"
fi
echo "kubectl agentrun needs uv (https://docs.astral.sh/uv/) or pipx on PATH" >&2
exit 1
"""

README = """kubectl agentrun {version}

The launcher kubectl-agentrun runs `kubectl-agentrun` from the {distribution} distribution,
version {version}, with uvx or pipx. Without krew: `uv tool install {distribution}=={version}`
(or `uv tool install .` in a checkout) puts kubectl-agentrun on PATH.
"""


def project_version(pyproject: Path = REPO / "pyproject.toml") -> str:
    data = tomllib.loads(pyproject.read_text())
    return str(data["project"]["version"])


def archive(version: str) -> bytes:
    """The plugin's .tar.gz, the same bytes for the same version."""
    files = {
        BIN: (LAUNCHER.format(version=version, distribution=DISTRIBUTION), 0o755),
        "README": (README.format(version=version, distribution=DISTRIBUTION), 0o644),
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (text, mode) in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=MTIME, filename="") as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def manifest(version: str, uri: str, sha256: str) -> dict[str, Any]:
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": NAME},
        "spec": {
            "version": f"v{version}",
            "shortDescription": "Approve, inspect and steer AgentRuns",
            "description": (
                "Approve or reject gated steps of AgentRuns (agentrun.dev/v1alpha1), show a "
                "run's status, plan, history, transcript and step logs, wait for it, fork it, "
                "and release the operator's finalizers when uninstalling.\n"
            ),
            "caveats": (
                "The plugin is Python: it runs with uvx (uv) or pipx, one of which must be on "
                f"PATH; the first run fetches {DISTRIBUTION}=={version}.\n"
            ),
            "platforms": [
                {
                    "selector": {
                        "matchExpressions": [
                            {"key": "os", "operator": "In", "values": ["linux", "darwin"]}
                        ]
                    },
                    "uri": uri,
                    "sha256": sha256,
                    "bin": BIN,
                    "files": [{"from": BIN, "to": "."}, {"from": "README", "to": "."}],
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Text with line breaks as literal blocks (``|``), as krew's own manifests are written."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def write(out: Path, base_url: str, version: str) -> tuple[Path, Path]:
    """Write the archive and the manifest into ``out``; their paths."""
    out.mkdir(parents=True, exist_ok=True)
    tag = f"v{version}"
    data = archive(version)
    tarball = out / f"{BIN}-{tag}.tar.gz"
    tarball.write_bytes(data)
    uri = f"{base_url.rstrip('/')}/{tag}/{tarball.name}"
    path = out / f"{NAME}.yaml"
    body = manifest(version, uri, hashlib.sha256(data).hexdigest())
    path.write_text(yaml.dump(body, Dumper=_Dumper, sort_keys=False, width=100))
    return tarball, path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist", help="directory (dist/)")
    parser.add_argument(
        "--base-url", required=True, help="where releases are downloaded from (KREW_BASE_URL)"
    )
    parser.add_argument("--version", default=None, help="default: pyproject.toml's")
    args = parser.parse_args()
    tarball, path = write(args.out, args.base_url, args.version or project_version())
    print(f"wrote {path} (archive {tarball})")


if __name__ == "__main__":
    main()
