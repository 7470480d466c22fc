"""The repository's templates submitted with ``m2g submit`` and followed through Kueue (shared by
the real-labels, chart and kind e2e tests).

``run_template`` submits one template as a Job or a JobSet and requires what a tenant expects on
a GB300-labelled factory: its Workload admitted on the first try (no requeue) with m2g's check
``Ready``, placed where the template asks (the gangs that ask for a clique inside one NVLink
clique, a block with clique slices inside one block, each slice inside one clique); for a JobSet
also its child Jobs made and unsuspended by the JobSet controller and every pod of them
``Running`` on the very hosts of Kueue's TopologyAssignment. It then deletes the job and waits
for its Workload and pods to go (the next template needs the quota and the cliques).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import REPO, Cluster, condition, unique, wait_until
from manifests_helpers import kubectl
from typer.testing import CliRunner

from m2g.model import labels as L
from m2g.templates import WorkloadApi
from m2g.templates.loader import load_all
from m2g_cli.app import app

TEMPLATES = load_all(REPO / "templates")
JOB_TEMPLATES = sorted(n for n, t in TEMPLATES.items() if WorkloadApi.JOB in t.spec.apis)
JOBSET_TEMPLATES = sorted(n for n, t in TEMPLATES.items() if WorkloadApi.JOBSET in t.spec.apis)
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Sized to the small factory (2 racks of one block each, 144 GPUs): 405B with dp=1 is 64 GPUs
#: (TP4 CP2 PP8), one block, one 16-pod clique slice.
SETS = {"llama31-405b-pretrain": ["dp=1"]}
#: per API: the resource to delete and the label its pods carry
_KINDS = {"Job": ("jobs.batch", "batch.kubernetes.io/job-name"),
          "JobSet": ("jobsets.jobset.x-k8s.io", JOBSET_NAME_LABEL)}


def submit(kubeconfig: Path, ns: str, name: str, api: str, *args: str) -> str:
    """``m2g submit`` template ``name`` as ``api`` (Job, JobSet) under a unique name, with the
    sizes of SETS and ``args`` (more options); returns the name."""
    job = unique(name[:30])
    argv = ["submit", name, "-n", ns, "--kubeconfig", str(kubeconfig), "--set", f"name={job}",
            "--set", f"api={api}", *args]
    for item in SETS.get(name, []):
        argv += ["--set", item]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, (name, result.stdout, result.stderr)
    return job


def run_template(kubeconfig: Path, cluster: Cluster, ns: str, name: str, api: str,
                 *args: str) -> None:
    """Submit template ``name`` as ``api`` and check it as the module docstring says."""
    job = submit(kubeconfig, ns, name, api, *args)
    resource, pod_label = _KINDS[api]
    seen: list[dict[str, Any]] = []
    pods_seen: list[Any] = []

    def mine() -> list[dict[str, Any]]:
        return [w for w in cluster.workloads(ns) if any(
            o.get("kind") == api and o.get("name") == job
            for o in w["metadata"].get("ownerReferences", []))]

    def admitted() -> dict[str, Any] | None:
        seen[:] = mine()
        ok = seen and (condition(seen[0], "Admitted") or {}).get("status") == "True"
        return seen[0] if ok else None

    def pods() -> list[Any]:
        return list(cluster.core.list_namespaced_pod(
            ns, label_selector=f"{pod_label}={job}").items)

    try:
        wl = wait_until(f"{name} ({api}) to be admitted", admitted, timeout=120)
        status = wl["status"]
        assert "requeueState" not in status, status["requeueState"]  # the first try
        (check,) = status["admissionChecks"]
        assert (check["name"], check["state"]) == ("m2g-policy", "Ready"), check
        placed_where_it_should_be(cluster, wl)
        if api == "JobSet":
            want = sum(int(ps["count"]) for ps in wl["spec"]["podSets"])

            def all_running() -> bool:
                pods_seen[:] = pods()
                return len(pods_seen) == want and all(
                    p.status.phase == "Running" and p.spec.node_name for p in pods_seen)

            wait_until(f"{name}'s {want} JobSet pods to run", all_running, timeout=120)
            children_run_where_kueue_placed_them(cluster, ns, job, wl, pods_seen)
    except pytest.fail.Exception as exc:
        phases = Counter((p.status.phase, p.spec.node_name) for p in pods_seen)
        pytest.fail(f"{exc}; workload: {json.dumps((seen or [{}])[0].get('status'))[:1500]}"
                    + (f"; pods (phase, node): {dict(phases)}" if pods_seen else ""),
                    pytrace=False)
    finally:
        kubectl(kubeconfig, "delete", resource, job, "-n", ns, "--cascade=foreground",
                "--wait=true", "--timeout=90s", check=False)
        wait_until(f"{name}'s workload and pods to go", lambda: not mine() and not pods(),
                   timeout=90)


def nodes_carry_only_real_cluster_labels(cluster: Cluster) -> None:
    """The factory's nodes carry GFD's and Topograph's labels (what a real GB300 NVL72 cluster
    carries) and no topology label of m2g's own (``m2g.io/factory`` is localcp's bookkeeping)."""
    nodes = cluster.core.list_node(label_selector="m2g.io/factory=small").items
    assert nodes
    for node in nodes:
        labels = node.metadata.labels
        assert {L.GPU_CLIQUE, L.GPU_PRODUCT, L.TOPOGRAPH_BLOCK, L.TOPOGRAPH_ACCELERATOR} <= \
            set(labels), labels
        assert [k for k in labels if k.startswith("m2g.io/")] == ["m2g.io/factory"], labels


def placed_where_it_should_be(cluster: Cluster, wl: dict[str, Any]) -> None:
    """Each pod set's TAS assignment against the node labels: a required clique → one clique;
    a required block with clique slices → one block, each slice's hosts in one clique."""
    for ps, psa in zip(wl["spec"]["podSets"], wl["status"]["admission"]["podSetAssignments"],
                       strict=True):
        request = ps.get("topologyRequest") or {}
        assignment = psa.get("topologyAssignment")
        if request.get("unconstrained") or not request:
            continue
        assert assignment, psa
        hosts = hosts_of(assignment)
        assert sum(hosts.values()) == ps["count"], hosts
        labels = {h: cluster.core.read_node(h).metadata.labels for h in hosts}
        required = request.get("required")
        assert required in (L.GPU_CLIQUE, L.TOPOGRAPH_BLOCK), request
        assert len({lab[required] for lab in labels.values()}) == 1, (required, labels)
        if request.get("podSetSliceRequiredTopology") == L.GPU_CLIQUE:
            size = int(request["podSetSliceSize"])
            per_clique: dict[str, int] = {}
            for h, n in hosts.items():
                per_clique[labels[h][L.GPU_CLIQUE]] = per_clique.get(
                    labels[h][L.GPU_CLIQUE], 0) + n
            assert all(n % size == 0 for n in per_clique.values()), per_clique


