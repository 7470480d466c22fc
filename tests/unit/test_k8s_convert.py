"""m2g.k8s.convert on objects recorded from the local control plane (tests/unit/fixtures/k8s,
Kueue v0.19.2 + KWOK) and on hand-made edge cases."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from m2g.k8s import annotations as ka
from m2g.k8s import build as kb
from m2g.k8s import convert as cv
from m2g.k8s import parse as kp
from m2g.model import labels as L
from m2g.model.cluster import CheckState, Phase
from m2g.model.factory import GridPayload, HealthReason
from m2g.model.inputs import WorkloadKind
from m2g.signals.readings import (
    DomainReadings,
    Freshness,
    NodeReadings,
    RackReadings,
    Readings,
    SignalReading,
)

FIXTURES = Path(__file__).parent / "fixtures" / "k8s"
NOW = datetime(2026, 11, 29, 22, 52, 18, tzinfo=UTC)  # 10 min after the recording


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def kwok_node(name: str, rack: str = "rack-000", **status: Any) -> dict[str, Any]:
    node = load("node_kwok")
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["network.topology.nvidia.com/accelerator"] = rack
    node["status"].update(status)
    return node


# ---- nodes -------------------------------------------------------------------------------


def test_recorded_kwok_node_is_healthy_with_four_gpus() -> None:
    n = cv.node(load("node_kwok"), allocated=4)
    assert (n.name, n.rack, n.block, n.power_domain) == \
        ("small-r000-n00", "rack-000", "block-00", "")  # no standard power-domain label
    assert n.clique.endswith(".0")
    assert (n.gpus, n.gpus_allocated, n.unhealthy_gpus, n.reasons) == (4, 4, 0, ())
    assert n.free_gpus == 0


def test_node_topology_follows_the_label_mapping() -> None:
    obj = load("node_kwok")
    obj["metadata"]["labels"]["example.com/pdu-row"] = "row-7"
    site = L.TopologyLabels(rack="", block="", power_domain="example.com/pdu-row")
    n = cv.node(obj, mapping=site)
    # no rack label mapped: the rack is the NVLink clique; no block level
    assert (n.rack, n.block, n.power_domain) == (n.clique, "", "row-7")
    gfd_only = load("node_kwok")
    for key in (L.TOPOGRAPH_ACCELERATOR, L.TOPOGRAPH_BLOCK):
        del gfd_only["metadata"]["labels"][key]
    g = cv.node(gfd_only)  # a GFD-only cluster (no Topograph): racks are cliques
    assert g.rack == g.clique and g.rack.endswith(".0") and g.block == ""
    legacy = load("node_kwok")
    legacy["metadata"]["labels"].update({"m2g.io/rack": "r9", "m2g.io/power-domain": "pd-1"})
    n = cv.node(legacy, mapping=L.LEGACY_TOPOLOGY_LABELS)
    assert (n.rack, n.power_domain) == ("r9", "pd-1")
    bare = {"metadata": {"name": "x", "labels": {"example.com/rack": "r1"}}, "status": {}}
    assert not cv.is_gpu_node(bare)
    assert cv.is_gpu_node(bare, L.TopologyLabels(rack="example.com/rack"))


def test_node_health_reasons() -> None:
    node = load("node_kwok")
    node["spec"] = {"unschedulable": True, "taints": [
        {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu-error", "effect": "NoExecute"},
        {"key": "soft", "effect": "PreferNoSchedule"}]}
    for cond in node["status"]["conditions"]:
        if cond["type"] == "Ready":
            cond["status"] = "False"
    node["status"]["conditions"] += [
        {"type": "GpuXidError", "status": "True"}, {"type": "NVLinkDown", "status": "True"},
        {"type": "InfiniBandDown", "status": "False"}, {"type": "KernelDeadlock", "status": "True"},
        {"type": "SomethingPositive", "status": "True"}]
    assert cv.node(node).reasons == (HealthReason.NOT_READY, HealthReason.CORDONED,
                                     HealthReason.TAINTED, HealthReason.GPU_XID,
                                     HealthReason.NVLINK, HealthReason.CONDITION)


def test_node_without_ready_condition_is_not_ready_and_withheld_gpus_are_unhealthy() -> None:
    node = kwok_node("n1", conditions=[])
    node["status"]["allocatable"]["nvidia.com/gpu"] = "3"
    n = cv.node(node, xid_gpus=0)
    assert n.reasons == (HealthReason.NOT_READY,)
    assert (n.gpus, n.unhealthy_gpus) == (4, 1)
    assert cv.node(node, xid_gpus=2).unhealthy_gpus == 2


def test_allocated_gpus_count_only_bound_running_pods() -> None:
    pod = load("pod_running")
    done = copy.deepcopy(pod)
    done["status"]["phase"] = "Succeeded"
    unbound = copy.deepcopy(pod)
    unbound["spec"].pop("nodeName")
    assert cv.allocated_gpus([pod, done, unbound]) == {"small-r000-n00": 4}
    limits_only = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                   "initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]}
    assert cv.container_gpus(limits_only) == 8


# ---- Kueue -------------------------------------------------------------------------------


def test_recorded_workload() -> None:
    wl = cv.workload(load("workload_admitted"), NOW)
    v = wl.view
    assert (wl.namespace, v.queue, wl.cluster_queue) == ("rec", "default", "rec-cq")
    assert wl.phase is Phase.ADMITTED
    assert wl.admitted_at == datetime(2026, 11, 29, 22, 42, 18, tzinfo=UTC)
    # pod template metadata (the Job's labels are not copied by Kueue)
    assert v.flex_tier == 2 and v.estimated_kw == 14.5
    assert v.gpus == 8 and v.pod_sets[0].count == 2 and v.pod_sets[0].gpus_per_pod == 4
    assert v.wait_seconds == 0  # admitted
    assert wl.check == "" and wl.check_state is None and not wl.shed_by_m2g


def pending_workload(**labels: str) -> dict[str, Any]:
    wl = load("workload_admitted")
    wl["status"] = {"conditions": [{"type": "QuotaReserved", "status": "False"}]}
    wl["metadata"]["labels"].update(labels)
    return wl


def test_workload_metadata_wins_over_pod_template_and_bad_values_are_normalised() -> None:
    wl = pending_workload(**{"m2g.io/flex-tier": "7", "m2g.io/workload-kind": "weird"})
    wl["metadata"]["annotations"] = {"m2g.io/estimated-kw": "-3",
                                     "m2g.io/expected-runtime-seconds": "abc",
                                     "m2g.io/last-checkpoint-time": "2026-11-29T22:50:18Z",
                                     "m2g.io/checkpoint-interval-seconds": "600"}
    v = cv.workload(wl, NOW, local_queues={"rec/default": "cq-from-lq"}).view_at(NOW)
    assert v.flex_tier == 3 and v.kind is WorkloadKind.UNSPECIFIED
    assert v.estimated_kw == 0.0 and v.expected_runtime_seconds == 0
    # not running: an eviction loses nothing, whatever the report says
    assert v.checkpoint.interval_seconds == 600 and v.checkpoint.last_age_seconds == 0
    assert v.cluster_queue == "cq-from-lq"
    assert v.wait_seconds == 600
    bad = pending_workload(**{"m2g.io/flex-tier": "two", "m2g.io/workload-kind": "inference"})
    v2 = cv.workload(bad, NOW).view
    assert v2.flex_tier == 0 and v2.kind is WorkloadKind.INFERENCE


@pytest.mark.parametrize(("conds", "active", "phase"), [
    ([], True, Phase.PENDING),
    ([("QuotaReserved", "True")], True, Phase.RESERVED),
    ([("QuotaReserved", "True"), ("Admitted", "True")], True, Phase.ADMITTED),
    ([("QuotaReserved", "True"), ("Admitted", "True")], False, Phase.INACTIVE),
    ([("Finished", "True")], False, Phase.FINISHED),
])
def test_workload_phase(conds: list[tuple[str, str]], active: bool, phase: Phase) -> None:
    wl = {"spec": {"active": active},
          "status": {"conditions": [{"type": t, "status": s} for t, s in conds]}}
    assert cv.workload_phase(wl) is phase


def test_holds_quota_follows_quota_reserved() -> None:
    wl = load("workload_admitted")
    wl["spec"]["active"] = False
    assert cv.workload(wl, NOW).holds_quota  # deactivated, Kueue still evicting it
    wl["status"]["conditions"] = [c for c in wl["status"]["conditions"]
                                  if c["type"] not in ("QuotaReserved", "Admitted")]
    assert not cv.workload(wl, NOW).holds_quota


@pytest.mark.parametrize(("status", "message", "uid"), [
    ("True", "Preempted to accommodate a workload (UID: 4f1c-9a, JobUID: j-1) due to "
             "prioritization in the ClusterQueue; preemptor path: /r", "4f1c-9a"),
    ("True", "Preempted to accommodate a workload (UID: ab12) in the ClusterQueue", "ab12"),
    ("True", "Preempted to accommodate a workload (UID: UNKNOWN, JobUID: UNKNOWN)", ""),
    ("False", "Preempted to accommodate a workload (UID: 4f1c-9a, JobUID: j-1)", ""),
    ("True", "something else (UID: x y)", ""),
    ("True", 7, ""),
])
def test_the_preemptor_is_read_off_a_true_preempted_condition(
        status: str, message: Any, uid: str) -> None:
    wl = load("workload_admitted")
    wl["status"]["conditions"].append({"type": "Preempted", "status": status,
                                       "reason": "InClusterQueue", "message": message})
    assert cv.workload(wl, NOW).preempted_by == uid


def test_uid_and_quota_reservation_time() -> None:
    wl = load("workload_admitted")
    wl["metadata"]["uid"] = "u-1"
    reserved = next(c for c in wl["status"]["conditions"] if c["type"] == "QuotaReserved")
    st = cv.workload(wl, NOW)
    assert st.uid == "u-1" and st.reserved_at == cv.parse_time(reserved["lastTransitionTime"])
    assert st.released_at is None
    reserved["status"] = "False"
    st = cv.workload(wl, NOW)
    assert st.reserved_at is None
    assert st.released_at == cv.parse_time(reserved["lastTransitionTime"])
    reserved["lastTransitionTime"] = "2999-01-01T00:00:00Z"  # never after the snapshot's now
    assert cv.workload(wl, NOW).released_at == NOW
    reserved["lastTransitionTime"] = 17  # garbage: no time
    assert cv.workload(wl, NOW).released_at is None


def test_m2g_check_and_shed_annotations() -> None:
    wl = load("workload_admitted")
    wl["status"]["admissionChecks"] = [
        {"name": "other", "state": "Ready", "message": ""},
        {"name": "m2g", "state": "Retry", "message": "grid event", "lastTransitionTime": "x"}]
    wl["metadata"]["annotations"] = {"m2g.io/shed-at": "2026-11-29T22:45:00Z"}
    checks = cv.check_names([{"metadata": {"name": "m2g"},
                               "spec": {"controllerName": "m2g.io/policy"}},
                              {"metadata": {"name": "other"}, "spec": {"controllerName": "x"}}])
    assert checks == frozenset({"m2g"})
    st = cv.workload(wl, NOW, checks=checks)
    assert (st.check, st.check_state, st.check_message) == ("m2g", CheckState.RETRY, "grid event")
    assert st.shed_by_m2g and st.shed_at == datetime(2026, 11, 29, 22, 45, tzinfo=UTC)


def test_recorded_cluster_queue_and_base_annotation() -> None:
    cq = load("clusterqueue")
    q = cv.cluster_queue(cq)
    assert q.name == "rec-cq" and q.stop_policy == "None" and q.used_gpus == 8
    assert [(f.flavor, f.resource, f.nominal, f.base) for f in q.quotas] == \
        [("gb200", "nvidia.com/gpu", 8, 8)]
    assert q.weight is None and q.cohort == ""
    cq["metadata"]["annotations"] = {"m2g.io/base-quota.gb200": "16",
                                     "m2g.io/quota-changed-at": "2026-11-29T22:40:00Z"}
    cq["spec"]["fairSharing"] = {"weight": "500m"}
    q = cv.cluster_queue(cq)
    assert q.quotas[0].base == 16 and q.weight == 0.5
    assert q.last_quota_change == datetime(2026, 11, 29, 22, 40, tzinfo=UTC)


def test_quota_base_adopts_a_quota_someone_else_changed() -> None:
    base, made = "m2g.io/base-quota.f", "m2g.io/quota-set.f"
    assert ka.quota_base({}, "f", 40) == 40  # nothing recorded: the live quota is the base
    assert ka.quota_base({base: "72", made: "40"}, "f", 40) == 72  # still m2g's own value
    assert ka.quota_base({base: "72", made: "40"}, "f", 96) == 96  # changed since: new base
    assert ka.quota_base({base: "72"}, "f", 40) == 72  # recorded by an older m2g: kept


def test_resource_flavor_domain() -> None:
    rf = load("resourceflavor")
    assert cv.resource_flavor(rf).domain == ""  # only a GPU product label: the site
    rf["spec"]["nodeLabels"] = {L.TOPOGRAPH_BLOCK: "block-00", "example.com/pd": "pd-00"}
    assert cv.resource_flavor(rf).domain == "block-00"  # no power-domain label by default
    site = L.TopologyLabels(power_domain="example.com/pd")
    assert cv.resource_flavor(rf, site).domain == "pd-00"
    rf["spec"]["nodeLabels"][L.TOPOGRAPH_ACCELERATOR] = "rack-001"
    assert cv.resource_flavor(rf, site).domain == "rack-001"


# ---- m2g CRs -----------------------------------------------------------------------------


def test_grid_event_intervals_and_payloads() -> None:
    ev = {"metadata": {"name": "dr-1"}, "spec": {
        "programName": "utility-dr", "eventID": "ev-42", "targetReductionPercent": 20,
        "intervals": [
            {"start": "2026-11-29T23:00:00Z", "duration": "PT1H",
             "payload": {"type": "IMPORT_CAPACITY_LIMIT", "value": 1500}},
            {"start": "2026-11-30T00:00:00Z", "duration": "PT30M",
             "payload": {"type": "SIMPLE", "value": 9}},
            {"start": "garbage", "duration": "PT1H", "payload": {"type": "SIMPLE", "value": 1}}]},
        "status": {"observedBaselineKw": 2000}}
    a, b = cv.grid_events(ev)
    assert (a.id, a.program, a.payload, a.target_kw) == \
        ("ev-42/0", "utility-dr", GridPayload.IMPORT_CAPACITY_LIMIT, 1500)
    assert a.end - a.start == timedelta(hours=1)
    assert (b.payload, b.level, b.target_kw) == (GridPayload.SIMPLE, 3, 0.0)
    assert b.reduction_pct == 20 and b.baseline_kw == 2000 and b.target() == 1600


def test_iso_durations() -> None:
    assert kp.parse_duration("P1DT2H30M") == timedelta(days=1, hours=2, minutes=30)
    assert kp.parse_duration("PT90S") == timedelta(seconds=90)
    assert kp.parse_duration("P99999999999W") is None  # beyond timedelta: None, not a raise
    assert kp.parse_duration("P") is None and kp.parse_duration("1h") is None


def test_maintenance_window() -> None:
    mw: dict[str, Any] = {"metadata": {"name": "mw"}, "spec": {
        "start": "2026-11-30T01:00:00Z", "end": "2026-11-30T03:00:00Z",
        "scope": {"racks": ["rack-000"], "blocks": ["block-01"]}, "reason": "PDU swap"}}
    w = cv.maintenance_window(mw)
    assert w is not None and w.racks == ("rack-000",) and w.blocks == ("block-01",)
    mw["spec"]["end"] = mw["spec"]["start"]
    assert cv.maintenance_window(mw) is None


def test_quantities() -> None:
    assert kp.quantity("4") == 4 and kp.quantity("500m") == 0.5 and kp.quantity("2Ki") == 2048
    assert kp.quantity("nonsense") == 0 and kp.quantity(True) == 0
    assert kp.quantity(float("nan")) == 0


@pytest.mark.parametrize(("text", "value"), [
    ("500n", 5e-7), ("250u", 2.5e-4), ("1P", 1e15), ("1E", 1e18), ("1Pi", 2.0**50),
    ("1Ei", 2.0**60), ("1E3", 1000.0), ("2e-3", 0.002), ("1.5Gi", 1.5 * 2**30), (".5", 0.5),
    ("-1", -1.0), ("+4k", 4000.0)])
def test_every_kubernetes_quantity_suffix(text: str, value: float) -> None:
    """resource.Quantity's suffixes: ``500n``, ``1Pi`` and ``1E`` used to read as 0."""
    assert kp.quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["1Q", "1.2.3", "1e400", "Ki", "1 Gi", "1ki",
                                  # decimal.Overflow out of a parser documented as never raising;
                                  # 400 digits read as inf through the all-digits fast path
                                  "1e9999999", "1e9999999Ki", "9" * 400, "1" + "0" * 400 + "Gi",
                                  "\u0665\u0660"])  # Arabic-Indic digits: not a quantity
