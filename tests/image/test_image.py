"""The OCI image that ``make image`` wrote (dist/m2g-<version>-oci.tar), without a container
engine: its configuration (non-root user, entrypoint m2g), and m2g run inside its unpacked root
filesystem with chroot as user 65532 — the image's own Python, m2g and shipped data.

Run by ``make image-test`` (needs root for chroot and umoci); not part of ``make test``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import m2g
from tests.image.oci import ENV, REPO, inside, unpack_layout, unpack_rootfs

pytestmark = pytest.mark.image


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_layout(tmp_path_factory.mktemp("oci"))


def blob(layout: Path, digest: str) -> Any:
    algo, hexa = digest.split(":")
    return json.loads((layout / "blobs" / algo / hexa).read_text())


@pytest.fixture(scope="module")
def rootfs(layout: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_rootfs(layout, tmp_path_factory.mktemp("bundle"))


def test_the_config_runs_m2g_as_a_non_root_user(layout: Path) -> None:
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == m2g.__version__
    digest = (REPO / "dist" / f"m2g-{m2g.__version__}-oci.digest").read_text().strip()
    assert entry["digest"] == digest
    manifest = blob(layout, entry["digest"])
    config = blob(layout, manifest["config"]["digest"])["config"]
    assert config["User"] == ENV["UID_GID"] != "0:0"
    assert config["Entrypoint"] == ["m2g"]
    assert any(e.startswith("PATH=/opt/m2g/bin:") for e in config["Env"])
    assert config["Labels"]["org.opencontainers.image.version"] == m2g.__version__


#: ELF e_machine -> the OCI architecture
ELF_MACHINES = {0x3E: "amd64", 0xB7: "arm64"}


def test_the_config_names_the_architecture_of_the_image_s_binaries(
        layout: Path, rootfs: Path) -> None:
    """A runtime picks the image by its config's architecture: it must be the one the root
    filesystem's Python was built for (build.sh said amd64 whatever it built)."""
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    config = blob(layout, blob(layout, entry["digest"])["config"]["digest"])
    python = (rootfs / "usr" / "bin").glob("python3.*")
    elf = next(p for p in sorted(python) if p.name[8:].isdigit()).read_bytes()[:20]
    assert elf[:4] == b"\x7fELF"
    machine = int.from_bytes(elf[18:20], "little" if elf[5] == 1 else "big")
    assert (config["os"], config["architecture"]) == ("linux", ELF_MACHINES.get(machine))


def test_m2g_runs_inside_the_image(rootfs: Path) -> None:
    version = inside(rootfs, "m2g", "--version")
    assert version.returncode == 0 and version.stdout == f"m2g {m2g.__version__}\n", version
    who = inside(rootfs, "python3", "-c", "import os; print(os.getuid(), os.getgid())")
    assert who.stdout.split() == ENV["UID_GID"].split(":")
    listed = inside(rootfs, "m2g", "templates", "list")
    assert listed.returncode == 0 and "rack-benchmark" in listed.stdout, listed.stderr
    run_help = inside(rootfs, "m2g", "run", "--help")
    assert run_help.returncode == 0 and "--config" in run_help.stdout, run_help.stderr


def test_the_example_policies_pass_inside_the_image(rootfs: Path) -> None:
    folder = inside(rootfs, "m2g", "policy", "examples").stdout.strip()
    assert folder.startswith("/opt/m2g/"), folder
    tested = inside(rootfs, "m2g", "policy", "test", folder)
    assert tested.returncode == 0 and " 0 failed" in tested.stdout, tested.stdout + tested.stderr


def test_the_image_holds_no_build_leftovers(rootfs: Path) -> None:
    assert not (rootfs / "tmp" / "wheels").exists()
    assert not list((rootfs / "var" / "lib" / "apt" / "lists").glob("*_Packages"))
    assert not (rootfs / "opt" / "m2g" / "bin" / "pip").exists()
    assert (rootfs / "etc" / "ssl" / "certs" / "ca-certificates.crt").is_file()
