"""Access to upstream files (CRDs, webhook manifests, KWOK stages) through the Go module cache.

Nothing upstream is copied into the repository: the files are read from the module that the
build already downloaded (``go mod download`` through the module proxy when missing).
"""

from __future__ import annotations

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
