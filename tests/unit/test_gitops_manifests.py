"""The GitOps manifests (kueue-config/, deploy/) without a cluster: they render, agree with each
other, with the factory generator, with the templates and with the controller's code.

Rendering uses ``kubectl kustomize`` (the cached kubectl of kind-e2e, else one on PATH); the
tests that need it are skipped without one. The rest reads the YAML and JSON files directly.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcp import factory
from localcp.paths import binary
from prometheus_client import CollectorRegistry

from m2g.config import parse_site_config
from m2g.config.site import TopologySettings
from m2g.config.topology import topology_objects
from m2g.model.cluster import CHECK_CONTROLLER
from m2g.planner.config import PlannerConfig
from m2g_controllers.metrics import Metrics

REPO = Path(__file__).resolve().parents[2]


Obj = dict[str, Any]
KUEUE = "kueue.x-k8s.io/v1beta2"
OVERLAY = REPO / "kueue-config" / "overlays" / "nvl72"
DASHBOARD = REPO / "deploy" / "monitoring" / "grafana-dashboard.json"
COVERED = {"cpu", "memory", "nvidia.com/gpu"}


def _kubectl() -> str | None:
    local = binary("kubectl")
    return str(local) if local.exists() else shutil.which("kubectl")


def render(folder: Path) -> list[Obj]:
    """``kubectl kustomize folder`` as a list of objects (skips the test without kubectl)."""
    kubectl = _kubectl()
    if kubectl is None:
        pytest.skip("no kubectl (build it: kind-e2e/tools/build.sh kubectl)")
    out = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(objs: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def quantity(text: str | int) -> float:
    s = str(text)
    for suffix, factor in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40)):
        if s.endswith(suffix):
            return float(s[:-2]) * factor
    return float(s)


# ---- kueue-config ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def kueue_objs() -> list[Obj]:
    return render(OVERLAY)


def test_every_kueue_object_is_v1beta2(kueue_objs: list[Obj]) -> None:
    for o in kueue_objs:
        if o["apiVersion"].startswith("kueue.x-k8s.io"):
            assert o["apiVersion"] == KUEUE, o["metadata"]["name"]


def test_the_admission_check_is_m2gs(kueue_objs: list[Obj]) -> None:
    checks = by_kind(kueue_objs, "AdmissionCheck")
    name = PlannerConfig().check_name
    assert list(checks) == [name]
    assert checks[name]["spec"]["controllerName"] == CHECK_CONTROLLER


def test_every_cluster_queue_is_gated_by_m2g_and_covers_cpu_memory_gpu(
        kueue_objs: list[Obj]) -> None:
    cqs = by_kind(kueue_objs, "ClusterQueue")
    flavors = by_kind(kueue_objs, "ResourceFlavor")
    assert set(cqs) == {"prod-training", "research", "inference"}
    for name, cq in cqs.items():
        checks = cq["spec"]["admissionChecksStrategy"]["admissionChecks"]
        assert {"name": PlannerConfig().check_name} in checks, name
        groups = cq["spec"]["resourceGroups"]
        covered = {r for g in groups for r in g["coveredResources"]}
        assert covered >= COVERED, name
        for group in groups:
            for flavor in group["flavors"]:
                assert flavor["name"] in flavors, (name, flavor["name"])
                assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]


def test_every_cluster_queue_sets_its_tier_floor(kueue_objs: list[Obj]) -> None:
    """``m2g.io/min-flex-tier`` (the least flexible tier a queue's jobs may claim; tenants
    cannot edit ClusterQueues): research work is always sheddable (2), production training
    and inference may claim any tier (0); every value one m2g reads, none reported."""
    from m2g.k8s.convert import invalid_min_flex_tiers, min_flex_tiers

    cqs = list(by_kind(kueue_objs, "ClusterQueue").values())
    assert min_flex_tiers(cqs) == {"research": 2, "prod-training": 0, "inference": 0}
    assert invalid_min_flex_tiers(cqs) == {}


def test_quotas_add_up_to_the_small_factory(kueue_objs: list[Obj]) -> None:
    spec = factory.load_spec(REPO / "kind-e2e" / "factories" / "small.yaml")
    totals = {"cpu": 0.0, "memory": 0.0, "nvidia.com/gpu": 0.0}
    for cq in by_kind(kueue_objs, "ClusterQueue").values():
        for group in cq["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                per = {r["name"]: quantity(r["nominalQuota"]) for r in flavor["resources"]}
                # cpu and memory per GPU: one tray's share, so GPUs are the binding quota
                gpus = per["nvidia.com/gpu"]
                assert per["cpu"] == gpus * quantity(spec.node.cpu) / spec.gpus_per_node
                assert per["memory"] == gpus * quantity(spec.node.memory) / spec.gpus_per_node
                for k in totals:
                    totals[k] += per[k]
    assert totals["nvidia.com/gpu"] == spec.gpu_count
    assert totals["cpu"] == spec.node_count * quantity(spec.node.cpu)
    assert totals["memory"] == spec.node_count * quantity(spec.node.memory)


def test_flavor_and_topology_are_the_factory_generators_objects(kueue_objs: list[Obj]) -> None:
    """Applying the overlay to the local factory co-owns these objects, never conflicts
    (Topology levels and a flavor's topologyName are immutable)."""
    spec = factory.load_spec(REPO / "kind-e2e" / "factories" / "small.yaml")
    generated = [o for o in factory.scheduling_objects(spec) if o["apiVersion"] == KUEUE]
    assert generated
    for gen in generated:
        ours = by_kind(kueue_objs, gen["kind"])[gen["metadata"]["name"]]
        assert ours["spec"] == gen["spec"], gen["kind"]


def test_topology_generate_writes_the_factorys_and_kueue_configs_objects(
        kueue_objs: list[Obj]) -> None:
    """`m2g topology generate` with the default mapping writes the objects the KWOK factory
    creates (its nodes carry GFD's and Topograph's labels) and kueue-config ships; the KAI
    Topology has the levels m2g's planner keeps it at."""
    spec = factory.load_spec(REPO / "kind-e2e" / "factories" / "small.yaml")
    made = {(o["kind"], o["apiVersion"]): o for o in topology_objects(TopologySettings())}
    for gen in factory.scheduling_objects(spec):
        assert made[(gen["kind"], gen["apiVersion"])] == gen, gen["kind"]
    kai = made[("Topology", "kai.scheduler/v1alpha1")]
    assert tuple(lv["nodeLabel"] for lv in kai["spec"]["levels"]) == \
        PlannerConfig().kai_topology_levels
    node_labels = set(factory.nodes(spec)[0]["metadata"]["labels"])
    for level in kai["spec"]["levels"]:
        assert level["nodeLabel"] in node_labels
    assert not {k for k in node_labels if k.startswith("m2g.io/")} - {factory.FACTORY_LABEL}


def test_cohort_tree_and_queues_are_connected(kueue_objs: list[Obj]) -> None:
    cohorts = by_kind(kueue_objs, "Cohort")
    roots = [n for n, c in cohorts.items() if not c["spec"].get("parentName")]
    assert roots == ["factory"]
    for name, c in cohorts.items():
        seen = {name}
        parent = c["spec"].get("parentName")
        while parent:
            assert parent in cohorts and parent not in seen, name
            seen.add(parent)
            parent = cohorts[parent]["spec"].get("parentName")
    cqs = by_kind(kueue_objs, "ClusterQueue")
    for name, cq in cqs.items():
        assert cq["spec"]["cohortName"] in cohorts, name
    namespaces = by_kind(kueue_objs, "Namespace")
    lqs = [o for o in kueue_objs if o["kind"] == "LocalQueue"]
    assert len(lqs) == len(cqs)
    for lq in lqs:
        cq = cqs[lq["spec"]["clusterQueue"]]
        labels = namespaces[lq["metadata"]["namespace"]]["metadata"]["labels"]
        selector = cq["spec"]["namespaceSelector"]["matchLabels"]
        assert selector.items() <= labels.items(), lq["metadata"]["namespace"]


def test_priority_classes_are_the_templates(kueue_objs: list[Obj]) -> None:
    templates = REPO / "templates" / "workload-priority-classes.yaml"
    want = {d["metadata"]["name"]: d["value"] for d in yaml.safe_load_all(templates.read_text())}
    got = {n: o["value"] for n, o in by_kind(kueue_objs, "WorkloadPriorityClass").items()}
    assert got == want


def test_shadow_overlay_takes_m2g_out_of_admission() -> None:
    objs = render(REPO / "kueue-config" / "overlays" / "nvl72-shadow")
    cqs = by_kind(objs, "ClusterQueue")
    assert len(cqs) == 3
    assert all("admissionChecksStrategy" not in cq["spec"] for cq in cqs.values())
    assert "m2g-policy" in by_kind(objs, "AdmissionCheck")


# ---- deploy ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def deploy_objs() -> list[Obj]:
    return render(REPO / "deploy" / "overlays" / "monitoring")


def test_controller_deployment(deploy_objs: list[Obj]) -> None:
    dep = by_kind(deploy_objs, "Deployment")["m2g"]
    assert dep["metadata"]["namespace"] == "m2g-system"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]
    assert pod["spec"]["serviceAccountName"] == "m2g"
    assert pod["spec"]["priorityClassName"] in by_kind(deploy_objs, "PriorityClass")
    (container,) = pod["spec"]["containers"]
    cmd = container["command"]
    assert cmd[:2] == ["m2g", "run"] and "--leader-elect" in cmd and "--shadow" not in cmd
    assert "--lease-namespace" not in cmd  # the Lease is in the pod's namespace (POD_NAMESPACE)
    env = {e["name"]: e.get("valueFrom", {}) for e in container["env"]}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    config_path = Path(cmd[cmd.index("--config") + 1])
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    config_map = by_kind(deploy_objs, "ConfigMap")[volume["configMap"]["name"]]
    assert config_map["metadata"]["namespace"] == "m2g-system"
    site = parse_site_config(config_map["data"][config_path.name], "m2g-config")
    assert site.prometheus is not None and site.prometheus.url.startswith("http")
    assert cmd[cmd.index("--metrics-port") + 1] == "8080"
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    pod_labels = pod["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for kind in ("PodDisruptionBudget", "Service"):
        (obj,) = by_kind(deploy_objs, kind).values()
        selector = obj["spec"]["selector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= pod_labels.items(), kind
    pdb = by_kind(deploy_objs, "PodDisruptionBudget")["m2g"]
    assert pdb["spec"]["minAvailable"] == 1
    netpol = by_kind(deploy_objs, "NetworkPolicy")["m2g"]
    assert netpol["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    monitor = by_kind(deploy_objs, "ServiceMonitor")["m2g"]
    service = by_kind(deploy_objs, "Service")["m2g-metrics"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


def test_shadow_overlay_adds_the_flag() -> None:
    dep = by_kind(render(REPO / "deploy" / "overlays" / "shadow"), "Deployment")["m2g"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "--shadow"


def test_deploy_contains_crds_and_every_policy(deploy_objs: list[Obj]) -> None:
    crds = by_kind(deploy_objs, "CustomResourceDefinition")
    assert {"gridevents.m2g.io", "maintenancewindows.m2g.io", "powerdomains.m2g.io",
            "reservations.m2g.io", "capacityplans.m2g.io",
            "policies.m2g.io"} <= set(crds)
    sources = [p for p in sorted((REPO / "policies").glob("*/*.yaml"))
               if not p.name.endswith("_test.yaml")]
    want = {d["metadata"]["name"] for p in sources for d in yaml.safe_load_all(p.read_text())
            if d and d.get("kind") == "Policy"}
    assert want and set(by_kind(deploy_objs, "Policy")) == want
    dashboards = by_kind(deploy_objs, "ConfigMap")["m2g-grafana-dashboard"]
    assert json.loads(dashboards["data"]["m2g.json"]) == json.loads(DASHBOARD.read_text())


def test_policy_copies_are_fresh() -> None:
    out = subprocess.run(["bash", str(REPO / "deploy" / "policies" / "sync.sh"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr


def test_rbac_is_exactly_the_controllers_needs() -> None:
    """The ClusterRole as a table; a change here must be a deliberate one (docs/deploy.md)."""
    docs = list(yaml.safe_load_all((REPO / "deploy" / "controller" / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    grants: dict[tuple[str, str], set[str]] = {}
    named: dict[tuple[str, str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for res in rule["resources"]:
                if "resourceNames" in rule:
                    for name in rule["resourceNames"]:
                        named.setdefault((group, res, name), set()).update(rule["verbs"])
                else:
                    grants.setdefault((group, res), set()).update(rule["verbs"])
    # KAI's Topology levels are immutable: m2g replaces (deletes) only the one it manages
    assert named == {("kai.scheduler", "topologies", "nvl72"): {"delete"}}
    read = {"get", "list", "watch"}
    want = {
        ("", "nodes"): read | {"patch"}, ("", "pods"): read, ("", "events"): {"create"},
        ("kueue.x-k8s.io", "workloads"): read | {"patch"},
        ("batch", "jobs"): {"get", "patch"},  # right-sizing elastic Jobs
        ("kueue.x-k8s.io", "workloads/status"): {"patch"},
        ("kueue.x-k8s.io", "clusterqueues"): read | {"patch", "update"},
        ("kueue.x-k8s.io", "resourceflavors"): read, ("kueue.x-k8s.io", "localqueues"): read,
        ("kueue.x-k8s.io", "cohorts"): read, ("kueue.x-k8s.io", "topologies"): read,
        ("kueue.x-k8s.io", "admissionchecks"): read | {"create"},
        ("kueue.x-k8s.io", "admissionchecks/status"): {"patch", "update"},
        ("events.k8s.io", "events"): {"create", "patch"},
        ("kai.scheduler", "topologies"): read | {"create", "patch"},
        ("scheduling.run.ai", "queues"): read | {"patch"},
        # the power-cap lever: the spec of GPUPowerLimits (the node agent writes their status)
        ("m2g.io", "gpupowerlimits"): read | {"create", "patch", "delete"},
    }
    for res in ("gridevents", "maintenancewindows", "powerdomains", "policies", "tenantpolicies",
                "reservations", "capacityplans"):
        want[("m2g.io", res)] = read
        want[("m2g.io", f"{res}/status")] = {"patch", "update"}
    # the Accepted condition on an object m2g leaves out of its snapshot (m2g.k8s.validity)
    want[("m2g.io", "gpupowerlimits/status")] = {"patch", "update"}
    assert grants == want
    lease = next(d for d in docs if d["kind"] == "Role")
    assert lease["metadata"]["namespace"] == "m2g-system"
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["m2g-controller"], "verbs": ["get", "update"]}]


# ---- the Grafana dashboard ------------------------------------------------------------------

def exported_metrics() -> dict[str, set[str]]:
    """Every series name m2g's metrics module exports, with its labels."""
    names: dict[str, set[str]] = {}
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    for attr in vars(metrics).values():
        if not hasattr(attr, "_name"):
            continue
        labels = set(attr._labelnames)
        kind = attr._type
        base = attr._name
        if kind == "counter":
            names[f"{base}_total"] = labels
        elif kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[base + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            names[base] = labels
    return names


def panels(dashboard: Obj) -> Iterator[Obj]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


# Labels Prometheus adds to every scraped series (ServiceMonitor target labels).
TARGET_LABELS = {"pod", "instance", "job", "namespace", "service", "endpoint", "container"}


def test_dashboard_queries_use_real_metrics_and_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    metrics = exported_metrics()
    assert "m2g_admission_decisions_total" in metrics  # the naming rule above is right
    used: set[str] = set()
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        names = set(re.findall(r"\bm2g_[a-z0-9_]+", expr))
        assert names, expr
        unknown = names - set(metrics)
        assert not unknown, f"{expr}: not exported by m2g_controllers.metrics: {unknown}"
        used |= names
        labels = set().union(*(metrics[n] for n in names)) | TARGET_LABELS
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in filter(None, (s.strip() for s in group.split(","))):
                assert label in labels, f"{expr}: label {label} not on {names}"
        for label in re.findall(r"[{,]\s*([a-z_]+)\s*=~?", expr):
            assert label in labels, f"{expr}: label {label} not on {names}"
    bases = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    exported = {re.sub(r"_(bucket|sum|count)$", "", n) for n in metrics}
    missing = exported - bases
    assert not missing, f"metrics without a panel: {missing}"


def test_dashboard_is_importable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for p in panels(dashboard):
        if p["type"] != "row":
            assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]

