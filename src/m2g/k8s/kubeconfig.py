"""Which kubeconfig kubectl would read, merged as kubectl merges a ``$KUBECONFIG`` list, and
the namespace its context defaults to. No API client here: the CLI reads it before (or
without) connecting.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from m2g import yamlbounds

#: A kubeconfig file, at most (the client refuses a larger one the same way).
KUBECONFIG_BYTES = 4 << 20

#: Where a pod's ServiceAccount namespace is mounted (in-cluster: no kubeconfig).
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def resolve_kubeconfig(explicit: str | os.PathLike[str] | None = None,
                       env: Mapping[str, str] | None = None,
                       home: Path | None = None) -> str | None:
    """The kubeconfig kubectl would use; None means in-cluster (service account). A
    ``$KUBECONFIG`` list gives its existing files joined by ``os.pathsep``: kubectl and kr8s
    merge them (the first file to set a context, cluster, user or current-context wins)."""
    if explicit:
        return str(explicit)
    environ = os.environ if env is None else env
    value = environ.get("KUBECONFIG", "")
    parts = [str(Path(p).expanduser()) for p in value.split(os.pathsep)
             if p and Path(p).expanduser().exists()]
    if parts:
        return os.pathsep.join(dict.fromkeys(parts))
    default = (home or Path.home()) / ".kube" / "config"
    return str(default) if default.exists() else None


def merged_kubeconfig(paths: str) -> dict[str, Any]:
    """The files of a ``$KUBECONFIG`` list merged as kubectl merges them: the first to name a
    context, cluster or user (or to set current-context) wins. Raises OSError/YAMLError."""
    out: dict[str, Any] = {"contexts": [], "clusters": [], "users": []}
    for part in paths.split(os.pathsep):
        try:
            docs = yamlbounds.load_file(Path(part), KUBECONFIG_BYTES)
        except ValueError as exc:  # the client's check_kubeconfig says it in one line
            raise yaml.YAMLError(str(exc)) from None
        cfg = (docs[0] if len(docs) == 1 else None) or {}
        if not isinstance(cfg, dict):
            continue
        if not out.get("current-context") and cfg.get("current-context"):
            out["current-context"] = cfg["current-context"]
        for key in ("contexts", "clusters", "users"):
            have = {e.get("name") for e in out[key]}
            out[key] += [e for e in cfg.get(key) or [] if isinstance(e, dict)
                         and e.get("name") not in have]
    return out


def context_namespace(kubeconfig: str | None = None, context: str | None = None,
                      env: Mapping[str, str] | None = None, home: Path | None = None,
                      sa_namespace: Path = SA_NAMESPACE) -> str:
    """The namespace kubectl defaults to: the context's, in a pod the ServiceAccount's, else
    ``default`` (also when the kubeconfig cannot be read: the command then says why)."""
    path = resolve_kubeconfig(kubeconfig, env, home)
    try:
        if path is None:
            return sa_namespace.read_text().strip() or "default"
        cfg = merged_kubeconfig(path)
        name = context or cfg.get("current-context")
        ctx = next((c.get("context") or {} for c in cfg["contexts"] if c.get("name") == name),
                   {})
        return str(ctx.get("namespace") or "default")
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return "default"
