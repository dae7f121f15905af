"""Where the repository's files are."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CRDS_DIR = REPO_ROOT / "crds"
CRD_FILE = CRDS_DIR / "agentrun.dev_agentruns.yaml"
CHART = REPO_ROOT / "charts" / "agentrun-operator"
MANIFESTS = REPO_ROOT / "manifests"
ADMISSION_DIR = MANIFESTS / "admission"
EXAMPLES_DIR = REPO_ROOT / "examples"
