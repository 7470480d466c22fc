"""What `make demo` and `make test` check in their first second (kind-e2e/prereqs.py, issue 10
"A fresh machine"): each missing piece with the exact command that installs it, exit 1 before
anything is built; exit 0 when all is there. Run as the Makefile runs it: a subprocess of the
system's python, on a PATH and a build cache made for each case."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from localcp.paths import BINARIES

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "kind-e2e" / "prereqs.py"


def _tools(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = folder / name
        tool.write_text("#!/bin/sh\necho 'go version go1.26.8 linux/amd64'\n")
        tool.chmod(0o755)
    return folder


def _cache(folder: Path, *built: str) -> Path:
    """A build cache holding ``built`` where kind-e2e/localcp/paths.binary looks for them."""
    env = {**os.environ, "M2G_CACHE": str(folder)}
    for name in built:
        path = Path(subprocess.run(
            [sys.executable, "-c", "import sys; sys.path.insert(0, 'kind-e2e'); "
             f"from localcp.paths import binary; print(binary({name!r}))"],
            cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.strip())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return folder


def run(target: str, path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": str(path), "HOME": str(cache.parent), "M2G_CACHE": str(cache)}
    return subprocess.run([sys.executable, str(SCRIPT), target], env=env, capture_output=True,
                          text=True, check=False, timeout=30)


@pytest.mark.parametrize("target", ["demo", "test"])
def test_a_clean_machine_is_told_what_to_install_in_its_first_second(
        tmp_path: Path, target: str) -> None:
    cache = tmp_path / "cache"
    out = run(target, _tools(tmp_path / "bin"), cache)
    # nothing built or downloaded: the cache the build would fill is not even made
    assert not cache.exists() or not any(cache.rglob("*")), sorted(cache.rglob("*"))
    assert out.returncode == 1, out
    assert f"make {target}: missing prerequisites (nothing was built or started)" in out.stderr
    assert "Go >= 1.26" in out.stderr and "go.dev/dl/go1.26" in out.stderr
    assert "sudo apt-get install -y git" in out.stderr
    assert "sudo apt-get install -y prometheus" in out.stderr
    assert ("- prometheus and promtool" in out.stderr) == (target == "test")


def test_everything_there_is_exit_0(tmp_path: Path) -> None:
    cache = _cache(tmp_path / "cache", *BINARIES, "helm")
    out = run("test", _tools(tmp_path / "bin", "prometheus", "promtool"), cache)
    assert (out.returncode, out.stderr) == (0, "")
    out = run("demo", _tools(tmp_path / "bin2", "prometheus"), cache)
    assert (out.returncode, out.stderr) == (0, "")


def test_make_test_needs_go_for_helm_when_only_the_control_plane_is_built(
        tmp_path: Path) -> None:
    """`make test` builds helm before anything else: a machine with the control plane's
    binaries but no helm and no Go is told so first, not after the lint."""
    cache = _cache(tmp_path / "cache", *BINARIES)
    tools = _tools(tmp_path / "bin", "prometheus", "promtool", "git")
    out = run("test", tools, cache)
    assert out.returncode == 1, out
    assert "Go >= 1.26" in out.stderr and "helm" in out.stderr
    assert run("demo", tools, cache).returncode == 0  # the demo does not need helm
    out = run("test", _tools(tmp_path / "bin", "go"), cache)  # Go there: helm can be built
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64"),
                                               ("arm64", "arm64")])
def test_the_go_command_names_this_machine_s_architecture(machine: str, arch: str) -> None:
    """A GB300 host (Grace) is arm64: the printed command must fetch Go for it, not amd64."""
    spec = importlib.util.spec_from_file_location("prereqs", SCRIPT)
    assert spec and spec.loader
    prereqs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prereqs)
    cmd = prereqs.go_install(machine)
    assert f"go.dev/dl/go1.26.8.linux-{arch}.tar.gz" in cmd, cmd
    assert "go.dev/dl/" in prereqs.go_install("riscv64")  # no release guessed: the page
