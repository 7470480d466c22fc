"""Policy objects read from a cluster (``m2g.io/v1alpha1`` ``Policy`` and ``TenantPolicy``) as
named YAML texts.

The texts go through the same loader as files (m2g.policy.loader.read_texts), so a Policy
object and a policy file are checked identically; problems name ``Policy/<name>:LINE``.

A ``TenantPolicy`` (namespaced, a tenant's own) becomes the Policy ``tenant.<ns>.<name>`` with
the match condition ``workload.namespace == '<ns>'`` put first by m2g, and ``narrow_tenants``
refuses one that could do more than tighten its own namespace's admissions: another stage than
Admission, a rule that admits or sets podSetUpdates. Problems name
``TenantPolicy/<ns>/<name>:LINE``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from m2g.policy.errors import Problem
from m2g.policy.loader import Sources
from m2g.policy.spec import Decision, Stage

TENANT_KIND = "TenantPolicy"
TENANT_PREFIX = "TenantPolicy/"
#: The match condition m2g puts first in every TenantPolicy.
TENANT_MATCH = "m2g_tenant_namespace"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _sort_key(obj: dict[str, Any]) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))


def policy_texts(objects: list[dict[str, Any]]) -> dict[str, str]:
    """Policy objects as YAML documents named ``Policy/<name>`` (TenantPolicies
    ``TenantPolicy/<ns>/<name>``), sorted."""
    out = {}
    for obj in sorted(objects, key=_sort_key):
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        if obj.get("kind") == TENANT_KIND:
            ns = str(meta.get("namespace", ""))
            out[f"{TENANT_PREFIX}{ns}/{name}"] = yaml.safe_dump(
                _tenant_doc(obj, ns, name), sort_keys=False)
            continue
        doc = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
               "metadata": {"name": name}, "spec": obj.get("spec")}
        out[f"Policy/{name}"] = yaml.safe_dump(doc, sort_keys=False)
    return out


def _tenant_doc(obj: dict[str, Any], ns: str, name: str) -> dict[str, Any]:
    """The Policy a TenantPolicy stands for: its own namespace's workloads only."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and _DNS_LABEL.match(ns):
        given = spec.get("matchConditions")
        own = [{"name": TENANT_MATCH, "expression": f"workload.namespace == '{ns}'"}]
        spec = {**spec, "matchConditions": own + (given if isinstance(given, list) else [])}
    # else: as given, without m2g's condition — narrow_tenants (or the loader) refuses it
    return {"apiVersion": obj.get("apiVersion"), "kind": "Policy",
            "metadata": {"name": f"tenant.{ns}.{name}"}, "spec": spec}


def narrow_tenants(sources: Sources) -> Sources:
    """``sources`` without the TenantPolicies that could do more than tighten their namespace's
    admissions (each refused one is a problem of its own object); a set of TenantPolicies
    with no platform Policy is a problem of the whole set (it would admit everything else)."""
    kept = []
    for doc, pol in sources.policies:
        if not doc.file.startswith(TENANT_PREFIX):
            kept.append((doc, pol))
            continue
        why = _tenant_violation(pol.spec)
        if why:
            sources.problems.append(Problem(doc.file, doc.start_line, pol.metadata.name, "",
                                            why))
        else:
            kept.append((doc, pol))
    sources.policies = kept
    if any(f.file.startswith(TENANT_PREFIX) for f, _ in kept) and not any(
            not f.file.startswith(TENANT_PREFIX) for f, _ in kept):
        sources.problems.append(Problem(
            sources.origin or "the Policy objects", 0, "", "",
            "only TenantPolicies and no platform Policy: the workloads of every other "
            "namespace would be admitted unchecked"))
    return sources


def _tenant_violation(spec: Any) -> str:
    if spec.stage is not Stage.ADMISSION:
        return f"a TenantPolicy may only use stage Admission, not {spec.stage.value}"
    first = spec.match_conditions[0].name if spec.match_conditions else ""
    if first != TENANT_MATCH:
        return "a TenantPolicy needs a DNS-label namespace"
    for rule in spec.rules:
        if rule.decision not in (Decision.DEFER, Decision.REJECT):
            return (f"rule {rule.name}: a TenantPolicy may only Defer or Reject (it can "
                    "tighten its namespace's admissions, never admit)")
        if rule.pod_set_updates:
            return f"rule {rule.name}: a TenantPolicy may not set podSetUpdates"
    return ""
