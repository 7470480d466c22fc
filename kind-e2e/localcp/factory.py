"""A simulated NVL72 AI factory on KWOK, generated from a small YAML spec.

Each rack is one NVL72 NVLink domain: ``nodesPerRack`` (18) compute trays of ``gpusPerNode``
(4) GPUs. Racks are grouped into blocks (the network level above the rack) and hang off power
domains. Every node carries the labels a real GB300/GB200 NVL72 cluster carries — GPU Feature
Discovery's and NVIDIA Topograph's — and none of m2g's own topology labels:

===========================================  ===============================================
``kubernetes.io/hostname``                   the node name, ``<nodePrefix>-r<rack>-n<node>``
``nvidia.com/gpu.clique``                    ``<clusterUUID>.<cliqueID>`` (one clique per rack)
``nvidia.com/gpu.product``                   ``gpuProduct``
``nvidia.com/gpu.count``                     ``gpusPerNode``
``nvidia.com/gpu.family``, ``.machine``      ``blackwell``, the tray's model
``nvidia.com/gpu.present``                   ``true``
``network.topology.nvidia.com/block``        ``block-<n>`` (Topograph: the leaf switches)
``network.topology.nvidia.com/accelerator``  ``rack-<n>`` (Topograph: the NVLink domain)
``m2g.io/factory``                           the factory's name (localcp's bookkeeping only:
                                             m2g never reads it)
``type: kwok``                               and annotation ``kwok.x-k8s.io/node: fake``
===========================================  ===============================================

No label names a power domain (no real cluster has one): ``racksPerPowerDomain`` only sizes the
PowerDomain CRs a test or the twin creates (they list their racks). Nodes have no taint, so
ordinary pods schedule on them; capacity ``nvidia.com/gpu``. Also generated: a Kueue
``Topology`` (block → rack → clique → hostname, what ``m2g topology generate`` writes for the
default label mapping), a ``ResourceFlavor`` bound to it, and a KAI ``Topology`` with the
same levels.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from localcp import UserError
from localcp.kube import Kube, Obj
from localcp.kwok import NODE_ANNOTATION

BLOCK_LABEL = "network.topology.nvidia.com/block"  # Topograph
RACK_LABEL = "network.topology.nvidia.com/accelerator"  # Topograph: the NVLink domain
FACTORY_LABEL = "m2g.io/factory"
CLIQUE_LABEL = "nvidia.com/gpu.clique"
PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU = "nvidia.com/gpu"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class NodeShape(_Model):
    """Allocatable CPU, memory and pod slots of one compute tray (besides its GPUs)."""

    cpu: str = "144"
    memory: str = "1700Gi"
    pods: str = "110"


class FactorySpec(_Model):
    """The factory spec file (kind-e2e/factories/*.yaml)."""

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    racks: int = Field(ge=1, le=1000)
    nodes_per_rack: int = Field(default=18, ge=1, le=72)
    gpus_per_node: int = Field(default=4, ge=1, le=16)
    racks_per_block: int = Field(default=8, ge=1)
    racks_per_power_domain: int = Field(default=4, ge=1)
    gpu_product: str = "NVIDIA-GB200"
    cluster_uuid: str | None = Field(default=None, alias="clusterUUID")
    node_prefix: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    node: NodeShape = NodeShape()
    flavor: str = Field(default="gb200", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    topology: str = Field(default="nvl72", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

    @model_validator(mode="after")
    def _defaults(self) -> FactorySpec:
        if self.node_prefix is None:  # distinct per factory, so two factories can coexist
            self.node_prefix = self.name
        if self.cluster_uuid is None:
            self.cluster_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.name}.m2g.io"))
        else:
            uuid.UUID(self.cluster_uuid)  # raises ValueError -> ValidationError
        return self

    @property
    def node_count(self) -> int:
        return self.racks * self.nodes_per_rack

    @property
    def gpu_count(self) -> int:
        return self.node_count * self.gpus_per_node


def load_spec(path: Path) -> FactorySpec:
    """Read and validate a factory spec; errors become one readable UserError."""
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise UserError(f"factory spec {path} not found") from exc
    except yaml.YAMLError as exc:
        raise UserError(f"factory spec {path} is not valid YAML: {exc}") from exc
    try:
        return FactorySpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise UserError(f"factory spec {path} is invalid: {problems}") from exc


def node_name(spec: FactorySpec, rack: int, node: int) -> str:
    return f"{spec.node_prefix}-r{rack:03d}-n{node:02d}"


def nodes(spec: FactorySpec) -> list[Obj]:
    """The KWOK Node objects (with status: capacity is kept by KWOK's node-initialize stage)."""
    out: list[Obj] = []
    capacity = {"cpu": spec.node.cpu, "memory": spec.node.memory, "pods": spec.node.pods,
                GPU: str(spec.gpus_per_node)}
    for rack in range(spec.racks):
        for i in range(spec.nodes_per_rack):
            name = node_name(spec, rack, i)
            labels = {
                "type": "kwok",
                HOSTNAME_LABEL: name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                PRODUCT_LABEL: spec.gpu_product,
                "nvidia.com/gpu.count": str(spec.gpus_per_node),
                "nvidia.com/gpu.family": "blackwell",
                "nvidia.com/gpu.machine": spec.gpu_product.replace("NVIDIA-", "") + "-NVL72",
                "nvidia.com/gpu.present": "true",
                CLIQUE_LABEL: f"{spec.cluster_uuid}.{rack}",
                BLOCK_LABEL: f"block-{rack // spec.racks_per_block:02d}",
                RACK_LABEL: f"rack-{rack:03d}",
                FACTORY_LABEL: spec.name,
            }
            out.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels,
                             "annotations": {NODE_ANNOTATION: "fake",
                                             "node.alpha.kubernetes.io/ttl": "0"}},
                "status": {
                    "capacity": dict(capacity), "allocatable": dict(capacity),
                    "nodeInfo": {"kubeletVersion": "fake", "kubeProxyVersion": "fake",
                                 "architecture": "amd64", "operatingSystem": "linux"},
                    "phase": "Running",
                },
            })
    return out


def scheduling_objects(spec: FactorySpec) -> list[Obj]:
    """Kueue Topology + ResourceFlavor, and KAI's Topology, for this factory."""
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology",
         "metadata": {"name": spec.topology},
         "spec": {"levels": [{"nodeLabel": BLOCK_LABEL}, {"nodeLabel": RACK_LABEL},
                             {"nodeLabel": CLIQUE_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
         "metadata": {"name": spec.flavor},
         "spec": {"nodeLabels": {PRODUCT_LABEL: spec.gpu_product},
                  "topologyName": spec.topology}},
        {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
         "metadata": {"name": spec.topology},
         "spec": {"levels": [{"nodeLabel": BLOCK_LABEL}, {"nodeLabel": RACK_LABEL},
                             {"nodeLabel": CLIQUE_LABEL}, {"nodeLabel": HOSTNAME_LABEL}]}},
    ]


def manifests(spec: FactorySpec) -> list[Obj]:
    """Everything the factory consists of (for ``kubectl apply -f``, e.g. on kind)."""
    return scheduling_objects(spec) + nodes(spec)


def ready_nodes(kube: Kube, factory: str) -> int:
    """How many nodes of the named factory are Ready."""
    data = kube.get(f"/api/v1/nodes?labelSelector={FACTORY_LABEL}%3D{factory}") or {}
    count = 0
    for item in data.get("items", []):
        conds = item.get("status", {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
            count += 1
    return count


def apply(kube: Kube, spec: FactorySpec, wait: float = 600.0, log: Any = print) -> float:
    """Create the factory and wait until every node is Ready; returns seconds taken."""
    t0 = time.monotonic()
    for obj in scheduling_objects(spec):
        kube.apply(obj)
    node_objs = nodes(spec)
    kube.apply_many(node_objs, verb=kube.create_with_status)
    log(f"[factory] {spec.name}: {len(node_objs)} nodes created in "
        f"{time.monotonic() - t0:.1f}s; waiting for Ready")
    last = -1

    def all_ready() -> bool:
        nonlocal last
        ready = ready_nodes(kube, spec.name)
        if ready != last and ready != len(node_objs):
            log(f"[factory] {spec.name}: {ready}/{len(node_objs)} nodes Ready")
        last = ready
        return ready == len(node_objs)

    kube.wait_for(f"{len(node_objs)} KWOK nodes of factory {spec.name} to be Ready",
                  all_ready, timeout=wait, interval=2.0)
    return time.monotonic() - t0


def delete(kube: Kube, spec: FactorySpec) -> None:
    """Remove the factory's nodes (the scheduling objects are left in place)."""
    kube.http.delete(f"/api/v1/nodes?labelSelector={FACTORY_LABEL}%3D{spec.name}")
