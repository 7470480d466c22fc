"""Policy objects read from a cluster (``m2g.io/v1alpha1`` ``Policy``) as named YAML texts.

The texts go through the same loader as files (m2g.policy.loader.read_texts), so a Policy
object and a policy file are checked identically; problems name ``Policy/<name>:LINE``.
"""

from __future__ import annotations

from typing import Any

import yaml


def policy_texts(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Policy objects as YAML documents named ``Policy/<name>``, sorted by name."""
    out = {}
    for obj in sorted(objects, key=lambda o: str((o.get("metadata") or {}).get("name", ""))):
        name = str((obj.get("metadata") or {}).get("name", ""))
        doc = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
               "metadata": {"name": name}, "spec": obj.get("spec")}
        out[f"Policy/{name}"] = yaml.safe_dump(doc, sort_keys=False)
    return out
