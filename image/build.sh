#!/usr/bin/env bash
# Build m2g's OCI image on this machine without a container engine (make image):
#   1. the m2g wheel and every dependency as wheels (pinned by constraints.txt);
#   2. a Debian root filesystem with mmdebstrap (python3 and CA certificates only), the wheels
#      installed into /opt/m2g (a venv), a non-root user m2g (65532:65532);
#   3. an OCI image from it with umoci: one layer, user 65532, entrypoint `m2g`;
#   4. dist/m2g-<version>-oci.tar, an OCI layout archive (skopeo copy oci-archive:..., podman
#      load, crane push), and dist/m2g-<version>-oci.digest, the manifest's digest to pin.
# Needs root (or fakeroot-free mmdebstrap unshare mode) and: apt-get install mmdebstrap umoci.
# The Dockerfile next to this script builds the same image with Docker.
#
#   image/build.sh [--keep]      --keep leaves the work folder (rootfs, bundle) for inspection
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
py="${PY:-$repo/.venv/bin/python}"
keep=0; [[ "${1:-}" == "--keep" ]] && keep=1
# shellcheck disable=SC1091
source "$here/image.env"   # SUITE, MIRROR, UID_GID, IMAGE_NAME
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/src/m2g/__init__.py")"
for tool in mmdebstrap umoci; do
    command -v "$tool" >/dev/null || {
        echo "image: $tool not found: apt-get install mmdebstrap umoci (or use image/Dockerfile)" >&2
        exit 1; }
done
[[ -x "$py" ]] || { echo "image: no $py: run make venv first" >&2; exit 1; }
# mmdebstrap builds the machine's own architecture, and pip fetches this machine's wheels: the
# image is for it (amd64 here; arm64 on a GB300 host's Grace CPU). Other architectures: the
# Dockerfile with docker buildx --platform.
arch="$(dpkg --print-architecture)"
case "$arch" in
    amd64|arm64) ;;
    *) echo "image: dpkg architecture $arch is not amd64 or arm64 (use image/Dockerfile)" >&2; exit 1;;
esac
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct)}"

work="$(mktemp -d "${TMPDIR:-/var/tmp}/m2g-image.XXXXXX")"
(( keep )) || trap 'rm -rf "$work"' EXIT
start=$(date +%s)
step() { echo "[image] $* ($(( $(date +%s) - start ))s)"; }

step "wheels: m2g $version and its dependencies (constraints.txt)"
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$work/wheels" "$repo"
"$py" -m pip wheel -q -w "$work/wheels" -c "$repo/constraints.txt" "$work"/wheels/m2g-*.whl

step "rootfs: Debian $SUITE (mmdebstrap)"
uid="${UID_GID%%:*}"; gid="${UID_GID##*:}"
# Commands in the new root run with a clean environment (none of this host's PIP_* settings).
in_root='chroot "$1" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C.UTF-8'
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp '$work'/wheels/*.whl \"\$1/tmp/wheels/\"" \
    --customize-hook="$in_root python3 -m venv /opt/m2g" \
    --customize-hook="$in_root /opt/m2g/bin/pip install -q --no-index --no-cache-dir --find-links /tmp/wheels m2g" \
    --customize-hook="$in_root /opt/m2g/bin/pip uninstall -q -y pip" \
    --customize-hook='ln -s /opt/m2g/bin/m2g "$1/usr/local/bin/m2g"' \
    --customize-hook="$in_root groupadd --gid $gid m2g" \
    --customize-hook="$in_root useradd --uid $uid --gid $gid --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin m2g" \
    --customize-hook='rm -rf "$1/tmp/wheels" "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
    "$SUITE" "$work/rootfs" "$MIRROR"

step "image: umoci (one layer, linux/$arch, user $UID_GID, entrypoint m2g)"
layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$version"
umoci unpack --image "$layout:$version" "$work/bundle" >/dev/null
rm -rf "$work/bundle/rootfs"
mv "$work/rootfs" "$work/bundle/rootfs"
umoci repack --image "$layout:$version" "$work/bundle"
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
umoci config --image "$layout:$version" --created "$created" --history.created "$created" \
    --os linux --architecture "$arch" --config.user "$UID_GID" --config.workingdir / \
    --config.entrypoint m2g \
    --config.env PATH=/opt/m2g/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
    --config.label "org.opencontainers.image.title=m2g" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.licenses=Apache-2.0" \
    --config.label "org.opencontainers.image.base.name=debian:$SUITE" \
    --manifest.annotation "org.opencontainers.image.version=$version"
umoci gc --layout "$layout"

step "archive: dist/m2g-$version-oci.tar"
mkdir -p "$repo/dist"
archive="$repo/dist/m2g-$version-oci.tar"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    -C "$layout" -cf "$archive" .
digest="$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' \
    "$layout/index.json")"
echo "$digest" > "$repo/dist/m2g-$version-oci.digest"
step "done: $archive ($(du -h "$archive" | cut -f1)), manifest $digest"
echo "push: skopeo copy oci-archive:$archive:$version docker://$IMAGE_NAME:$version"
(( keep )) && echo "work folder kept: $work"
exit 0
