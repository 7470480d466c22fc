"""kueue-config/ against the real control plane: the nvl72 overlay applies cleanly with server-side
apply, a second apply changes nothing, the ClusterQueues wait for m2g's AdmissionCheck and work
once it is Active, the shadow overlay takes m2g out of the admission path and back, and a quota
m2g has derated is not silently reverted by a plain re-apply.

The overlay's ResourceFlavor gb200 and Topology nvl72 are the factory generator's own objects;
the test leaves them in place and deletes only what it created.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import condition, unique, wait_until
from manifests_helpers import (
    QUEUES,
    Applied,
    generations,
    in_sync,
    job,
    kubectl,
    objects,
    render,
)

from m2g.k8s.convert import cluster_queue

pytestmark = pytest.mark.e2e

OVERLAY = "kueue-config/overlays/nvl72"
SHADOW = "kueue-config/overlays/nvl72-shadow"
CHECK = "m2g-policy"


@pytest.fixture(scope="module")
def overlay(kubeconfig: Path) -> Iterator[str]:
    """The nvl72 overlay, applied once for the module and deleted afterwards."""
    text = render(OVERLAY)
    applied = Applied(kubeconfig)
    try:
        applied.apply(text)
        yield text
    finally:
        applied.delete()


def get_json(kubeconfig: Path, *args: str) -> Any:
    out = kubectl(kubeconfig, "get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def cq(kubeconfig: Path, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(kubeconfig, f"clusterqueues.kueue.x-k8s.io/{name}")
    return found


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_check_active(kubeconfig: Path, active: bool) -> None:
    """Do what the m2g controller does on start: keep the check's Active condition."""
    ac = get_json(kubeconfig, f"admissionchecks.kueue.x-k8s.io/{CHECK}")
    cond = {"type": "Active", "status": "True" if active else "False",
            "reason": "Active" if active else "Stopped", "message": "e2e stands in for m2g",
            "lastTransitionTime": now(), "observedGeneration": ac["metadata"]["generation"]}
    kubectl(kubeconfig, "patch", f"admissionchecks.kueue.x-k8s.io/{CHECK}", "--type=merge",
            "--subresource=status", "-p", json.dumps({"status": {"conditions": [cond]}}))


def test_overlay_applies_cleanly_and_a_second_apply_is_a_no_op(
        kubeconfig: Path, overlay: str) -> None:
    before = generations(kubeconfig, overlay)
    out = kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=overlay)
    assert out.stderr == ""
    assert generations(kubeconfig, overlay) == before
    diff = in_sync(kubeconfig, overlay)
    assert diff.returncode == 0, diff.stdout + diff.stderr


def test_queues_wait_for_m2g_and_admit_once_its_check_is_active(
        kubeconfig: Path, overlay: str) -> None:
    set_check_active(kubeconfig, False)
    for name in QUEUES:
        wait_until(f"{name} to be Inactive (AdmissionCheckInactive)", lambda n=name: (
            (c := condition(cq(kubeconfig, n), "Active")) and c["status"] == "False"
            and c["reason"] == "AdmissionCheckInactive"), timeout=30)
    set_check_active(kubeconfig, True)
    for name in QUEUES:
        wait_until(f"{name} to be Active", lambda n=name: (
            (c := condition(cq(kubeconfig, n), "Active")) and c["status"] == "True"),
            timeout=30)


