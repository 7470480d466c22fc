"""What stops a workload besides m2g's policies — Kueue's own blockers and missing power readings
— each with the change that fixes it (``m2g explain``).

Pure: reads the raw Workload, its LocalQueue / ClusterQueue, the flavors, Kueue Topologies and
AdmissionChecks as listed, and the snapshot's power readings. Kueue's reasons (``QuotaReserved``
False with "does not contain the requested level", an Inactive ClusterQueue) name the symptom;
these lines name the object to change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from m2g.model import labels as L
from m2g.model.factory import FactorySnapshot

Obj = Mapping[str, Any]
TAS_LEVEL_KEYS = (L.TAS_REQUIRED, L.TAS_PREFERRED, L.TAS_SLICE_REQUIRED)


@dataclass(frozen=True)
class Blocker:
    """One thing in the way, and the change that removes it."""

    what: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {"what": self.what, "fix": self.fix}


def _spec(o: Obj | None) -> Obj:
    return (o or {}).get("spec") or {}


def _true(o: Obj | None, kind: str) -> bool | None:
    for c in ((o or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return bool(c.get("status") == "True")
    return None


def _gpus(pod_set: Obj) -> int:
    spec = (pod_set.get("template") or {}).get("spec") or {}
    per_pod = 0
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        amount = (res.get("requests") or {}).get(L.GPU_RESOURCE) \
            or (res.get("limits") or {}).get(L.GPU_RESOURCE) or 0
        try:
            per_pod += int(str(amount))
        except ValueError:
            continue
    return per_pod * int(pod_set.get("count", 1) or 1)


def _flavors(cq: Obj) -> list[tuple[str, float | None]]:
    """(flavor, the most nvidia.com/gpu it can give: nominal + borrowing; None = unbounded)."""
    out = []
    cohort = bool(_spec(cq).get("cohortName"))
    for group in _spec(cq).get("resourceGroups") or []:
        for fl in group.get("flavors") or []:
            for r in fl.get("resources") or []:
                if r.get("name") != L.GPU_RESOURCE:
                    continue
                nominal = float(str(r.get("nominalQuota", 0)).rstrip("m") or 0)
                borrow = r.get("borrowingLimit")
                most = None if cohort and borrow is None else nominal + float(borrow or 0)
                out.append((str(fl.get("name", "")), most))
    return out


def topology_blockers(wl: Obj, cq_name: str, cq: Obj, flavors: Mapping[str, Obj],
                      topologies: Mapping[str, Obj]) -> list[Blocker]:
    """A pod set asking for a TAS level that no flavor's Topology of its ClusterQueue has."""
    out = []
    gpu_flavors = [name for name, _ in _flavors(cq)]
    for ps in _spec(wl).get("podSets") or []:
        ann = ((ps.get("template") or {}).get("metadata") or {}).get("annotations") or {}
        level = next((str(ann[k]) for k in TAS_LEVEL_KEYS if ann.get(k)), "")
        if not level or not gpu_flavors:
            continue
        have: dict[str, list[str]] = {}
        for fname in gpu_flavors:
            topo = str(_spec(flavors.get(fname)).get("topologyName") or "")
            have[fname] = [str(x.get("nodeLabel")) for x in
                           _spec(topologies.get(topo)).get("levels") or []] if topo else []
        if any(level in levels for levels in have.values()):
            continue
        fname = gpu_flavors[0]
        topo = str(_spec(flavors.get(fname)).get("topologyName") or "")
        levels = ", ".join(have[fname]) or "none"
        where = f"Topology {topo} (levels {levels})" if topo else "no Topology"
        out.append(Blocker(
            f"pod set {ps.get('name', '?')} asks for topology level {level}, but flavor "
            f"{fname} of ClusterQueue {cq_name} has {where}: Kueue cannot place it (\"does not "
            "contain the requested level\")",
            f"request a level the Topology has (m2g submit ... --set nvlink_level=<one of: "
            f"{levels}>), or add {level} to the Topology (levels are immutable: create a "
            f"Topology with it and point flavor {fname}'s "
            "topologyName at it)"))
    return out


def quota_blockers(wl: Obj, cq_name: str, cq: Obj) -> list[Blocker]:
    want = sum(_gpus(ps) for ps in _spec(wl).get("podSets") or [])
    if want <= 0:
        return []
    limits = _flavors(cq)
    if any(most is None for _, most in limits):
        return []
    most = max((m or 0.0 for _, m in limits), default=0.0)
    if want <= most:
        return []
    what = (f"ClusterQueue {cq_name} has no {L.GPU_RESOURCE} quota" if not limits or most == 0
            else f"it asks for {want} GPUs; ClusterQueue {cq_name} can give at most "
                 f"{most:g} in one flavor (nominalQuota + borrowingLimit)")
    return [Blocker(what, f"raise nominalQuota of {L.GPU_RESOURCE} in ClusterQueue {cq_name} "
                          f"(kueue-config quotas), or submit to a queue with room, or ask for "
                          f"at most {most:g} GPUs")]


