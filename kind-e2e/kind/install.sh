#!/usr/bin/env bash
# Prepare a kind cluster like the local control plane: JobSet (the controller of the module
# kind-e2e/tools/jobset/go.sum pins, in the cluster), Kueue (release manifests), KWOK in the
# cluster with m2g's stages, KAI's CRDs (KAI's files alone, or the real KAI with WITH_KAI=1) and
# the simulated factory. Then run the same e2e suite against it:
#   kind-e2e/kind/install.sh            # creates cluster "m2g" unless it exists
#   M2G_E2E_KUBECONFIG=$HOME/.kube/config .venv/bin/python -m pytest -m e2e -q
# Needs: docker, kind, kubectl, Go (to read JobSet's manifests and KWOK's stages from their
# modules), the repo's .venv.
# NOT RUN in this project's CI (no container engine there); see README.md beside it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
PY="${PY:-$repo/.venv/bin/python}"
LOCALCP=("$PY" "$repo/kind-e2e/localcp")
FACTORY="${FACTORY:-small}"
CLUSTER="${CLUSTER:-m2g}"
KAI_CHART_VERSION="${KAI_CHART_VERSION:-}"   # e.g. v0.9.x; only with WITH_KAI=1

if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --config "$here/kind-config.yaml"
fi
kubectl config use-context "kind-$CLUSTER"

# JobSet before Kueue: Kueue sets up its jobset.x-k8s.io/jobset integration for a CRD it finds
echo "== JobSet $JOBSET_VERSION (controller in the cluster, from its pinned Go module)"
"${LOCALCP[@]}" jobset-manifests | kubectl apply --server-side -f -
kubectl -n jobset-system rollout status deploy/jobset-controller-manager --timeout=300s

echo "== Kueue $KUEUE_VERSION"
kubectl apply --server-side -f \
  "https://github.com/kubernetes-sigs/kueue/releases/download/$KUEUE_VERSION/manifests.yaml"
kubectl -n kueue-system rollout status deploy/kueue-controller-manager --timeout=300s
echo "== Kueue's Configuration with fair sharing (kueue-config/kueue-manager)"
kubectl apply --server-side --force-conflicts -k "$repo/kueue-config/kueue-manager"
kubectl -n kueue-system rollout restart deploy/kueue-controller-manager
kubectl -n kueue-system rollout status deploy/kueue-controller-manager --timeout=300s

echo "== KWOK $KWOK_VERSION (controller in the cluster, m2g's stages)"
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION/kwok.yaml"
kubectl -n kube-system rollout status deploy/kwok-controller --timeout=300s
"${LOCALCP[@]}" kwok-stages | kubectl apply -f -

if [[ "${WITH_KAI:-0}" == 1 ]]; then
  echo "== KAI Scheduler (helm chart ${KAI_CHART_VERSION:-latest})"
  helm upgrade -i kai-scheduler oci://ghcr.io/nvidia/kai-scheduler/kai-scheduler \
    -n kai-scheduler --create-namespace ${KAI_CHART_VERSION:+--version "$KAI_CHART_VERSION"}
else
  echo "== KAI CRDs (KAI's CRD files, no scheduler; WITH_KAI=1 installs the real KAI)"
  kubectl apply --server-side -f "$repo/kind-e2e/manifests/kai-crds.yaml"
fi

echo "== factory $FACTORY"
"${LOCALCP[@]}" factory manifests "$FACTORY" | kubectl create -f - 2>/dev/null \
  || "${LOCALCP[@]}" factory manifests "$FACTORY" | kubectl apply -f -
kubectl wait --for=condition=Ready node -l "m2g.io/factory=$FACTORY" --timeout=300s
echo "kind cluster ready: M2G_E2E_KUBECONFIG=\${KUBECONFIG:-\$HOME/.kube/config} make test-e2e"
