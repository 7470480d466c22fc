# Sourced by the build scripts: the Go environment of the local control plane's builds.
# Everything lives under one cache folder outside the repository (override with M2G_CACHE).
export M2G_CACHE="${M2G_CACHE:-${HOME:-$(cd ~ && pwd)}/.cache/m2g}"
export GOMODCACHE="$M2G_CACHE/gomod"
export GOCACHE="$M2G_CACHE/gocache"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-trimpath -buildvcs=false"
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
# The module proxy is the only network we may use; go.sum files pin the hashes.
export GOSUMDB=off
