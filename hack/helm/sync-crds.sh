#!/usr/bin/env bash
# Copy the generated CRD (crds/, made by `make crds`) to where the two install
# paths need their own copy:
#   charts/agentrun-operator/crds/  Helm only installs CRDs from inside the chart;
#   manifests/crds/                 kustomize refuses files outside manifests/.
# tests/integration/test_packaging.py fails when a copy differs from crds/.
#
# Usage: hack/helm/sync-crds.sh            (run after `make crds`)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
for dest in "$ROOT/charts/agentrun-operator/crds" "$ROOT/manifests/crds"; do
    mkdir -p "$dest"
    rm -f "$dest"/*.yaml
    cp "$ROOT"/crds/*.yaml "$dest/"
    printf 'sync-crds: %s\n' "${dest#"$ROOT"/}" >&2
done
