"""Well-known label, annotation and resource names that m2g reads and writes.

One place for them, so the factory simulator, the controllers, the policies and the templates
agree. Upstream names are cited in docs (GFD, Kueue, KAI); ``m2g.io/*`` names are our own.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GPU_RESOURCE: Final = "nvidia.com/gpu"

# Node labels a real GB300 cluster carries (GPU Feature Discovery, NVIDIA Topograph)
GPU_CLIQUE: Final = "nvidia.com/gpu.clique"  # "<ClusterUUID>.<CliqueID>", set by GFD on NVL72
GPU_PRODUCT: Final = "nvidia.com/gpu.product"
GPU_COUNT: Final = "nvidia.com/gpu.count"
HOSTNAME: Final = "kubernetes.io/hostname"
#: Topograph's NVLink-domain label (docs.nvidia.com Topograph, "Topograph in Kubernetes"): one
#: value per NVL72 rack's NVLink domain.
TOPOGRAPH_ACCELERATOR: Final = "network.topology.nvidia.com/accelerator"
#: Topograph's block label: the leaf switches directly connected to the compute nodes.
TOPOGRAPH_BLOCK: Final = "network.topology.nvidia.com/block"
TOPOGRAPH_SPINE: Final = "network.topology.nvidia.com/spine"
#: The default mapping's rack and block labels (``TopologyLabels``); read nodes through the
#: site's mapping, never through these names.
RACK: Final = TOPOGRAPH_ACCELERATOR
BLOCK: Final = TOPOGRAPH_BLOCK

#: The KAI Queue annotation that names a PowerDomain (m2g's own; on Queues, never on nodes).
POWER_DOMAIN: Final = "m2g.io/power-domain"


#: A Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of
#: alphanumerics, "-", "_" and "." that begins and ends alphanumeric.
LABEL_KEY: Final = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_KEY_OR_NONE: Final = "^(?:" + LABEL_KEY[1:-1] + ")?$"


class TopologyLabels(BaseModel):
    """Which node labels mean clique, rack, block and power domain at this site (the site
    configuration's ``topology.labels``). The defaults are what a GB300 NVL72 cluster carries:
    GFD's clique; Topograph's NVLink-domain label for the rack (a node without it takes its
    clique as its rack: a full-rack NVL72 is one clique) and its block label. No label is
    standard for power domains: "" means none (PowerDomain CRs name their racks or select them
    with ``rackSelector``). "" for block: no block level."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel,
                              populate_by_name=True)

    # a Kubernetes label key ("" where allowed): a typo such as "rack " or a bidi override
    # matched no node, and every node silently took its clique as its rack
    clique: str = Field(default=GPU_CLIQUE, min_length=1, max_length=317, pattern=LABEL_KEY)
    rack: str = Field(default=TOPOGRAPH_ACCELERATOR, max_length=317, pattern=LABEL_KEY_OR_NONE)
    block: str = Field(default=TOPOGRAPH_BLOCK, max_length=317, pattern=LABEL_KEY_OR_NONE)
    power_domain: str = Field(default="", max_length=317, pattern=LABEL_KEY_OR_NONE)

    def levels(self) -> tuple[str, ...]:
        """The topology levels coarse to fine, hostname last, each label once (the Kueue and
        KAI Topology of this site): block, rack, clique, hostname, without the empty ones."""
        out: list[str] = []
        for key in (self.block, self.rack, self.clique, HOSTNAME):
            if key and key not in out:
                out.append(key)
        return tuple(out)


#: The mapping used when a site says nothing.
DEFAULT_TOPOLOGY_LABELS: Final = TopologyLabels()
#: m2g's own labels of old (``m2g.io/rack`` etc.): an explicit mapping for clusters labelled so.
LEGACY_TOPOLOGY_LABELS: Final = TopologyLabels(rack="m2g.io/rack", block="m2g.io/block",
                                               power_domain="m2g.io/power-domain")

# Node taints m2g sets itself (NoSchedule) and removes when their condition ends
M2G_TAINT_PREFIX: Final = "m2g.io/"
TAINT_MAINTENANCE: Final = "m2g.io/maintenance"  # value: the MaintenanceWindow's name
TAINT_THERMAL: Final = "m2g.io/thermal"  # value: the rack in thermal alarm

# Workload labels and annotations read by m2g
WORKLOAD_KIND: Final = "m2g.io/workload-kind"
FLEX_TIER: Final = "m2g.io/flex-tier"
# ClusterQueue annotation (the platform's, never the tenant's): the least flexible tier a workload
# of this queue may claim; a lower declared m2g.io/flex-tier is raised to it
MIN_FLEX_TIER: Final = "m2g.io/min-flex-tier"
EXPECTED_RUNTIME: Final = "m2g.io/expected-runtime-seconds"
ESTIMATED_KW: Final = "m2g.io/estimated-kw"
CHECKPOINT_INTERVAL: Final = "m2g.io/checkpoint-interval-seconds"
LAST_CHECKPOINT: Final = "m2g.io/last-checkpoint-time"  # RFC 3339, written by the job
TEMPLATE: Final = "m2g.io/template"  # label: the WorkloadTemplate a workload was rendered from
TEMPLATE_VALUES: Final = "m2g.io/template-values"  # annotation: its resolved parameters (JSON)
#: annotation: throughput at per-GPU power caps, "cap:throughput,..." (the template's capCurve)
POWER_CURVE: Final = "m2g.io/power-curve"
#: pod-template annotation of an elastic batch/v1 Job: the fewest replicas (``parallelism``) it
#: may be shrunk to under a grid event (docs/curtailment.md, right-sizing)
MIN_PARALLELISM: Final = "m2g.io/min-parallelism"

# Kueue
QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
#: Kueue copies it from an elastic Job onto its Workload (ElasticJobsViaWorkloadSlices)
ELASTIC_JOB: Final = "kueue.x-k8s.io/elastic-job"
PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
TAS_REQUIRED: Final = "kueue.x-k8s.io/podset-required-topology"
TAS_PREFERRED: Final = "kueue.x-k8s.io/podset-preferred-topology"
TAS_UNCONSTRAINED: Final = "kueue.x-k8s.io/podset-unconstrained-topology"
TAS_SLICE_REQUIRED: Final = "kueue.x-k8s.io/podset-slice-required-topology"
TAS_SLICE_SIZE: Final = "kueue.x-k8s.io/podset-slice-size"
TAS_PODSET_GROUP: Final = "kueue.x-k8s.io/podset-group-name"

# KAI Scheduler
KAI_QUEUE: Final = "kai.scheduler/queue"
KAI_TOPOLOGY: Final = "kai.scheduler/topology"
KAI_REQUIRED_PLACEMENT: Final = "kai.scheduler/topology-required-placement"
KAI_PREFERRED_PLACEMENT: Final = "kai.scheduler/topology-preferred-placement"
KAI_SEGMENT_SIZE: Final = "kai.scheduler/segment-size"
KAI_SEGMENT_REQUIRED: Final = "kai.scheduler/segment-topology-required-placement"

# The factory simulator (KWOK): how long a pod "runs" before it succeeds
SIM_DURATION: Final = "m2g.io/sim-duration"
