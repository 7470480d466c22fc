"""Well-known label, annotation and resource names that m2g reads and writes.

One place for them, so the factory simulator, the controllers, the policies and the templates
agree. Upstream names are cited in docs (GFD, Kueue, KAI); ``m2g.io/*`` names are our own.
"""

from __future__ import annotations

from typing import Final

GPU_RESOURCE: Final = "nvidia.com/gpu"

# Node labels (GPU Feature Discovery and the factory's own topology)
GPU_CLIQUE: Final = "nvidia.com/gpu.clique"  # "<ClusterUUID>.<CliqueID>", set by GFD on NVL72
GPU_PRODUCT: Final = "nvidia.com/gpu.product"
HOSTNAME: Final = "kubernetes.io/hostname"
BLOCK: Final = "m2g.io/block"
RACK: Final = "m2g.io/rack"
POWER_DOMAIN: Final = "m2g.io/power-domain"

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

# Kueue
QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
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
