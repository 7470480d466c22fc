"""m2g on a factory labelled only as a real GB300 cluster labels its nodes.

The KWOK factory's nodes carry GPU Feature Discovery's labels (``nvidia.com/gpu.clique``,
``nvidia.com/gpu.product``, ...) and NVIDIA Topograph's (``network.topology.nvidia.com/block``
and ``/accelerator``), and no topology label of m2g's own. The Kueue Topology and flavor are
what ``m2g topology generate`` writes for the default mapping. With ``m2g run`` answering the
ClusterQueue's check (the shipped policies, the Deployment's site configuration), a job from
every template that renders to a plain batch/v1 Job, submitted with ``m2g submit``, is admitted
on the first try and placed where it should be: the gangs that ask for a clique inside one
NVLink clique, the pre-training job inside one block with each 16-pod slice inside one clique.

Every template that renders a JobSet runs for real too: the JobSet controller of the local
control plane makes its child Jobs once Kueue admits it (the ``jobset.x-k8s.io/jobset``
integration), and every pod of those Jobs runs (KWOK) on the very hosts of Kueue's topology
assignment, each child Job (one slice) inside one NVLink clique when the template asks for it.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import REPO, Cluster, condition, unique, wait_until
from manifests_helpers import SITE_CONFIG, controller, kubectl
from typer.testing import CliRunner

from m2g.model import labels as L
from m2g.templates import WorkloadApi
from m2g.templates.loader import load_all
from m2g_cli.app import app

pytestmark = pytest.mark.e2e

TEMPLATES = load_all(REPO / "templates")
JOB_TEMPLATES = sorted(n for n, t in TEMPLATES.items() if WorkloadApi.JOB in t.spec.apis)
JOBSET_TEMPLATES = sorted(n for n, t in TEMPLATES.items() if WorkloadApi.JOBSET in t.spec.apis)
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
#: Sized to the small factory (2 racks of one block each, 144 GPUs): 405B with dp=1 is 64 GPUs
#: (TP4 CP2 PP8), one block, one 16-pod clique slice.
SETS = {"llama31-405b-pretrain": ["dp=1"]}
FACTORY_GPUS = 144


@pytest.fixture(scope="module")
def queue(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace whose LocalQueue ``default`` feeds a ClusterQueue on the factory's flavor
    gated by m2g's check, the Topology objects of ``m2g topology generate``, and m2g run."""
    ns, cq = unique("labels"), unique("labels-cq")
    topo = CliRunner().invoke(app, ["topology", "generate", "--config", str(SITE_CONFIG),
                                    "--no-kai"])
    assert topo.exit_code == 0, topo.output
    objs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": cq},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "admissionChecksStrategy": {"admissionChecks": [{"name": "m2g-policy"}]},
                  "resourceGroups": [{"coveredResources": [L.GPU_RESOURCE], "flavors": [
                      {"name": "gb200", "resources": [
                          {"name": L.GPU_RESOURCE, "nominalQuota": str(FACTORY_GPUS)}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": "default", "namespace": ns}, "spec": {"clusterQueue": cq}},
    ]
    docs = topo.output + "---\n" + yaml.safe_dump_all(objs)
    kubectl(kubeconfig, "create", "namespace", "m2g-system", check=False)
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-", stdin=docs)
    log = tmp_path_factory.mktemp("labels") / "m2g-run.log"
    try:
        with controller(kubeconfig, log, "--config", str(SITE_CONFIG), "--identity",
                        "labels-e2e", "--policies", str(REPO / "policies"),
                        "--resync-seconds", "2"):
            wait_until(f"ClusterQueue {cq} to be Active", lambda: (
                (c := condition(_get(kubeconfig, f"clusterqueues.kueue.x-k8s.io/{cq}"),
                                "Active")) and c["status"] == "True"), timeout=90)
            yield ns
    finally:
        kubectl(kubeconfig, "delete", "namespace", ns, "--wait=true", "--timeout=120s",
                check=False)
        kubectl(kubeconfig, "delete", f"clusterqueues.kueue.x-k8s.io/{cq}", check=False)


def _get(kubeconfig: Path, *args: str) -> Any:
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}


def test_factory_nodes_carry_only_real_cluster_labels(cluster: Cluster) -> None:
    nodes = cluster.core.list_node(label_selector="m2g.io/factory=small").items
    assert nodes
    for node in nodes:
        labels = node.metadata.labels
        assert {L.GPU_CLIQUE, L.GPU_PRODUCT, L.TOPOGRAPH_BLOCK, L.TOPOGRAPH_ACCELERATOR} <= \
            set(labels)
        assert [k for k in labels if k.startswith("m2g.io/")] == ["m2g.io/factory"]


def _submit(kubeconfig: Path, ns: str, name: str, api: str) -> str:
    """``m2g submit`` template ``name`` as ``api`` (Job, JobSet) under a unique name."""
    job = unique(name[:30])
    args = ["submit", name, "-n", ns, "--kubeconfig", str(kubeconfig), "--templates-dir",
            str(REPO / "templates"), "--set", f"name={job}", "--set", f"api={api}",
            "--set", "scheduler=default", "--set", "priority="]
    for item in SETS.get(name, []):
        args += ["--set", item]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return job


@pytest.mark.parametrize("name", JOB_TEMPLATES)
def test_every_job_template_is_admitted_on_the_first_try_and_placed(
        kubeconfig: Path, cluster: Cluster, queue: str, name: str) -> None:
    ns = queue
    job = _submit(kubeconfig, ns, name, "Job")
    seen: list[dict[str, Any]] = []

    def admitted() -> dict[str, Any] | None:
        mine = [w for w in cluster.workloads(ns) if any(
            o.get("name") == job for o in w["metadata"].get("ownerReferences", []))]
        seen[:] = mine
        ok = mine and (condition(mine[0], "Admitted") or {}).get("status") == "True"
        return mine[0] if ok else None

    try:
        wl = wait_until(f"{name} to be admitted", admitted, timeout=120)
        status = wl["status"]
        assert "requeueState" not in status, status["requeueState"]  # the first try
        (check,) = status["admissionChecks"]
        assert (check["name"], check["state"]) == ("m2g-policy", "Ready"), check
        _placed_where_it_should_be(cluster, wl, TEMPLATES[name].spec.apis)
    except pytest.fail.Exception as exc:
        pytest.fail(f"{exc}; workload: {json.dumps((seen or [{}])[0].get('status'))[:1500]}",
                    pytrace=False)
    finally:
        # the next template needs the whole factory: its pods must be gone, not only its Job
        kubectl(kubeconfig, "delete", "jobs.batch", job, "-n", ns, "--cascade=foreground",
                "--wait=true", "--timeout=90s", check=False)
        wait_until(f"{name}'s workload and pods to go", lambda: not [
            w for w in cluster.workloads(ns) if any(
                o.get("name") == job for o in w["metadata"].get("ownerReferences", []))]
            and not cluster.core.list_namespaced_pod(
                ns, label_selector=f"batch.kubernetes.io/job-name={job}").items, timeout=90)


def _placed_where_it_should_be(cluster: Cluster, wl: dict[str, Any], _apis: Any) -> None:
    """Each pod set's TAS assignment against the node labels: a required clique → one clique;
    a required block with clique slices → one block, each slice's hosts in one clique."""
    for ps, psa in zip(wl["spec"]["podSets"], wl["status"]["admission"]["podSetAssignments"],
                       strict=True):
        request = ps.get("topologyRequest") or {}
        assignment = psa.get("topologyAssignment")
        if request.get("unconstrained") or not request:
            continue
        assert assignment, psa
        hosts = _hosts(assignment)
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


def _hosts(assignment: dict[str, Any]) -> dict[str, int]:
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


def test_some_templates_render_a_jobset() -> None:
    """The parametrisation below is not empty by accident (a moved folder, a dropped API)."""
    assert JOBSET_TEMPLATES


@pytest.mark.parametrize("name", JOBSET_TEMPLATES)
def test_every_jobset_template_runs_its_child_jobs_where_kueue_placed_it(
        kubeconfig: Path, cluster: Cluster, queue: str, name: str) -> None:
    ns = queue
    job = _submit(kubeconfig, ns, name, "JobSet")
    seen: list[dict[str, Any]] = []
    pods_seen: list[Any] = []

    def mine() -> list[dict[str, Any]]:
        return [w for w in cluster.workloads(ns) if any(
            o.get("kind") == "JobSet" and o.get("name") == job
            for o in w["metadata"].get("ownerReferences", []))]

    def admitted() -> dict[str, Any] | None:
        seen[:] = mine()
        ok = seen and (condition(seen[0], "Admitted") or {}).get("status") == "True"
        return seen[0] if ok else None

    def pods() -> list[Any]:
        return list(cluster.core.list_namespaced_pod(
            ns, label_selector=f"{JOBSET_NAME_LABEL}={job}").items)

    try:
        wl = wait_until(f"{name} (JobSet) to be admitted", admitted, timeout=120)
        status = wl["status"]
        assert "requeueState" not in status, status["requeueState"]  # the first try
        (check,) = status["admissionChecks"]
        assert (check["name"], check["state"]) == ("m2g-policy", "Ready"), check
        _placed_where_it_should_be(cluster, wl, TEMPLATES[name].spec.apis)
        want = sum(int(ps["count"]) for ps in wl["spec"]["podSets"])

        def all_running() -> bool:
            pods_seen[:] = pods()
            return len(pods_seen) == want and all(
                p.status.phase == "Running" and p.spec.node_name for p in pods_seen)

        wait_until(f"{name}'s {want} JobSet pods to run", all_running, timeout=120)
        _children_run_where_kueue_placed_them(cluster, ns, job, wl, pods_seen)
    except pytest.fail.Exception as exc:
        phases = Counter((p.status.phase, p.spec.node_name) for p in pods_seen)
        pytest.fail(f"{exc}; workload: {json.dumps((seen or [{}])[0].get('status'))[:1500]}; "
                    f"pods (phase, node): {dict(phases)}", pytrace=False)
    finally:
        kubectl(kubeconfig, "delete", "jobsets.jobset.x-k8s.io", job, "-n", ns,
                "--cascade=foreground", "--wait=true", "--timeout=90s", check=False)
        wait_until(f"{name}'s workload and pods to go", lambda: not mine() and not pods(),
                   timeout=90)


def _children_run_where_kueue_placed_them(cluster: Cluster, ns: str, job: str,
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
            assigned.update(_hosts(psa["topologyAssignment"]))
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
