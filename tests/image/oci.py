"""The image archive of ``make image`` unpacked into a root filesystem, and commands run in it
as the image runs them: chroot as its user, only its PATH and what the caller adds to the
environment. Shared by tests/image (the image alone) and the chart e2e (the image's entry point
as the chart's Deployment starts it, in-cluster). Needs root (chroot) and umoci."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

import m2g

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = REPO / "dist" / f"m2g-{m2g.__version__}-oci.tar"
ENV = dict(line.split("=", 1) for line in (REPO / "image" / "image.env").read_text().splitlines()
           if line and not line.startswith("#"))
PATH = "PATH=/opt/m2g/bin:/usr/local/bin:/usr/bin:/bin"


def unpack_layout(out: Path) -> Path:
    """The archive's OCI layout under ``out`` (fails the test, no traceback, without it)."""
    if not ARCHIVE.is_file():
        pytest.fail(f"no {ARCHIVE.relative_to(REPO)}: run make image first", pytrace=False)
    with tarfile.open(ARCHIVE) as tar:
        tar.extractall(out, filter="tar")
    return out


def unpack_rootfs(layout: Path, out: Path) -> Path:
    """The image's root filesystem (umoci unpack of the layout's tag) under ``out``."""
    if shutil.which("umoci") is None:
        pytest.fail("no umoci: apt-get install umoci", pytrace=False)
    bundle = out / "b"
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{m2g.__version__}", str(bundle)],
                   check=True, capture_output=True)
    return bundle / "rootfs"


def path_in(rootfs: Path, path: str) -> Path:
    """Where the absolute ``path`` of the image is on this machine: its symlinks resolved inside
    ``rootfs`` (Debian's /var/run is a symlink to /run: followed from here it would lead to the
    host's /run)."""
    at = rootfs
    parts = list(Path(path).relative_to("/").parts)
    for _ in range(256):
        if not parts:
            return at
        nxt = at / parts.pop(0)
        if nxt.is_symlink():
            target = Path(nxt.readlink())
            parts = [*target.parts[1:], *parts] if target.is_absolute() else [
                *target.parts, *parts]
            at = rootfs if target.is_absolute() else at
        else:
            at = nxt
        if not at.resolve().is_relative_to(rootfs.resolve()):
            raise ValueError(f"{path} leads out of the image's root filesystem")
    raise ValueError(f"{path}: too many symlinks in the image")


def argv(rootfs: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """``args`` in the image's root filesystem as its user, with only the image's PATH, no
    HOME and ``env``."""
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    return ["chroot", f"--userspec={ENV['UID_GID']}", str(rootfs), "/usr/bin/env", "-i",
            PATH, "HOME=/nonexistent", *extra, *args]


def inside(rootfs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(rootfs, *args), capture_output=True, text=True, timeout=300,
                          check=False)
