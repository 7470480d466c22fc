#!/usr/bin/env bash
# Copy what the chart shares with the kustomize tree deploy/ into charts/m2g/files/ (Helm reads
# no file outside a chart): the CRDs, the Policy objects, the default site configuration, the
# ValidatingAdmissionPolicies, the PrometheusRule and the Grafana dashboard. deploy/ is the source; edit there, then run this.
#
#   charts/m2g/sync.sh           regenerate the copies
#   charts/m2g/sync.sh --check   exit 1 if they are stale (tests/unit/test_chart.py)
set -euo pipefail
export LC_ALL=C
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--check]" >&2; exit 2
fi

generate() {  # write the files/ tree into $1
    local out="$1" f
    mkdir -p "$out/crds" "$out/policies"
    cp "$repo"/deploy/crds/m2g.io_*.yaml "$out/crds/"
    for f in "$repo"/deploy/policies/*.yaml; do
        [[ "$(basename "$f")" == kustomization.yaml ]] || cp "$f" "$out/policies/"
    done
    cp "$repo/deploy/controller/site-config.yaml" "$out/site-config.yaml"
    cp "$repo/deploy/admission-policies/admission-policies.yaml" "$out/admission-policies.yaml"
    cp "$repo/deploy/monitoring/prometheusrule.yaml" "$out/prometheusrule.yaml"
    cp "$repo/deploy/monitoring/grafana-dashboard.json" "$out/grafana-dashboard.json"
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"
if (( check )); then
    if ! diff -r -q "$tmp" "$here/files" >/dev/null 2>&1; then
        diff -r "$tmp" "$here/files" 2>&1 | head -20 >&2 || true
        echo "charts/m2g/files is stale: run charts/m2g/sync.sh" >&2
        exit 1
    fi
    exit 0
fi
rm -rf "$here/files"
cp -r "$tmp" "$here/files"
echo "charts/m2g/files: $(find "$here/files" -type f | wc -l) files"
