"""KWOK stages: the upstream node and pod stages from the module, plus m2g's own
"run for the duration in an annotation, then succeed" stage for Job pods.

Annotation ``m2g.io/sim-duration`` (a Go duration such as ``30s``, ``5m``, ``1h30m``, or an
RFC 3339 time to finish at) on a Job's pod template: once the pod runs on a KWOK node it
succeeds after that long. Without the annotation the pod runs until deleted, so a long-running
job stays admitted.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from localcp.gomod import ensure_module
from localcp.kube import Obj
from localcp.paths import read_versions

DURATION_ANNOTATION = "m2g.io/sim-duration"
NODE_ANNOTATION = "kwok.x-k8s.io/node"  # value "fake": the nodes this KWOK manages

_UPSTREAM = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def kwok_dir() -> Path:
    return ensure_module("sigs.k8s.io/kwok", read_versions()["KWOK_VERSION"], "kwok")


def stages() -> list[Obj]:
    """All Stage documents KWOK runs with (for --config, or as Stage objects in kind)."""
    root = kwok_dir()
    out: list[Obj] = []
    for rel in _UPSTREAM:
        out.extend(d for d in yaml.safe_load_all((root / rel).read_text()) if d)
    out.append(_timed_complete(root))
    return out


def _timed_complete(root: Path) -> Obj:
    """Upstream's pod-complete, selected only for pods with our annotation and delayed by it."""
    base = yaml.safe_load((root / "kustomize/stage/pod/fast/pod-complete.yaml").read_text())
    stage: Obj = copy.deepcopy(base)
    stage["metadata"] = {"name": "m2g-pod-complete-after-duration"}
    spec = stage["spec"]
    spec["selector"]["matchExpressions"].append(
        {"key": f'.metadata.annotations["{DURATION_ANNOTATION}"]', "operator": "Exists"})
    spec.pop("weightFrom", None)
    spec["delay"] = {"durationFrom": {
        "expressionFrom": f'.metadata.annotations["{DURATION_ANNOTATION}"]'}}
    return stage


def configuration(parallelism: int = 16) -> Obj:
    """KWOK's own options: more parallel stage and lease workers than the default 4, so that
    a 1,800-node factory turns Ready quickly."""
    return {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"nodePlayStageParallelism": parallelism,
                        "podPlayStageParallelism": parallelism,
                        "nodeLeaseParallelism": parallelism}}


def write_config(path: Path) -> str:
    """--config for the out-of-cluster KWOK: its configuration plus every Stage."""
    path.write_text(yaml.safe_dump_all([configuration(), *stages()], sort_keys=False))
    return str(path)
