"""What `make demo` and `make test` need besides the Python packages, said in their first second.

    python3 kind-e2e/prereqs.py demo|test

Standard library only (it runs before the venv exists). Checks, for the target:

* Python >= 3.11 with the ``venv`` module (Debian ships it separately: python3-venv);
* Go >= 1.26, unless every control-plane binary (and, for ``test``, helm) is already built in
  the cache ($M2G_CACHE/bin, kind-e2e/localcp/paths.py), and git (the module proxy fetch);
* Debian's ``prometheus`` (the demo scrapes the simulator; the signal tests run a real one) and,
  for ``test``, ``promtool`` (it backfills the H200 recording).

Exits 0 when all is there; otherwise prints each missing piece with the exact command that
installs it, and exits 1 — before any minutes are spent on a build.
"""

from __future__ import annotations

import importlib.util
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from localcp.paths import BINARIES, binary

GO_MIN = (1, 26)
GO_RELEASE = "go1.26.8"
#: platform.machine() -> Go's name for the architecture (a GB300 host's Grace CPU is arm64)
GO_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
APT = "sudo apt-get install -y"


def go_install(machine: str | None = None) -> str:
    """The command that installs Go's release for this machine's architecture."""
    arch = GO_ARCH.get((machine or platform.machine()).lower())
    if arch is None:
        return f"install Go >= {GO_MIN[0]}.{GO_MIN[1]} for {machine or platform.machine()}: " \
               "https://go.dev/dl/"
    return (f"curl -fsSL https://go.dev/dl/{GO_RELEASE}.linux-{arch}.tar.gz | "
            "sudo tar -C /usr/local -xz && export PATH=$PATH:/usr/local/go/bin")


def go_version() -> tuple[int, int] | None:
    if shutil.which("go") is None:
        return None
    out = subprocess.run(["go", "version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"go(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def missing(target: str) -> list[tuple[str, str]]:
    """(what is missing, the command that installs it) for ``demo`` or ``test``."""
    out: list[tuple[str, str]] = []
    if sys.version_info < (3, 11):
        out.append((f"Python >= 3.11 (this is {sys.version.split()[0]})",
                    f"{APT} python3 (Debian 12 has 3.11), or make PYTHON=python3.11 {target}"))
    if importlib.util.find_spec("venv") is None or importlib.util.find_spec("ensurepip") is None:
        out.append(("the Python venv module", f"{APT} python3-venv"))
    # `make test` also builds helm (the chart's tests render with it) from its Go module
    needed = BINARIES + (("helm",) if target == "test" else ())
    unbuilt = [b for b in needed if not binary(b).exists()]
    if unbuilt:
        have = go_version()
        if have is None or have < GO_MIN:
            now = "not installed" if have is None else f"go{have[0]}.{have[1]} is too old"
            out.append((f"Go >= {GO_MIN[0]}.{GO_MIN[1]} to build the local control plane "
                        f"({now}; {len(unbuilt)} of {len(needed)} binaries not built yet: "
                        f"{', '.join(unbuilt)})", go_install()))
        if shutil.which("git") is None:
            out.append(("git (Go fetches the pinned modules)", f"{APT} git"))
    tools = ["prometheus"] + (["promtool"] if target == "test" else [])
    absent = [t for t in tools if shutil.which(t) is None]
    if absent:
        out.append((" and ".join(absent), f"{APT} prometheus   # Debian's, brings promtool"))
    return out


def main(argv: list[str]) -> int:
    target = argv[1] if len(argv) > 1 else "test"
    if target not in ("demo", "test"):
        print("usage: prereqs.py demo|test", file=sys.stderr)
        return 2
    found = missing(target)
    if not found:
        return 0
    print(f"make {target}: missing prerequisites (nothing was built or started):",
          file=sys.stderr)
    for what, how in found:
        print(f"  - {what}\n      {how}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
