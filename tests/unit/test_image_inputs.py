"""The image's inputs agree without building it (make image is slow; tests/image checks the
built one): image/build.sh and image/Dockerfile use the same base, user and entry point, and the
kustomize tree, the chart and the package name the same image and version."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

import m2g

REPO = Path(__file__).resolve().parents[2]
ENV = dict(line.split("=", 1) for line in (REPO / "image" / "image.env").read_text().splitlines()
           if line and not line.startswith("#"))
DOCKERFILE = (REPO / "image" / "Dockerfile").read_text()
BUILD = (REPO / "image" / "build.sh").read_text()


def test_build_script_parses_and_reads_its_inputs() -> None:
    assert subprocess.run(["bash", "-n", str(REPO / "image" / "build.sh")]).returncode == 0
    assert 'source "$here/image.env"' in BUILD
    assert '-c "$repo/constraints.txt"' in BUILD  # the dependencies are the pinned ones
    assert "--config.entrypoint m2g" in BUILD and '--config.user "$UID_GID"' in BUILD


def test_dockerfile_matches_the_daemonless_build() -> None:
    bases = re.findall(r"^FROM debian:(\w+)", DOCKERFILE, flags=re.M)
    assert bases and set(bases) == {ENV["SUITE"]}
    uid, gid = ENV["UID_GID"].split(":")
    assert re.search(rf"^USER {uid}:{gid}$", DOCKERFILE, flags=re.M)
    assert f"--uid {uid} --gid {gid}" in DOCKERFILE and "--uid $uid --gid $gid" in BUILD
    assert re.search(r'^ENTRYPOINT \["m2g"\]$', DOCKERFILE, flags=re.M)
    assert "-c /src/constraints.txt" in DOCKERFILE
    assert "/opt/m2g" in DOCKERFILE and "/opt/m2g" in BUILD
    assert int(uid) != 0


def test_deploy_chart_and_package_name_the_same_image() -> None:
    overlay = yaml.safe_load((REPO / "deploy" / "overlays" / "default" / "kustomization.yaml")
                             .read_text())
    (image,) = overlay["images"]
    assert image["name"] == ENV["IMAGE_NAME"] and image["newTag"] == m2g.__version__
    dep = yaml.safe_load((REPO / "deploy" / "controller" / "deployment.yaml").read_text())
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].split(":")[0] == \
        ENV["IMAGE_NAME"]
    values = yaml.safe_load((REPO / "charts" / "m2g" / "values.yaml").read_text())
    assert values["image"]["repository"] == ENV["IMAGE_NAME"]
    chart = yaml.safe_load((REPO / "charts" / "m2g" / "Chart.yaml").read_text())
    assert chart["appVersion"] == m2g.__version__
    securities = dep["spec"]["template"]["spec"]["securityContext"]
    assert f"{securities['runAsUser']}:{securities['runAsGroup']}" == ENV["UID_GID"]


def test_the_image_archive_is_not_committed() -> None:
    assert "dist/" in (REPO / ".gitignore").read_text().split()
    assert ".venv" in (REPO / ".dockerignore").read_text().split()
