"""``m2g status``: is m2g in charge — who leads (and since when the Lease was renewed), which
policy objects are in force, whether each of m2g's AdmissionChecks is Active, how old the
power readings are, which objects m2g leaves out and which it uses while ignoring an invalid
part of them (``ignored``: e.g. a ClusterQueue's ``m2g.io/min-flex-tier`` that is not 0-3).
Read-only; the same listing as
``m2g queues``/``explain`` plus the Lease.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from m2g.k8s.parse import parse_time
from m2g.model.cluster import CHECK_CONTROLLER, ClusterSnapshot
from m2g_cli.ops_cmd import (
    READINGS_EVERY,
    NoHeaders,
    SortBy,
    Watched,
    WatchOne,
    listing,
    rendered,
)
from m2g_cli.views import Listing, Output, sort_lists, structured, table

if TYPE_CHECKING:
    from m2g_cli.cluster import ClusterView


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == kind:
            return c
    return {}


def leader_data(lease: dict[str, Any] | None, namespace: str, name: str, now: datetime
                ) -> dict[str, Any]:
    """Who holds the Lease, how long since it was renewed, and whether that is within its
    duration (else nobody leads: no decisions are being written)."""
    if lease is None:
        return {"lease": f"{namespace}/{name}", "holder": None, "state": "NoLease"}
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    age = (now - renewed).total_seconds() if renewed else None
    duration = float(spec.get("leaseDurationSeconds") or 15)
    holder = spec.get("holderIdentity") or None
    state = "Leading" if holder and age is not None and age <= duration else "Expired"
    return {"lease": f"{namespace}/{name}", "holder": holder, "state": state,
            "renewedSecondsAgo": None if age is None else round(age, 1),
            "leaseDurationSeconds": duration}


def lease_expiry(lease: Mapping[str, Any] | None) -> list[datetime]:
    """When a held Lease expires unless it is renewed: its state then turns Expired by the
    clock alone (no object changes when the leader dies)."""
    spec = (lease or {}).get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    if not spec.get("holderIdentity") or renewed is None:
        return []
    try:
        return [renewed + timedelta(seconds=float(spec.get("leaseDurationSeconds") or 15))]
    except (TypeError, ValueError, OverflowError):
        return []


def policy_rows(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for p in policies:
        meta = p.get("metadata") or {}
        ready, accepted = _condition(p, "Ready"), _condition(p, "Accepted")
        rows.append({"name": meta.get("name"), "stage": (p.get("spec") or {}).get("stage"),
                     "accepted": accepted.get("status", "Unknown"),
                     "ready": ready.get("status", "Unknown"),
                     "reason": ready.get("reason") or accepted.get("reason") or "",
                     "message": ready.get("message") or accepted.get("message") or ""})
    return rows


def check_rows(checks: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, ac in sorted(checks.items()):
        if (ac.get("spec") or {}).get("controllerName") != CHECK_CONTROLLER:
            continue
        active = _condition(ac, "Active")
        rows.append({"name": (ac.get("metadata") or {}).get("name", name),
                     "active": active.get("status", "Unknown"),
                     "reason": active.get("reason", ""), "message": active.get("message", "")})
    return rows


def signal_data(snap: ClusterSnapshot) -> dict[str, Any]:
    racks = snap.factory.racks
    fresh = [r for r in racks if not r.power_kw.stale]
    ages = [r.power_kw.age_seconds for r in fresh]
    draw = snap.factory.site_draw_kw()
    return {"siteDrawKw": None if draw.stale else draw.value,
            "racksWithFreshPower": len(fresh), "racks": len(racks),
            "oldestFreshPowerSeconds": round(max(ages), 1) if ages else None}


def status_data(snap: ClusterSnapshot, policies: list[dict[str, Any]],
                checks: Mapping[str, Mapping[str, Any]], lease: dict[str, Any] | None,
                lease_at: tuple[str, str]) -> dict[str, Any]:
    return {"leader": leader_data(lease, *lease_at, snap.now),
            "policies": policy_rows(policies), "admissionChecks": check_rows(checks),
            "signals": signal_data(snap),
            "leftOut": [{"kind": r.kind, "name": r.name, "reason": r.reason}
                        for r in snap.rejected if not r.part],
            "ignored": [{"kind": r.kind, "name": r.name, "part": r.part, "reason": r.reason}
                        for r in snap.rejected if r.part]}


def render_status(data: dict[str, Any], out: Output, how: Listing | None = None) -> str:
    """``how``: --sort-by a field of the ``policies`` or ``admissionChecks`` items (each list
    that has it is sorted), --no-headers for both tables."""
    how = how or Listing()
    policies, checks = sort_lists([data["policies"], data["admissionChecks"]], how.sort_by)
    data = {**data, "policies": policies, "admissionChecks": checks}
    if out in (Output.YAML, Output.JSON):
        return structured(data, out)
    lead = data["leader"]
    lines = [f"Leader:    {lead['holder'] or '-'} ({lead['state']}, Lease {lead['lease']}"
             + (f", renewed {lead['renewedSecondsAgo']:g}s ago" if lead.get(
                 "renewedSecondsAgo") is not None else "") + ")"]
    sig = data["signals"]
    draw = "stale" if sig["siteDrawKw"] is None else f"{sig['siteDrawKw']:.1f} kW"
    oldest = sig["oldestFreshPowerSeconds"]
    lines.append(f"Power:     site {draw}; {sig['racksWithFreshPower']}/{sig['racks']} racks "
                 "fresh" + ("" if oldest is None else f", oldest {oldest:g}s"))
    pol = data["policies"]
    ready = sum(p["ready"] == "True" for p in pol)
    lines.append(f"Policies:  {ready}/{len(pol)} in force")
    lines.append(f"Left out:  {len(data['leftOut'])}")
    lines.append(f"Ignored:   {len(data['ignored'])} (invalid parts of objects still in use)")
    out_text = "\n".join(lines) + "\n"
    checks = data["admissionChecks"]
    out_text += "\n" + (table(["ADMISSIONCHECK", "ACTIVE", "REASON"], [
        [c["name"], c["active"], c["reason"] or "-"] for c in checks], how.no_headers)
        if checks else "No AdmissionCheck with controllerName m2g.io/policy.\n")
    bad = [p for p in pol if p["ready"] != "True"]
    if bad or out is Output.WIDE:
        rows = pol if out is Output.WIDE else bad
        out_text += "\n" + table(["POLICY", "STAGE", "READY", "REASON", "MESSAGE"], [
            [p["name"], p["stage"] or "-", p["ready"], p["reason"] or "-",
             (p["message"] or "-")[:100]] for p in rows], how.no_headers)
    for r in data["leftOut"]:
        out_text += f"left out {r['kind']} {r['name']}: {r['reason']}\n"
    for r in data["ignored"]:
        out_text += f"ignored the {r['part']} of {r['kind']} {r['name']}: {r['reason']}\n"
    return out_text


def status(
    lease_namespace: Annotated[str | None, typer.Option(
        "--lease-namespace", help="Namespace of m2g's Lease (default: the site config's, "
        "$POD_NAMESPACE, else m2g-system)")] = None,
    lease_name: Annotated[str | None, typer.Option(
        "--lease-name", help="Name of m2g's Lease (default: the site config's, m2g-controller)")
    ] = None,
    kubeconfig: Annotated[str | None, typer.Option("--kubeconfig",
                                                   help="Path to a kubeconfig")] = None,
    context: Annotated[str | None, typer.Option("--context",
                                                help="Kubeconfig context to use")] = None,
    prometheus: Annotated[str | None, typer.Option(
        "--prometheus", envvar="M2G_PROMETHEUS_URL", help="Prometheus URL for power")] = None,
    output: Annotated[Output, typer.Option("--output", "-o",
                                           help="table | wide | yaml | json")] = Output.TABLE,
    no_headers: NoHeaders = False, sort_by: SortBy = None, watch: WatchOne = False,
) -> None:
    """Is m2g in charge: the leader, the policies in force, its AdmissionChecks, signal ages."""
    from m2g.config import SiteConfig
    from m2g_cli import names
    from m2g_cli.cluster import site_config
    from m2g_cli.ops_cmd import _view, _watch

    names.check(lease_namespace, "--lease-namespace", namespace=True)  # before any request
    names.check(lease_name, "--lease-name")
    how = listing(no_headers, sort_by)
    site = site_config() or SiteConfig()
    at = (lease_namespace or site.lease_namespace(dict(os.environ)),
          lease_name or site.leader_election.lease_name)
    view = _view(kubeconfig, context, prometheus, lease=at)
    if watch:
        _watch(kubeconfig, context, status_watched(at, how), output, view,
               prometheus=prometheus, lease=at)
        return
    data = status_data(view.snapshot, view.policies, view.objects.admission_checks,
                       view.lease, at)
    rendered(lambda: render_status(data, output, how))


def status_watched(at: tuple[str, str], how: Listing) -> Watched:
    """``m2g status -w``: the Lease (by name), the Policies and AdmissionChecks, and what m2g
    may leave out or counts as racks (Nodes, Workloads, m2g's CRDs); again when the Lease
    expires by the clock and every READINGS_EVERY seconds (the power readings)."""
    from m2g.k8s import client as k

    def data(view: ClusterView) -> dict[str, Any]:
        return status_data(view.snapshot, view.policies, view.objects.admission_checks,
                           view.lease, at)

    return Watched(
        "status", ((k.LEASES, at[0], f"metadata.name={at[1]}"), (k.POLICIES, None, None),
                   (k.ADMISSION_CHECKS, None, None), (k.NODES, None, None),
                   (k.WORKLOADS, None, None), (k.POWER_DOMAINS, None, None),
                   (k.GRID_EVENTS, None, None), (k.MAINTENANCE_WINDOWS, None, None)),
        lambda _item: "status", lambda view: [data(view)], None,
        lambda view, out: render_status(data(view), out, how),
        moments=lambda view: lease_expiry(view.lease), every=READINGS_EVERY, single=True)