def test_unreadable_quantities_are_zero(text: str) -> None:
    assert kp.quantity(text) == 0


def test_int_quantities_are_bounded() -> None:
    """"1e308" GPUs became a 309-digit int whose product with a float raised OverflowError out
    of the planner, every reconcile (issue 11's probe rerun)."""
    assert kp.int_of("1e308") == kp.MAX_INT and kp.int_of("-1e308") == -kp.MAX_INT
    assert kp.int_of("99999999999999999999Gi") == kp.MAX_INT
    assert kp.int_of("4") == 4 and kp.nonneg_int("-1e308") == 0


# ---- the snapshot ------------------------------------------------------------------------


def fresh(value: float) -> SignalReading:
    return SignalReading(value, 5.0, 120.0, Freshness.FRESH, value)


def test_build_snapshot() -> None:
    nodes = {f"n{i}": kwok_node(f"n{i}", rack="rack-000" if i < 2 else "rack-001")
             for i in range(3)}
    nodes["cpu"] = {"metadata": {"name": "cpu", "labels": {}},
                    "status": {"allocatable": {"cpu": "8"}}}
    pod = load("pod_running")
    pod["spec"]["nodeName"] = "n0"
    domains = {
        "site": {"metadata": {"name": "dc1"}, "spec": {"level": "Site", "budgetKw": 900,
                                                       "inletLimitC": 30}},
        # no node label names power domains on a real cluster: the CR lists its racks
        "pd-00": {"metadata": {"name": "pd-00"}, "spec": {"budgetKw": 300, "rackCapKw": 120,
                                                          "racks": ["rack-000"]}},
    }
    readings = Readings(
        now=0.0,
        nodes={"n1": NodeReadings("n1", fresh(0), fresh(0), fresh(79),
                                  xid_gpus=("0", "1", "2"))},
        racks={"rack-000": RackReadings("rack-000", fresh(100.0), fresh(27.0), fresh(30.0))},
        domains={"pd-00": DomainReadings("pd-00", fresh(250.0))}, status={})
    objs = kb.ClusterObjects(
        nodes=nodes, pods={"rec/p": pod}, power_domains=domains,
        workloads={"rec/w": load("workload_admitted")},
        cluster_queues={"rec-cq": load("clusterqueue")},
        resource_flavors={"gb200": load("resourceflavor")},
        local_queues={"rec/default": load("localqueue")})
    snap = kb.build_snapshot(objs, readings, NOW)
    f = snap.factory
    assert snap.now == NOW and f.site == "dc1" and f.site_budget_kw == 900
    assert f.site_limit_c == 30
    assert [n.name for n in f.nodes] == ["n0", "n1", "n2"]  # the CPU node is left out
    assert f.nodes[0].gpus_allocated == 4 and f.nodes[1].unhealthy_gpus == 3
    r0, r1 = f.racks
    assert (r0.name, r0.block, r0.power_domain, r0.cap_kw) == \
        ("rack-000", "block-00", "pd-00", 120)
    assert r0.power_kw.value == 100.0 and not r0.power_kw.stale and r0.limit_c == 32.0
    assert r1.power_kw.stale and r1.inlet_c.stale  # no reading: missing, never a number
    assert [(p.name, p.budget_kw, p.draw_kw.value) for p in f.power_domains] == \
        [("pd-00", 300, 250.0)]
    assert [w.key for w in snap.workloads] == ["rec/job-rec-a255b"]
    assert snap.queues[0].name == "rec-cq" and snap.flavors[0].name == "gb200"


