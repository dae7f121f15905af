#!/usr/bin/env bash
# Scan the Helm chart as rendered with kube-score and checkov (`make chart-scan`).
#
# Usage: hack/chart-scan.sh [OUT_DIR]
#
# Renders charts/agentrun-operator with `helm template` twice: "replicas-1" (the defaults) and
# "replicas-3" (replicas=3, networkPolicy.enabled=true: the sharded operator with its
# PodDisruptionBudget and spread, and every pod under a NetworkPolicy); then runs kube-score
# (hack/build-kube-score.sh) and checkov (`uv tool run --from checkov==CHECKOV_VERSION`, both
# pinned in hack/versions.env) over each render.
#
# stdout: one line per finding, tab-separated and sorted: TOOL CHECK RENDER KIND/NAME, e.g.
#         "kube-score	container-image-pull-policy	replicas-1	Deployment/agentrun-operator".
#         A kube-score finding is a check graded below OK (warning or critical) and not
#         skipped; a checkov finding is a failed check. docs/install.md explains each one that
#         is left; tests/integration/test_chart_scan.py compares the two.
# Everything else (build logs, the tools' own output) goes to stderr or to OUT_DIR (default: a
# temp dir, removed on exit): the renders, kube-score-*.json and checkov-*.json.
#
# Exit: 0 when both tools ran (whatever they found); 1 when one could not run. checkov is
# cached under ${AGENTRUN_CACHE_DIR:-~/.cache/agentrun}/checkov (about 230 MB, 96 packages:
# kept out of the project's dependencies); it runs on the machine's python3 (>= 3.11), never
# downloads a Python.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HACK_DIR")
CHART="$REPO/charts/agentrun-operator"
CACHE="${AGENTRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/agentrun}"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"

log() { printf 'chart-scan: %s\n' "$*" >&2; }
die() {
    printf 'chart-scan: error: %s\n' "$*" >&2
    exit 1
}

if [[ $# -ge 1 ]]; then
    OUT=$1
    mkdir -p "$OUT"
else
    OUT=$(mktemp -d)
    trap 'rm -rf "$OUT"' EXIT
fi

HELM="$("$HACK_DIR/build-helm.sh")/helm"
KUBE_SCORE="$("$HACK_DIR/build-kube-score.sh")/kube-score"
UV=$("$HACK_DIR/ensure-uv.sh")
PYTHON=${PYTHON:-$(command -v python3 || true)}
[[ -n $PYTHON ]] || die "python3 not found"

render() {
    local name=$1
    shift
    "$HELM" template agentrun-operator "$CHART" -n agentrun-system "$@" >"$OUT/$name.yaml" 2>"$OUT/$name.helm.log" ||
        die "helm template $* failed: $(cat "$OUT/$name.helm.log")"
}
render replicas-1 --set replicas=1
render replicas-3 --set replicas=3 --set networkPolicy.enabled=true

checkov() {
    UV_PYTHON_DOWNLOADS=never UV_CACHE_DIR="$CACHE/checkov/uv-cache" \
        "$UV" tool run --python "$PYTHON" --from "checkov==$CHECKOV_VERSION" checkov "$@"
}

for name in replicas-1 replicas-3; do
    log "kube-score $KUBE_SCORE_VERSION: $name"
    # Exit 1 when it found something critical: the findings are read from its JSON.
    "$KUBE_SCORE" score --output-format json "$OUT/$name.yaml" >"$OUT/kube-score-$name.json" || true
    [[ -s $OUT/kube-score-$name.json ]] || die "kube-score printed nothing for $name"
    log "checkov $CHECKOV_VERSION: $name"
    # Exit 1 when a check failed; --skip-download: no policies fetched from a platform.
    checkov -f "$OUT/$name.yaml" --framework kubernetes --output json --quiet --compact \
        --skip-download >"$OUT/checkov-$name.json" 2>"$OUT/checkov-$name.log" || true
    [[ -s $OUT/checkov-$name.json ]] || die "checkov printed nothing for $name: $(tail -n 20 "$OUT/checkov-$name.log")"
done

"$PYTHON" - "$OUT" <<'PY'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
found = set()
for render in ("replicas-1", "replicas-3"):
    for obj in json.loads((out / f"kube-score-{render}.json").read_text()) or []:
        where = f"{obj['type_meta']['kind']}/{obj['object_meta']['name']}"
        for check in obj["checks"]:
            if not check["skipped"] and check["grade"] < 10:
                found.add(("kube-score", check["check"]["id"], render, where))
    reports = json.loads((out / f"checkov-{render}.json").read_text())
    for report in reports if isinstance(reports, list) else [reports]:
        for check in (report.get("results") or {}).get("failed_checks") or []:
            # KIND.NAMESPACE.NAME, a pod template's labels appended after the name.
            kind, _, name = check["resource"].split(".", 3)[:3]
            found.add(("checkov", check["check_id"], render, f"{kind}/{name}"))
for row in sorted(found):
    print("\t".join(row))
PY
