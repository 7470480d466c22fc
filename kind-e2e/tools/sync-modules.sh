#!/usr/bin/env bash
# Regenerate the wrapper Go modules (go.mod + go.sum) from kind-e2e/versions.env.
# Run after bumping a version; commit the result. Needs only the Go module proxy.
# The sum database is not reachable from our CI host, so GOSUMDB=off here: the hashes are
# then pinned by the committed go.sum files, which every later build verifies.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
source "$here/goenv.sh"
export GOSUMDB=off

K="$KUBERNETES_VERSION"; S="v0.${K#v1.}"
STAGING="api apiextensions-apiserver apimachinery apiserver cli-runtime client-go cloud-provider
cluster-bootstrap code-generator component-base component-helpers controller-manager cri-api
cri-client csi-translation-lib dynamic-resource-allocation endpointslice externaljwt kms
kube-aggregator kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics
mount-utils pod-security-admission sample-apiserver sample-cli-plugin sample-controller
cri-streaming streaming"

fresh() {  # fresh <dir> <module path>
  rm -f "$here/$1/go.mod" "$here/$1/go.sum"
  (cd "$here/$1" && go mod init "$2" >/dev/null 2>&1 && go mod edit -go=1.26)
}

echo "== k8s $K (staging $S)"
fresh k8s m2g.local/k8sbins
(cd "$here/k8s"
 for m in $STAGING; do go mod edit -replace "k8s.io/$m=k8s.io/$m@$S"; done
 go mod edit -godebug=default=go1.26
 go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K" "k8s.io/kubernetes/cmd/kube-controller-manager@$K" \
   "k8s.io/kubernetes/cmd/kube-scheduler@$K" "k8s.io/kubernetes/cmd/kubectl@$K")

echo "== etcd $ETCD_VERSION"
fresh etcd m2g.local/etcdbin
(cd "$here/etcd" && go get -tool "go.etcd.io/etcd/server/v3@$ETCD_VERSION")

echo "== kueue $KUEUE_VERSION"
fresh kueue m2g.local/kueuebin
(cd "$here/kueue" && go get -tool "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION")

echo "== kwok $KWOK_VERSION"
fresh kwok m2g.local/kwokbin
(cd "$here/kwok" && go get -tool "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
echo "== jobset $JOBSET_VERSION"
fresh jobset m2g.local/jobsetbin
(cd "$here/jobset" && go get -tool "sigs.k8s.io/jobset@$JOBSET_VERSION")

echo "== helm $HELM_VERSION"
fresh helm m2g.local/helmbin
(cd "$here/helm" && go get -tool "helm.sh/helm/v4/cmd/helm@$HELM_VERSION")
echo "done; now: git add kind-e2e/tools/*/go.mod kind-e2e/tools/*/go.sum"
