"""The Kueue Topology and ResourceFlavor and the KAI Topology of a site, generated from its
topology label mapping (the site configuration's ``topology``; ``m2g topology generate``).

Levels, coarse to fine: block, rack, NVLink clique, hostname (``TopologyLabels.levels``: a
level whose label is "" is left out, a label that two levels share appears once, so a site
that names racks by their clique gets block → clique → hostname). The KAI Topology has the same
levels (KAI's Topology is "derived from Kueue's Topology CRD", field-notes §5.2), the ones m2g's
planner keeps it at (``PlannerConfig.kai_topology_levels``). Pure: no I/O.

Both Topologies' levels are immutable: a site that changes its mapping deletes the flavor and
the Topologies (no workload admitted in the flavor) and applies the new ones (docs/deploy.md).
"""

from __future__ import annotations

from typing import Any

from m2g.config.site import TopologySettings

KUEUE_API = "kueue.x-k8s.io/v1beta2"
KAI_API = "kai.scheduler/v1alpha1"


def kueue_topology(t: TopologySettings) -> dict[str, Any]:
    return {"apiVersion": KUEUE_API, "kind": "Topology", "metadata": {"name": t.name},
            "spec": {"levels": [{"nodeLabel": key} for key in t.labels.levels()]}}


def resource_flavor(t: TopologySettings) -> dict[str, Any]:
    return {"apiVersion": KUEUE_API, "kind": "ResourceFlavor",
            "metadata": {"name": t.flavor.name},
            "spec": {"nodeLabels": dict(t.flavor.node_labels), "topologyName": t.name}}


def kai_topology(t: TopologySettings) -> dict[str, Any]:
    return {"apiVersion": KAI_API, "kind": "Topology", "metadata": {"name": t.name},
            "spec": {"levels": [{"nodeLabel": key} for key in t.labels.levels()]}}


def topology_objects(t: TopologySettings, *, kueue: bool = True,
                     kai: bool = True) -> list[dict[str, Any]]:
    """The Kueue Topology and ResourceFlavor (``kueue``) and the KAI Topology (``kai``)."""
    out: list[dict[str, Any]] = []
    if kueue:
        out += [kueue_topology(t), resource_flavor(t)]
    if kai:
        out.append(kai_topology(t))
    return out
