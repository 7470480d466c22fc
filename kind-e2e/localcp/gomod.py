"""Access to upstream files (CRDs, webhook manifests, KWOK stages) through the Go module cache.

Nothing upstream is copied into the repository: the files are read from the module that the
build already downloaded (``go mod download`` through the module proxy when missing).
``verified_module`` also checks the module's files against the ``h1:`` hash that the wrapper
module's go.sum pins (Go's dirhash, what ``go mod verify`` computes).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
from pathlib import Path

from localcp import UserError
from localcp.paths import TOOLS, cache_dir, module_dir


def go_env() -> dict[str, str]:
    """The environment of kind-e2e/tools/goenv.sh, for Python callers."""
    cache = cache_dir()
    return {
        **os.environ,
        "M2G_CACHE": str(cache),
        "GOMODCACHE": str(cache / "gomod"),
        "GOCACHE": str(cache / "gocache"),
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
        "GOFLAGS": "-trimpath -buildvcs=false",
        "GOPROXY": os.environ.get("GOPROXY", "https://proxy.golang.org"),
        "GOSUMDB": "off",
    }


def ensure_module(module: str, version: str, tool_dir: str) -> Path:
    """Directory of ``module@version`` in the module cache; downloads it if missing, using the
    pinned go.sum of kind-e2e/tools/<tool_dir>."""
    path = module_dir(module, version)
    if path.is_dir():
        return path
    try:
        out = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@{version}"],
            cwd=TOOLS / tool_dir, env=go_env(), capture_output=True, text=True, check=True,
        )
    except FileNotFoundError as exc:
        raise UserError("go not found: Go >= 1.26 is needed to fetch upstream manifests") from exc
    except subprocess.CalledProcessError as exc:
        raise UserError(f"go mod download {module}@{version} failed: "
                        f"{exc.stderr.strip()[-300:]}") from exc
    return Path(json.loads(out.stdout)["Dir"])


def pinned_hash(module: str, version: str, tool_dir: str) -> str:
    """The ``h1:`` hash of ``module@version`` in kind-e2e/tools/<tool_dir>/go.sum."""
    path = TOOLS / tool_dir / "go.sum"
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[:2] == [module, version]:
            return fields[2]
    raise UserError(f"{module} {version} is not pinned in {path}")


def dir_hash(root: Path, prefix: str) -> str:
    """Go's dirhash.HashDir(root, prefix, Hash1): SHA-256 over the sorted lines
    ``<sha256 of file>  <prefix>/<path>`` of every file below ``root``."""
    names = sorted(f"{prefix}/{p.relative_to(root).as_posix()}"
                   for p in root.rglob("*") if p.is_file())
    outer = hashlib.sha256()
    for name in names:
        inner = hashlib.sha256((root / name[len(prefix) + 1:]).read_bytes()).hexdigest()
        outer.update(f"{inner}  {name}\n".encode())
    return "h1:" + base64.b64encode(outer.digest()).decode()


def verified_module(module: str, version: str, tool_dir: str) -> tuple[Path, str]:
    """``ensure_module``, then its files checked against the hash go.sum pins: the directory
    and that hash. A module cache whose copy differs is an error, not a silent fallback."""
    want = pinned_hash(module, version, tool_dir)
    path = ensure_module(module, version, tool_dir)
    have = dir_hash(path, f"{module}@{version}")
    if have != want:
        raise UserError(f"{path} does not match {module} {version} {want} pinned in "
                        f"kind-e2e/tools/{tool_dir}/go.sum (it hashes to {have}); remove it "
                        f"and run again")
    return path, want