def test_a_tenant_job_waits_for_m2gs_answer(kubeconfig: Path, overlay: str) -> None:
    """Quota is reserved in flavor gb200 with a rack placement; Admitted only after m2g's
    check says Ready (the test writes the answer the controller would)."""
    set_check_active(kubeconfig, True)
    ns, name = "research", unique("gitops")
    kubectl(kubeconfig, "create", "-f", "-", stdin=json.dumps(job(name, ns)))
    try:
        def workload() -> dict[str, Any] | None:
            items = (get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n", ns) or {})["items"]
            mine = [w for w in items if any(o.get("name") == name for o in
                                            w["metadata"].get("ownerReferences", []))]
            return mine[0] if mine else None

        def reserved() -> dict[str, Any] | None:
            wl = workload()
            ok = wl and (c := condition(wl, "QuotaReserved")) and c["status"] == "True"
            return wl if ok else None

        def listed(wl: dict[str, Any]) -> dict[str, str]:
            return {c["name"]: c["state"] for c in wl["status"].get("admissionChecks", [])}

        def reserved_and_listed() -> dict[str, Any] | None:
            # Kueue's scheduler reserves quota; its workload controller lists the queue's
            # checks a moment later, so a read in between sees QuotaReserved with no checks.
            wl = reserved()
            return wl if wl and listed(wl) else None

        wl = wait_until("the workload to reserve quota and list m2g's check",
                        reserved_and_listed, timeout=60)
        assert wl["spec"]["priority"] == 5000
        assert wl["status"]["admission"]["clusterQueue"] == "research"
        (psa,) = wl["status"]["admission"]["podSetAssignments"]
        assert psa["flavors"]["nvidia.com/gpu"] == "gb200"
        assert psa["topologyAssignment"]
        assert listed(wl) == {CHECK: "Pending"}
        assert (condition(wl, "Admitted") or {}).get("status") != "True"

        entry = {"name": CHECK, "state": "Ready", "message": "e2e: m2g admits",
                 "lastTransitionTime": now()}
        kubectl(kubeconfig, "patch", f"workloads.kueue.x-k8s.io/{wl['metadata']['name']}",
                "-n", ns, "--type=merge", "--subresource=status",
                "-p", json.dumps({"status": {"admissionChecks": [entry]}}))
        wait_until("the workload to be Admitted", lambda: (
            (w := workload()) and (c := condition(w, "Admitted")) and c["status"] == "True"),
            timeout=60)
        wait_until("the Job to be unsuspended", lambda: get_json(
            kubeconfig, f"jobs.batch/{name}", "-n", ns)["spec"]["suspend"] is False,
            timeout=60)
    finally:
        kubectl(kubeconfig, "delete", f"jobs.batch/{name}", "-n", ns, "--ignore-not-found",
                "--cascade=background", "--wait=true", check=False)
        wait_until("the workload to go", lambda: not [
            w for w in (get_json(kubeconfig, "workloads.kueue.x-k8s.io", "-n", ns) or
                        {"items": []})["items"]
            if any(o.get("name") == name for o in w["metadata"].get("ownerReferences", []))],
            timeout=60)


def test_shadow_overlay_takes_the_check_out_and_the_overlay_puts_it_back(
        kubeconfig: Path, overlay: str) -> None:
    set_check_active(kubeconfig, False)  # as in shadow mode: nobody answers m2g-policy
    try:
        kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=render(SHADOW))
        for name in QUEUES:
            assert "admissionChecksStrategy" not in cq(kubeconfig, name)["spec"]
            wait_until(f"{name} to be Active without m2g", lambda n=name: (
                (c := condition(cq(kubeconfig, n), "Active")) and c["status"] == "True"),
                timeout=30)
    finally:
        kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=overlay)
    for name in QUEUES:
        strategy = cq(kubeconfig, name)["spec"]["admissionChecksStrategy"]
        assert strategy == {"admissionChecks": [{"name": CHECK}]}
    assert in_sync(kubeconfig, overlay).returncode == 0


def test_a_quota_m2g_derated_is_not_silently_reverted(kubeconfig: Path, overlay: str) -> None:
    """m2g writes nominalQuota with a merge patch of spec.resourceGroups (an atomic list) under
    field manager m2g; a plain re-apply then reports the conflict instead of undoing m2g, and
    --force-conflicts (what a GitOps tool does on a forced sync) restores the base quota."""
    live = cq(kubeconfig, "research")
    groups = live["spec"]["resourceGroups"]
    gpu = next(r for r in groups[0]["flavors"][0]["resources"] if r["name"] == "nvidia.com/gpu")
    base = gpu["nominalQuota"]
    gpu["nominalQuota"] = "36"
    patch = {"metadata": {"annotations": {"m2g.io/base-quota.gb200": base,
                                          "m2g.io/quota-set.gb200": "36"}},
             "spec": {"resourceGroups": groups}}
    kubectl(kubeconfig, "patch", "clusterqueues.kueue.x-k8s.io/research", "--type=merge",
            "--field-manager=m2g", "-p", json.dumps(patch))
    try:
        out = kubectl(kubeconfig, "apply", "--server-side", "-f", "-", stdin=overlay,
                      check=False)
        assert out.returncode != 0
        assert 'conflict with "m2g"' in out.stderr and ".spec.resourceGroups" in out.stderr
        assert _gpu_quota(cq(kubeconfig, "research")) == "36"
    finally:
        kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", "-",
                stdin=overlay)
    live = cq(kubeconfig, "research")
    assert _gpu_quota(live) == base
    # The live quota is no longer the one m2g wrote: m2g takes Git's value as the base, with no
    # annotation to remove by hand (a changed base in Git works the same way).
    gpu_quota = next(q for q in cluster_queue(live).quotas if q.flavor == "gb200")
    assert gpu_quota.base == int(base)
    kubectl(kubeconfig, "annotate", "clusterqueues.kueue.x-k8s.io/research",
            "m2g.io/base-quota.gb200-", "m2g.io/quota-set.gb200-")


def _gpu_quota(obj: dict[str, Any]) -> str:
    for group in obj["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for res in flavor["resources"]:
                if res["name"] == "nvidia.com/gpu":
                    return str(res["nominalQuota"])
    raise AssertionError("no GPU quota")


def test_every_object_is_served_as_rendered(kubeconfig: Path, overlay: str) -> None:
    kinds = {o["kind"] for o in objects(overlay)}
    assert kinds == {"Namespace", "AdmissionCheck", "ClusterQueue", "Cohort", "LocalQueue",
                     "ResourceFlavor", "Topology", "WorkloadPriorityClass"}