def test_build_snapshot_without_readings_or_objects() -> None:
    snap = kb.build_snapshot(kb.ClusterObjects(), None, NOW)
    assert snap.factory.site == "site" and snap.factory.site_budget_kw == 0
    assert snap.workloads == () and snap.factory.racks == ()


@pytest.mark.parametrize("module", [cv, kb, kp, ka], ids=lambda m: m.__name__)
def test_convert_stays_pure(module: ModuleType) -> None:
    """No I/O modules in m2g.k8s.convert, build, parse, annotations (import-linter's contract
    covers them too)."""
    import ast

    tree = ast.parse(Path(str(module.__file__)).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not imported & {"kr8s", "kubernetes", "httpx", "asyncio", "typer", "rich"}
    assert "m2g.k8s.client" not in Path(str(module.__file__)).read_text()


def test_node_memo_reuses_unchanged_nodes_only() -> None:
    nodes = {f"n{i}": kwok_node(f"n{i}") for i in range(2)}
    for i, n in enumerate(nodes.values()):
        n["metadata"]["resourceVersion"] = str(10 + i)
    pod = load("pod_running")
    pod["spec"]["nodeName"] = "n0"
    memo = kb.SnapshotMemo()
    first = kb.build_snapshot(kb.ClusterObjects(nodes=nodes, pods={"p": pod}), None, NOW,
                              memo=memo)
    assert set(memo.nodes) == {"n0", "n1"}
    again = kb.build_snapshot(kb.ClusterObjects(nodes=nodes, pods={"p": pod}), None, NOW,
                              memo=memo)
    assert again == first and all(a is b for a, b in zip(again.factory.nodes,
                                                         first.factory.nodes, strict=True))
    # a new resourceVersion or other allocated GPUs convert the node again
    cordoned = copy.deepcopy(nodes)
    cordoned["n1"]["spec"] = {"unschedulable": True}
    cordoned["n1"]["metadata"]["resourceVersion"] = "12"
    snap = kb.build_snapshot(kb.ClusterObjects(nodes=cordoned), None, NOW, memo=memo)
    by_name = {n.name: n for n in snap.factory.nodes}
    assert by_name["n0"].gpus_allocated == 0 and by_name["n1"].reasons == ("Cordoned",)
    assert snap == kb.build_snapshot(kb.ClusterObjects(nodes=cordoned), None, NOW)


def test_workload_memo_keeps_states_and_moves_what_depends_on_now() -> None:
    admitted = load("workload_admitted")
    admitted["metadata"]["resourceVersion"] = "7"
    pending = pending_workload()
    pending["metadata"]["resourceVersion"] = "8"
    objs = kb.ClusterObjects(workloads={"a/admitted": admitted, "a/pending": pending})
    memo = kb.SnapshotMemo()
    first = kb.build_snapshot(objs, None, NOW, memo=memo)
    assert set(memo.workloads) == {"a/admitted", "a/pending"}
    cached = memo.workloads["a/admitted"][3]
    later = NOW + timedelta(minutes=5)
    again = kb.build_snapshot(objs, None, later, memo=memo)
    assert again == kb.build_snapshot(objs, None, later)
    assert cached is first.workloads[0]  # the memo keeps it as the snapshot has it
    # not converted again, nor copied: the time fields are derived at use ...
    assert again.workloads[0] is first.workloads[0] and again.workloads[1] is first.workloads[1]
    assert memo.workloads["a/admitted"][3] is again.workloads[0]
    # ... and they move: the running one's checkpoint age, the pending one's wait
    assert again.workloads[0].checkpoint_at(later).last_age_seconds == \
        first.workloads[0].checkpoint_at(NOW).last_age_seconds + 300
    assert again.workloads[0].view_at(later).checkpoint.last_age_seconds == \
        first.workloads[0].view_at(NOW).checkpoint.last_age_seconds + 300
    assert again.workloads[1].wait_seconds(later) == first.workloads[1].wait_seconds(NOW) + 300
    assert again.workloads[1].view_at(later).wait_seconds == \
        first.workloads[1].view_at(NOW).wait_seconds + 300


def admitted_at(**annotations: str) -> dict[str, Any]:
    """The recorded workload (admitted 22:42:18, 600 s before NOW), annotated."""
    wl = load("workload_admitted")
    wl["metadata"].setdefault("annotations", {}).update(annotations)
    return wl


def test_checkpoint_age_is_the_time_since_the_report_or_since_the_start() -> None:
    ckpt = "m2g.io/last-checkpoint-time"
    v = cv.workload(admitted_at(**{ckpt: "2026-11-29T22:50:18Z"}), NOW).checkpoint_at(NOW)
    assert (v.last_age_seconds, v.reported) == (120, True)
    # no report: it has run 600 s, all of which an eviction throws away (not "just saved")
    v = cv.workload(admitted_at(), NOW).checkpoint_at(NOW)
    assert (v.last_age_seconds, v.reported) == (600, False)
    # a report from before this run started (an earlier run's): the start counts
    v = cv.workload(admitted_at(**{ckpt: "2026-11-29T20:00:00Z"}), NOW).checkpoint_at(NOW)
    assert (v.last_age_seconds, v.reported) == (600, False)
    v = cv.workload(admitted_at(**{ckpt: "not a time"}), NOW).checkpoint_at(NOW)
    assert (v.last_age_seconds, v.reported) == (600, False)


def test_a_pod_reports_the_checkpoint_of_its_workload() -> None:
    wl = admitted_at(**{"m2g.io/last-checkpoint-time": "2026-11-29T22:45:18Z"})
    pod = load("pod_running")
    job_uid = wl["metadata"]["ownerReferences"][0]["uid"]
    pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "rec", "uid": job_uid}]
    pod["metadata"]["annotations"] = {"m2g.io/last-checkpoint-time": "2026-11-29T22:51:18Z"}
    other = load("pod_running")
    other["metadata"].update(name="other", uid="u-other", ownerReferences=[
        {"kind": "Job", "name": "x", "uid": "someone-else"}], annotations={
        "m2g.io/last-checkpoint-time": "2026-11-29T22:52:00Z"})
    objs = kb.ClusterObjects(workloads={"rec/w": wl}, pods={"rec/p": pod, "rec/o": other})
    ckpt = kb.build_snapshot(objs, None, NOW).workloads[0].checkpoint_at(NOW)
    assert (ckpt.last_age_seconds, ckpt.reported) == (60, True)  # the pod's, newer than the wl's
    pod["metadata"]["annotations"]["m2g.io/last-checkpoint-time"] = "2026-11-29T22:44:18Z"
    ckpt = kb.build_snapshot(objs, None, NOW).workloads[0].checkpoint_at(NOW)
    assert ckpt.last_age_seconds == 420  # the Workload's own report is newer now


def test_owned_value_changes_and_patch() -> None:
    """The one read-modify-write step of quota and KAI-limit writes: record base and set on a
    derate, remove both when the base is written back, always stamp changed-at."""
    owned = ka.owned_quota("gb200")
    assert owned.base({}, 72) == 72
    derate = owned.changes({}, "72", "48")
    assert derate == {"m2g.io/base-quota.gb200": "72", "m2g.io/quota-set.gb200": "48"}
    recorded = dict(derate)
    assert owned.base(recorded, 48) == 72 and owned.base(recorded, 60) == 60  # GitOps changed it
    assert owned.changes(recorded, "72", "72") == {k: None for k in derate}
    cq = {"metadata": {"name": "cq", "resourceVersion": "7"}}
    assert owned.patch(cq, derate, NOW, {"x": 1}) == {
        "metadata": {"resourceVersion": "7", "annotations": {
            **derate, "m2g.io/quota-changed-at": kp.format_time(NOW)}},
        "spec": {"x": 1}}
    assert ka.GPU_LIMIT.changed_at_key == "m2g.io/gpu-limit-changed-at"