def hosts_of(assignment: dict[str, Any]) -> dict[str, int]:
    """Pods per hostname in a v1beta2 TopologyAssignment (levels + compressed slices)."""
    out: dict[str, int] = {}
    index = assignment["levels"].index(L.HOSTNAME)
    for s in assignment["slices"]:
        n = s["domainCount"]
        level = s["valuesPerLevel"][index]
        if "universal" in level:
            names = [str(level["universal"])] * n
        else:
            ind = level["individual"]
            names = [f"{ind.get('prefix', '')}{r}{ind.get('suffix', '')}" for r in ind["roots"]]
        counts = s["podCounts"]
        per = ([counts["universal"]] * n if "universal" in counts
               else counts.get("individual") or counts["podCounts"])
        for host, count in zip(names, per, strict=True):
            out[host] = out.get(host, 0) + int(count)
    return out


def children_run_where_kueue_placed_them(cluster: Cluster, ns: str, job: str,
                                         wl: dict[str, Any], pods: list[Any]) -> None:
    """The JobSet was unsuspended into its child Jobs (one per replica, each unsuspended), and
    the pods of those Jobs are on exactly the hosts of Kueue's TopologyAssignment, as many on
    each; with a clique slice asked for, each child Job's pods share one clique."""
    jobset = cluster.custom.get_namespaced_custom_object(*JOBSET[:2], ns, JOBSET[2], job)
    assert jobset["spec"].get("suspend") is False, jobset["spec"].get("suspend")
    children = cluster.batch.list_namespaced_job(
        ns, label_selector=f"{JOBSET_NAME_LABEL}={job}").items
    want_jobs = sum(int(r["replicas"]) for r in jobset["spec"]["replicatedJobs"])
    assert len(children) == want_jobs, [c.metadata.name for c in children]
    assert not any(c.spec.suspend for c in children), [c.metadata.name for c in children]
    owners = {p.metadata.labels.get("batch.kubernetes.io/job-name") for p in pods}
    assert owners == {c.metadata.name for c in children}, owners
    assigned: Counter[str] = Counter()
    for psa in wl["status"]["admission"]["podSetAssignments"]:
        if psa.get("topologyAssignment"):
            assigned.update(hosts_of(psa["topologyAssignment"]))
    on_nodes = Counter(str(p.spec.node_name) for p in pods)
    if assigned:  # every pod set here asks for a topology: the pods are where Kueue said
        assert on_nodes == assigned, (dict(on_nodes), dict(assigned))
    sliced = [ps for ps in wl["spec"]["podSets"]
              if (ps.get("topologyRequest") or {}).get("podSetSliceRequiredTopology")
              == L.GPU_CLIQUE]
    if sliced:
        clique = {n: cluster.core.read_node(n).metadata.labels[L.GPU_CLIQUE] for n in on_nodes}
        per_child: dict[str, set[str]] = {}
        for p in pods:
            per_child.setdefault(p.metadata.labels["batch.kubernetes.io/job-name"], set()).add(
                clique[p.spec.node_name])
        assert all(len(c) == 1 for c in per_child.values()), per_child
