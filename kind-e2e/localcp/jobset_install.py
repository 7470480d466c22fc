"""JobSet's install manifests for a cluster that pulls images (the kind path), rendered from the
JobSet module that kind-e2e/tools/jobset/go.sum pins.

Upstream's release ``manifests.yaml`` is ``kustomize build config/default`` with the manager's
image set to ``registry.k8s.io/jobset/jobset:<version>`` (``make artifacts
IMAGE_REGISTRY=registry.k8s.io/jobset``). This does the same with ``kubectl kustomize`` over
the module's own ``config/default`` (CRD, Namespace, RBAC, the controller Deployment with its
Configuration, the webhooks and their Service, JobSet's internal certificate management), after
checking the module's files against the pinned ``h1:`` hash: nothing else is downloaded and
nothing upstream is copied into the repository. The local control plane runs the same module's
binary as a process instead (localcp.jobset).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from localcp import UserError
from localcp.gomod import verified_module
from localcp.paths import binary, read_versions

MODULE = "sigs.k8s.io/jobset"
#: Where upstream's releases publish the controller image (the release issue template).
IMAGE = "registry.k8s.io/jobset/jobset"
_MANAGER = "config/components/manager/kustomization.yaml"


def _kubectl() -> str:
    """The cached kubectl of the local build, else one on PATH."""
    local = binary("kubectl")
    found = str(local) if local.exists() else shutil.which("kubectl")
    if found is None:
        raise UserError("kubectl not found: install it, or build it with "
                        "kind-e2e/tools/build.sh kubectl")
    return found


def _staging_image(root: Path, version: str) -> str:
    """The image name the module's manager kustomization sets (upstream's staging registry),
    which must carry the pinned version as its tag."""
    images = (yaml.safe_load((root / _MANAGER).read_text()) or {}).get("images") or []
    if len(images) != 1 or not images[0].get("newName"):
        raise UserError(f"expected one image in JobSet's {_MANAGER}, found {images}")
    if images[0].get("newTag") != version:
        raise UserError(f"JobSet's {_MANAGER} sets tag {images[0].get('newTag')!r}, "
                        f"not the pinned {version}")
    return str(images[0]["newName"])


def render(root: Path, version: str) -> str:
    """``kubectl kustomize`` of a kustomization over ``root``/config/default that sets the
    manager's image to ``IMAGE:version``: the manifests as text."""
    overlay = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
               "images": [{"name": _staging_image(root, version), "newName": IMAGE,
                           "newTag": version}]}
    with tempfile.TemporaryDirectory(prefix="m2g-jobset-") as tmp:
        # kustomize takes a folder outside the kustomization's root only as a relative path
        overlay["resources"] = [os.path.relpath((root / "config/default").resolve(), tmp)]
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
        out = subprocess.run([_kubectl(), "kustomize", tmp], capture_output=True, text=True,
                             check=False)
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines() or ["no output"]
        raise UserError(f"kubectl kustomize of JobSet's config/default failed: {lines[-1]}")
    return out.stdout


def manifests() -> str:
    """The install manifests of the pinned JobSet, with a header naming module, hash and
    image (for ``kubectl apply --server-side -f -``)."""
    version = read_versions()["JOBSET_VERSION"]
    root, pinned = verified_module(MODULE, version, "jobset")
    header = (f"# JobSet {version}: {MODULE}@{version} config/default ({pinned}, "
              f"kind-e2e/tools/jobset/go.sum), image {IMAGE}:{version}\n"
              f"# rendered by: python kind-e2e/localcp jobset-manifests\n")
    return header + render(root, version)