def check_blockers(cq_name: str, cq: Obj, checks: Mapping[str, Obj]) -> list[Blocker]:
    out = []
    strategy = (_spec(cq).get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    for entry in strategy:
        name = str(entry.get("name", ""))
        ac = checks.get(name)
        if ac is None:
            out.append(Blocker(f"ClusterQueue {cq_name} names AdmissionCheck {name}, which "
                               "does not exist: the queue admits nothing",
                               f"create AdmissionCheck {name} (kueue-config/base) or remove it "
                               f"from the queue's admissionChecksStrategy"))
        elif _true(ac, "Active") is not True:
            controller = str(_spec(ac).get("controllerName", ""))
            cond: Obj = next((c for c in (ac.get("status") or {}).get("conditions") or []
                         if c.get("type") == "Active"), {})
            why = f" ({cond.get('reason')}: {cond.get('message')})" if cond else ""
            fix = ("start m2g run (it keeps its checks Active), or see its log"
                   if controller == "m2g.io/policy"
                   else f"start the controller {controller or '(none named)'}")
            if cond.get("reason") == "BadParametersRef":
                fix = "fix spec.parameters or the site configuration's admissionChecks.configs"
            out.append(Blocker(f"AdmissionCheck {name} is not Active{why}: ClusterQueue "
                               f"{cq_name} admits nothing", fix))
    return out


def kueue_blockers(wl: Obj, local_queues: Mapping[str, Obj], cluster_queues: Mapping[str, Obj],
                   flavors: Mapping[str, Obj], checks: Mapping[str, Obj],
                   topologies: Mapping[str, Obj], unreadable: frozenset[str] = frozenset()
                   ) -> list[Blocker]:
    """Kueue's reasons a workload is not admitted, each with its fix (none once admitted).
    ``unreadable``: the ClusterObjects fields (and ``topologies``) the reader may not list — an
    object missing from those is not known to be absent, so it names no blocker."""
    if _true(wl, "Admitted"):
        return []
    meta = wl.get("metadata") or {}
    ns = str(meta.get("namespace", ""))
    queue = str(_spec(wl).get("queueName") or (meta.get("labels") or {}).get(L.QUEUE_NAME, ""))
    if not queue:
        return [Blocker("it names no LocalQueue, so Kueue does not manage it",
                        f"label the job {L.QUEUE_NAME}=<a LocalQueue of {ns}>")]
    lq = local_queues.get(f"{ns}/{queue}")
    if lq is None and "local_queues" in unreadable:
        return []
    if lq is None:
        return [Blocker(f"LocalQueue {ns}/{queue} does not exist",
                        "create it (kueue-config/base/tenants.yaml) or use another queue")]
    cq_name = str(_spec(lq).get("clusterQueue", ""))
    cq = cluster_queues.get(cq_name)
    if cq is None and "cluster_queues" in unreadable:
        return []
    if cq is None:
        return [Blocker(f"LocalQueue {ns}/{queue} points at ClusterQueue {cq_name}, which does "
                        "not exist", f"create ClusterQueue {cq_name} or repoint the queue")]
    topo = [] if {"resource_flavors", "topologies"} & unreadable else \
        topology_blockers(wl, cq_name, cq, flavors, topologies)
    gates = [] if "admission_checks" in unreadable else check_blockers(cq_name, cq, checks)
    return topo + quota_blockers(wl, cq_name, cq) + gates


def power_blockers(factory: FactorySnapshot, decisive: Sequence[str]) -> list[Blocker]:
    """Missing or stale power readings: m2g then counts no headroom (fail-safe), so a power
    policy's "short by N kW" is not a measured shortfall. ``decisive``: the deciding reasons'
    messages (the blocker is named only when power may be what holds the workload)."""
    stale = [r.name for r in factory.racks if r.power_kw.stale]
    if not stale or not factory.racks:
        return []
    missing = all(r.power_kw.missing for r in factory.racks if r.name in stale)
    state = "missing" if missing else "stale"
    named = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
    held = any("kW" in m or "power" in m.lower() for m in decisive)
    return [Blocker(
        f"power readings are {state} for {len(stale)} of {len(factory.racks)} racks ({named}): "
        "m2g counts no power headroom for new work (fail-safe)"
        + (", so the kW shortfall above is not measured" if held else ""),
        "give m2g its telemetry: --prometheus URL or $M2G_CONFIG (the site configuration); "
        "`m2g signals` shows which signal is missing")]
