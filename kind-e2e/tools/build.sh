#!/usr/bin/env bash
# Build (once) the pinned control-plane binaries into $M2G_CACHE/bin/<component>-<version>/.
#   kind-e2e/tools/build.sh [etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubectl|kwok|kueue|jobset|helm ...]
# With no argument it builds the control plane's binaries that are missing (the JobSet controller
# among them); helm (the chart's tests) only when named. A binary already in the
# cache is never rebuilt, so a warm machine returns at once. Progress (packages compiled) is
# printed while building; the full `go build -v` output goes to
# $M2G_CACHE/logs/build-<binary>.log and the wall time of each build is appended to
# $M2G_CACHE/logs/build-times.tsv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck disable=SC1091
source "$here/../versions.env"
# shellcheck disable=SC1091
source "$here/goenv.sh"
mkdir -p "$M2G_CACHE/bin" "$M2G_CACHE/logs"

ALL="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kueue jobset"
TOOLS="helm"
targets="${*:-$ALL}"

K="$KUBERNETES_VERSION"; MINOR="${K#v1.}"; MINOR="${MINOR%%.*}"
K8S_LDF="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDF="$K8S_LDF -X $p.gitVersion=$K -X $p.gitMajor=1 -X $p.gitMinor=$MINOR"
  K8S_LDF="$K8S_LDF -X $p.gitTreeState=clean -X $p.gitCommit=0000000000000000000000000000000000000000"
  K8S_LDF="$K8S_LDF -X $p.buildDate=1970-01-01T00:00:00Z"
done

# spec <binary> -> "<module dir> <version> <package> <ldflags>"
spec() {
  case "$1" in
    etcd) echo "etcd $ETCD_VERSION go.etcd.io/etcd/server/v3";;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      echo "k8s $K k8s.io/kubernetes/cmd/$1";;
    kwok) echo "kwok $KWOK_VERSION sigs.k8s.io/kwok/cmd/kwok";;
    kueue) echo "kueue $KUEUE_VERSION sigs.k8s.io/kueue/cmd/kueue";;
    jobset) echo "jobset $JOBSET_VERSION sigs.k8s.io/jobset";;
    helm) echo "helm $HELM_VERSION helm.sh/helm/v4/cmd/helm";;
    *) echo "unknown component: $1 (one of: $ALL $TOOLS)" >&2; exit 2;;
  esac
}

bin_path() {  # bin_path <binary>: where the cached binary lives
  local mod ver pkg; read -r mod ver pkg <<<"$(spec "$1")"
  echo "$M2G_CACHE/bin/$1-$ver/$1"
}

build_one() {
  local name="$1" mod ver pkg ldf out tmp log start n=0 last=0 line
  read -r mod ver pkg <<<"$(spec "$name")"
  out="$(bin_path "$name")"
  if [[ -x "$out" ]]; then echo "[build] $name $ver: cached ($out)"; return 0; fi
  ldf="-s -w"
  [[ "$mod" == k8s ]] && ldf="$K8S_LDF"
  [[ "$mod" == jobset ]] && ldf="$ldf -X sigs.k8s.io/jobset/pkg/version.GitVersion=$ver"
  [[ "$mod" == helm ]] && ldf="$ldf -X helm.sh/helm/v4/internal/version.version=$ver \
    -X helm.sh/helm/v4/internal/version.metadata= -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
  log="$M2G_CACHE/logs/build-$name.log"
  tmp="$(mktemp -d "$M2G_CACHE/bin/.tmp-$name.XXXXXX")"
  echo "[build] $name $ver: building (cold: minutes; log $log)"
  start=$(date +%s)
  set +e
  (cd "$here/$mod" && go build -v -ldflags "$ldf" -o "$tmp/$name" "$pkg") >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 15
    n=$(grep -c -v -e '^go: downloading' -e '^#' "$log" 2>/dev/null || true)
    if [[ "$n" != "$last" ]]; then
      echo "[build] $name: $n packages compiled, $(( $(date +%s) - start ))s"; last="$n"
    fi
  done
  wait "$pid"; local rc=$?
  set -e
  if [[ $rc -ne 0 ]]; then
    echo "[build] $name FAILED (exit $rc); last lines of $log:" >&2
    tail -n 15 "$log" >&2; rm -rf "$tmp"; return 1
  fi
  mkdir -p "$(dirname "$out")"; mv "$tmp/$name" "$out"; rm -rf "$tmp"
  local secs=$(( $(date +%s) - start ))
  printf '%s\t%s\t%s\t%ss\t%s\n' "$(date -u +%FT%TZ)" "$name" "$ver" "$secs" "$(nproc)cpu" \
    >>"$M2G_CACHE/logs/build-times.tsv"
  echo "[build] $name $ver: done in ${secs}s -> $out"
}

if [[ "${1:-}" == "--path" ]]; then shift; bin_path "$1"; exit 0; fi
command -v go >/dev/null || { echo "go not found: Go >= 1.26 is needed to build the control plane" >&2; exit 1; }
total_start=$(date +%s)
for t in $targets; do build_one "$t"; done
echo "[build] all requested binaries present ($(( $(date +%s) - total_start ))s)"
