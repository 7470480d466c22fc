"""Optional CRDs of other workload APIs (JobSet, LeaderWorkerSet, Kubeflow Trainer v2 and the
Kubeflow training-operator v1 jobs), read from the modules that Kueue's go.sum pins.

Opt-in: ``localcp up --extra-crds lws,trainer`` or ``M2G_EXTRA_CRDS=all``. Only the CRDs are
installed: no controller for these kinds runs and Kueue does not integrate them, so such
objects are stored, validated and defaulted (server-side dry-run works) but not run. JobSet is
the exception: its CRD and controller are part of the control plane (localcp.jobset) whatever
is asked here; ``jobset`` stays a valid name (the same CRD, applied once).
"""

from __future__ import annotations

import os

import yaml

from localcp import UserError
from localcp.gomod import ensure_module
from localcp.kube import Obj
from localcp.paths import TOOLS

# name -> (module, folder or file inside it)
EXTRA_CRDS: dict[str, tuple[str, str]] = {
    "jobset": ("sigs.k8s.io/jobset", "config/components/crd/bases"),
    "lws": ("sigs.k8s.io/lws", "config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml"),
    "trainer": ("github.com/kubeflow/trainer/v2", "manifests/base/crds"),
    "kubeflow": ("github.com/kubeflow/training-operator", "manifests/base/crds"),
}


def _pinned_version(module: str) -> str:
    """The version of ``module`` in Kueue's wrapper go.mod."""
    for line in (TOOLS / "kueue" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == module:
            return parts[1]
    raise UserError(f"{module} is not in kind-e2e/tools/kueue/go.mod")


def requested(cli_value: str | None) -> list[str]:
    """Names from ``--extra-crds`` or ``$M2G_EXTRA_CRDS`` (comma-separated, or ``all``)."""
    raw = cli_value if cli_value is not None else os.environ.get("M2G_EXTRA_CRDS", "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if names == ["all"]:
        return list(EXTRA_CRDS)
    unknown = [n for n in names if n not in EXTRA_CRDS]
    if unknown:
        raise UserError(f"unknown extra CRD set(s) {', '.join(unknown)}; "
                        f"choose from {', '.join(EXTRA_CRDS)} or all")
    return names


def crds(names: list[str]) -> list[Obj]:
    out: list[Obj] = []
    for name in names:
        module, rel = EXTRA_CRDS[name]
        path = ensure_module(module, _pinned_version(module), "kueue") / rel
        files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
        for f in files:
            out.extend(d for d in yaml.safe_load_all(f.read_text())
                       if d and d.get("kind") == "CustomResourceDefinition")
    return out
