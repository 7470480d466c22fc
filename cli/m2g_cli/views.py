"""Pure renderers for the operator commands: data in, text out (kubectl-style tables, YAML, JSON).

No I/O and no cluster here, so every command's output has golden tests (tests/unit/golden/).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import yaml

from m2g.k8s.parse import parse_time
from m2g.model.cluster import ClusterSnapshot, Phase, QueueState, WorkloadState
from m2g.model.factory import FactorySnapshot, Node, Reading, site_view
from m2g.model.labels import GPU_RESOURCE
from m2g.planner.admission import check_state, message
from m2g.planner.explain import Explanation
from m2g.policy import Decision
from m2g.policy.results import AdmissionResult
from m2g_cli.blockers import Blocker


class Output(StrEnum):
    """-o formats, as kubectl has them."""

    TABLE = "table"
    WIDE = "wide"
    YAML = "yaml"
    JSON = "json"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], no_headers: bool = False
          ) -> str:
    """Left-aligned columns separated by three spaces, like kubectl get (``no_headers``: the
    header line left out, the columns as wide as with it)."""
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=False)]
    lines = ["   ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()
             for r in ([] if no_headers else [headers]) + list(rows)]
    return "\n".join(lines) + "\n"


def as_list(items: Iterable[Any]) -> dict[str, Any]:
    """The items as kubectl prints a list with -o json|yaml: a ``v1`` ``List``."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


class SortKeyError(ValueError):
    """A ``--sort-by`` that is not a field path, or names no field of the items."""


@dataclass(frozen=True)
class Listing:
    """kubectl's list habits: ``--no-headers`` (tables) and ``--sort-by`` (a field of the
    items as ``-o json`` prints them: ``.name``, ``{.gpus}``; every output format)."""

    no_headers: bool = False
    sort_by: str | None = None


_FIELD_PATH = re.compile(r"^\{?((?:\.[A-Za-z0-9_-]+)+)\}?$")


def sort_path(expr: str) -> tuple[str, ...]:
    """``.a.b`` or ``{.a.b}`` (kubectl's JSONPath for --sort-by, fields only) as its parts."""
    m = _FIELD_PATH.match(expr.strip())
    if m is None or expr.strip().startswith("{") != expr.strip().endswith("}"):
        raise SortKeyError(f"--sort-by {expr!r}: not a field path such as .name or {{.gpus}}")
    return tuple(m.group(1).split(".")[1:])


def _lookup(item: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for part in path:
        if not isinstance(item, Mapping) or part not in item:
            return False, None
        item = item[part]
    return True, item


def sort_items(items: list[dict[str, Any]], expr: str | None) -> list[dict[str, Any]]:
    """``items`` sorted by the field ``expr`` names (None: as they are): numbers by value,
    then text, empty values last; the order of equal ones kept. Raises SortKeyError when no
    item has the field."""
    if not expr:
        return items
    path = sort_path(expr)
    found = [_lookup(i, path) for i in items]
    if items and not any(ok for ok, _ in found):
        fields = ", ".join(f".{k}" for k in items[0])
        raise SortKeyError(f"--sort-by {expr!r}: no such field in these items (fields: "
                           f"{fields})")

    def key(pair: tuple[tuple[bool, Any], dict[str, Any]]) -> tuple[int, float, str]:
        v = pair[0][1]
        if isinstance(v, bool | int | float) and v == v:
            return (0, float(v), "")
        if v is None or v == "" or isinstance(v, float):
            return (2, 0.0, "")
        return (1, 0.0, v if isinstance(v, str) else json.dumps(v, sort_keys=True))
    return [i for _, i in sorted(zip(found, items, strict=True), key=key)]


def sort_lists(lists: Sequence[list[dict[str, Any]]], expr: str | None
               ) -> list[list[dict[str, Any]]]:
    """Each of ``lists`` sorted as sort_items sorts it (a command that prints several
    tables: ``m2g status``); SortKeyError only when none of them has the field."""
    out, errors = [], []
    for items in lists:
        try:
            out.append(sort_items(items, expr))
        except SortKeyError as exc:
            out.append(items)
            errors.append(exc)
    if errors and len(errors) == sum(bool(items) for items in lists):
        raise SortKeyError(str(errors[0]).split(" (fields:")[0] + " (fields: " + ", ".join(
            dict.fromkeys(f".{k}" for items in lists for k in (items[0] if items else {})))
            + ")")
    return out


def structured(data: Any, out: Output) -> str:
    if out is Output.JSON:
        return json.dumps(data, indent=2, sort_keys=False, default=str) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def _age(seconds: float) -> str:
    if seconds != seconds or seconds == float("inf"):
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def _since(now: datetime, then: datetime | None) -> str:
    return "-" if then is None else _age((now - then).total_seconds())


# ---- queues ------------------------------------------------------------------------------

def queue_rows(snap: ClusterSnapshot) -> list[dict[str, Any]]:
    out = []
    for q in snap.queues:
        for x in q.quotas:
            if x.resource != GPU_RESOURCE:
                continue
            out.append({"clusterQueue": q.name, "cohort": q.cohort, "flavor": x.flavor,
                        "nominalGpus": x.nominal, "baseGpus": x.base,
                        "derated": x.nominal < x.base, "usedGpus": q.used_gpus,
                        "pendingWorkloads": q.pending_workloads, "stopPolicy": q.stop_policy,
                        "weight": q.weight})
    return out


def queue_cells(rows: Sequence[Mapping[str, Any]], wide: bool, event_note: str = ""
                ) -> tuple[list[str], list[list[str]]]:
    """The table's header and cells of ``rows`` (-o table, or -o wide); ``event_note``: what
    -o wide's NOTE says of an active grid event ("" none)."""
    head = ["CLUSTERQUEUE", "FLAVOR", "GPUS", "USED", "PENDING", "STOP"]
    if wide:
        head += ["COHORT", "WEIGHT", "NOTE"]
    body = []
    for r in rows:
        pct = f" ({100 * r['nominalGpus'] // r['baseGpus']}%)" if r["derated"] and r[
            "baseGpus"] else ""
        row = [r["clusterQueue"], r["flavor"], f"{r['nominalGpus']}/{r['baseGpus']}{pct}",
               str(r["usedGpus"]), str(r["pendingWorkloads"]), r["stopPolicy"]]
        if wide:
            note = "; ".join(n for n in ("derated by m2g" if r["derated"] else "", event_note)
                             if n)
            weight = "-" if r["weight"] is None else f"{r['weight']:g}"
            row += [r["cohort"] or "-", weight, note or "-"]
        body.append(row)
    return head, body


def event_note(snap: ClusterSnapshot) -> str:
    """-o wide's NOTE for the grid event in force ("" none)."""
    event = snap.factory.grid_event()
    return f"grid event {event.id} active" if event is not None and event.active(snap.now) \
        else ""


def render_queues(snap: ClusterSnapshot, out: Output, listing: Listing = Listing()) -> str:
    rows = sort_items(queue_rows(snap), listing.sort_by)
    if out in (Output.YAML, Output.JSON):
        return structured(as_list(rows), out)
    head, body = queue_cells(rows, out is Output.WIDE, event_note(snap))
    return table(head, body, listing.no_headers) if body else \
        "No ClusterQueues with GPU quota found.\n"


# ---- workloads ---------------------------------------------------------------------------

def job_of(raw: Mapping[str, Any] | None) -> str:
    """The name of the object the Workload belongs to (its Job, JobSet, ...): the controller
    owner reference, else the first one; "" for none."""
    refs = [r for r in ((raw or {}).get("metadata") or {}).get("ownerReferences") or []
            if isinstance(r, Mapping) and r.get("name")]
    refs.sort(key=lambda r: r.get("controller") is not True)
    return str(refs[0]["name"]) if refs else ""


def workload_row(w: WorkloadState, now: datetime, raw: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
    """One Workload as -o json prints it; ``raw``: the Workload object, for its Job, its
    ``spec.active`` and its age (without it: no Job, active unless Inactive, no age)."""
    v = w.view
    spec = (raw or {}).get("spec") or {}
    created = parse_time(((raw or {}).get("metadata") or {}).get("creationTimestamp"))
    return {"namespace": w.namespace, "name": w.name, "job": job_of(raw), "queue": v.queue,
            "clusterQueue": w.cluster_queue, "phase": w.phase.value,
            "active": spec["active"] is not False if "active" in spec
            else w.phase is not Phase.INACTIVE,
            "m2gCheck": w.check_state.value if w.check_state else "",
            "message": w.check_message, "gpus": v.gpus, "flexTier": v.flex_tier,
            "kind": v.kind.value, "waitSeconds": w.wait_seconds(now),
            "ageSeconds": None if created is None else (now - created).total_seconds(),
            "shedByM2g": w.shed_by_m2g}


@dataclass(frozen=True)
class WorkloadFilter:
    """Which workloads a listing shows: ``labels``, a label selector's matcher
    (m2g_cli.selectors) over the workload's labels (its own and its pod templates', as m2g
    reads them); ``keys``, only these NS/NAMEs (what the API server answered to a field
    selector)."""

    namespace: str | None = None
    queue: str | None = None
    labels: Callable[[Mapping[str, str]], bool] | None = None
    keys: set[str] | None = None


def workload_rows(snap: ClusterSnapshot, chosen: WorkloadFilter, sort_by: str | None = None,
                  raws: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The -o json items of the workloads ``chosen`` selects; ``raws``: the Workload objects by
    NS/NAME (JOB, ACTIVE, AGE)."""
    picked = [w for w in snap.workloads
              if (chosen.namespace is None or w.namespace == chosen.namespace)
              and (chosen.queue is None or chosen.queue in (w.view.queue, w.cluster_queue))
              and (chosen.labels is None or chosen.labels(w.view.labels))
              and (chosen.keys is None or f"{w.namespace}/{w.name}" in chosen.keys)]
    return sort_items([workload_row(w, snap.now, (raws or {}).get(f"{w.namespace}/{w.name}"))
                       for w in picked], sort_by)


def workload_cells(rows: Sequence[Mapping[str, Any]], wide: bool, all_namespaces: bool = True
                   ) -> tuple[list[str], list[list[str]]]:
    """The table's header and cells of ``rows`` (-o table, or -o wide); the NAMESPACE column
    only when ``all_namespaces`` (-A), as kubectl prints it."""
    # AGE last: its width varies (9s .. 119s) and nothing after it moves with it
    head = ["NAMESPACE"] if all_namespaces else []
    head += ["NAME", "JOB", "QUEUE", "CLUSTERQUEUE", "PHASE", "M2G", "GPUS", "FLEX", "WAIT"]
    if wide:
        head += ["ACTIVE", "KIND", "MESSAGE"]
    head.append("AGE")
    body = []
    for r in rows:
        check = r["m2gCheck"] or "-"
        if r["shedByM2g"]:
            check = "Shed"
        age = "-" if r["ageSeconds"] is None else _age(r["ageSeconds"])
        row = [r["namespace"]] if all_namespaces else []
        row += [r["name"], r["job"] or "-", r["queue"] or "-",
               r["clusterQueue"] or "-", r["phase"], check, str(r["gpus"]),
               str(r["flexTier"]), _age(r["waitSeconds"])]
        if wide:
            row += [str(r["active"]).lower(), r["kind"] or "-", r["message"] or "-"]
        row.append(age)
        body.append(row)
    return head, body


def render_workloads(snap: ClusterSnapshot, out: Output, namespace: str | None = None,
                     queue: str | None = None,
                     labels: Callable[[Mapping[str, str]], bool] | None = None,
                     listing: Listing = Listing(), keys: set[str] | None = None,
                     raws: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """``m2g workloads`` in ``out`` (see WorkloadFilter for the selection; ``namespace`` None
    is every namespace, -A, whose table has the NAMESPACE column)."""
    rows = workload_rows(snap, WorkloadFilter(namespace, queue, labels, keys), listing.sort_by,
                         raws)
    if out in (Output.YAML, Output.JSON):
        return structured(as_list(rows), out)
    head, body = workload_cells(rows, out is Output.WIDE, all_namespaces=namespace is None)
    return table(head, body, listing.no_headers) if body else "No workloads found.\n"


# ---- signals -----------------------------------------------------------------------------

def _kw(r: Reading) -> str:
    return "stale" if r.stale or r.value is None else f"{r.value:.1f}"


def _held(nodes: list[Node]) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in nodes:
        for key, _ in n.m2g_taints:
            kind = key.removeprefix("m2g.io/")
            out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items()))


def signal_data(f: FactorySnapshot) -> dict[str, Any]:
    site = site_view(f)
    draw = f.site_draw_kw()
    event = f.grid_event()
    return {
        "site": {"name": f.site, "drawKw": None if draw.stale else draw.value,
                 "budgetKw": f.site_budget_kw, "limitKw": f.effective_budget_kw(),
                 "maxInletC": site.thermal.max_inlet_c, "limitC": site.thermal.limit_c},
        "racks": [{"name": r.name, "powerDomain": r.power_domain, "block": r.block,
                   "drawKw": None if r.power_kw.stale else r.power_kw.value, "capKw": r.cap_kw,
                   "powerAgeSeconds": r.power_kw.age_seconds,
                   "inletC": None if r.inlet_c.stale else r.inlet_c.value, "limitC": r.limit_c,
                   "alarm": r.thermal_alarm,
                   "healthyGpus": sum(n.healthy_gpus for n in f.nodes_of(r.name)),
                   "totalGpus": sum(n.gpus for n in f.nodes_of(r.name)),
                   "unhealthyNodes": sorted(n.name for n in f.nodes_of(r.name) if n.reasons),
                   # nodes m2g itself tainted, by why (maintenance, thermal): held, not unhealthy
                   "heldNodes": _held(f.nodes_of(r.name))}
                  for r in f.racks],
        "gridEvent": None if event is None else {
            "id": event.id, "active": event.active(f.now), "start": event.start.isoformat(),
            "end": event.end.isoformat(), "targetKw": event.target(), "level": event.level},
        "maintenance": [{"name": w.name, "start": w.start.isoformat(), "end": w.end.isoformat(),
                         "racks": list(w.racks), "nodes": list(w.nodes)}
                        for w in f.maintenance if w.end > f.now],
    }


def render_signals(f: FactorySnapshot, out: Output, listing: Listing = Listing()) -> str:
    """``m2g signals``: the site, the grid event, maintenance, then a row per rack
    (``listing``: --sort-by a field of the ``racks`` items, --no-headers for their table)."""
    data = signal_data(f)
    data["racks"] = sort_items(data["racks"], listing.sort_by)
    if out in (Output.YAML, Output.JSON):
        return structured(data, out)
    s = data["site"]
    # a reading m2g does not have is said, not shown as 0 (no budget: 0 in the data)
    draw = "stale" if s["drawKw"] is None else f"{s['drawKw']:.1f} kW"
    budget = f"{s['budgetKw']:g} kW" if s["budgetKw"] else "none"
    limit = f"{s['limitKw']:g} kW" if s["limitKw"] else "none"
    inlet = (f"hottest inlet {s['maxInletC']:.1f} °C"
             if any(r["inletC"] is not None for r in data["racks"]) else "no inlet readings")
    lines = [f"Site {s['name']}: draw {draw}, budget {budget}, limit in force {limit}; {inlet}"]
    ev = data["gridEvent"]
    if ev:
        state = "ACTIVE" if ev["active"] else "upcoming"
        target = f"target {ev['targetKw']:g} kW" if ev["targetKw"] else "no kW target"
        lines.append(f"Grid event {ev['id']} ({state}): {ev['start']} → {ev['end']}, "
                     f"{target}, level {ev['level']}")
    for w in data["maintenance"]:
        lines.append(f"Maintenance {w['name']}: {w['start']} → {w['end']} "
                     f"on {', '.join(w['racks'] + w['nodes']) or '-'}")
    head = ["RACK", "DOMAIN", "KW", "CAP", "INLET", "LIMIT", "GPUS", "AGE"]
    if out is Output.WIDE:
        head += ["BLOCK", "UNHEALTHY", "HELD"]
    body = []
    racks = {rack.name: rack for rack in f.racks}
    for r in data["racks"]:
        rack = racks[r["name"]]
        inlet = "stale" if r["inletC"] is None else f"{r['inletC']:.1f}"
        if r["alarm"]:
            inlet += " ALARM"
        row = [r["name"], r["powerDomain"] or "-", _kw(rack.power_kw), f"{r['capKw']:g}",
               inlet, f"{r['limitC']:g}", f"{r['healthyGpus']}/{r['totalGpus']}",
               _age(r["powerAgeSeconds"])]
        if out is Output.WIDE:
            row += [r["block"] or "-", ",".join(r["unhealthyNodes"]) or "-",
                    ",".join(f"{k}:{v}" for k, v in r["heldNodes"].items()) or "-"]
        body.append(row)
    return "\n".join(lines) + "\n\n" + (table(head, body, listing.no_headers) if body
                                         else "No racks found.\n")


# ---- explain -----------------------------------------------------------------------------

# A Workload's conditions in the order of its life (Kueue stores them in the order it happened
# to set them, which varies from run to run); other types follow by name.
_LIFECYCLE = ("QuotaReserved", "Admitted", "PodsReady", "Evicted", "Preempted", "Requeued",
              "Deactivated", "Finished")


def _in_lifecycle_order(conditions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(c: dict[str, Any]) -> tuple[int, str]:
        kind = str(c.get("type", ""))
        return (_LIFECYCLE.index(kind) if kind in _LIFECYCLE else len(_LIFECYCLE), kind)
    return sorted(conditions, key=key)


def explanation_data(ex: Explanation, conditions: Sequence[dict[str, Any]] = (),
                     blockers: Sequence[Blocker] = ()) -> dict[str, Any]:
    conditions = _in_lifecycle_order(conditions)
    w = ex.workload
    return {"workload": f"{w.namespace}/{w.name}", "phase": w.phase.value,
            "blockers": [b.to_json() for b in blockers],
            "m2gCheck": w.check_state.value if w.check_state else None,
            "decisionNow": ex.now.to_json(),
            "kueueConditions": [{k: c.get(k) for k in ("type", "status", "reason", "message")}
                                for c in conditions],
            "whatWouldChangeIt": [{"change": a.change, "decision": a.result.decision.value,
                                   "requeueAfterSeconds": a.result.requeue_after_seconds}
                                  for a in ex.alternatives]}


def render_explanation(ex: Explanation, out: Output, conditions: Sequence[dict[str, Any]] = (),
                       blockers: Sequence[Blocker] = ()) -> str:
    data = explanation_data(ex, conditions, blockers)
    if out in (Output.YAML, Output.JSON):
        return structured(data, out)
    w = ex.workload
    lines = [f"Workload {w.namespace}/{w.name}: {w.phase.value}"
             + (f", m2g check {w.check_state.value}" if w.check_state else "")
             + (" (shed by m2g)" if w.shed_by_m2g else ""),
             *_decision_lines(ex.now, again=w.phase is Phase.ADMITTED)]
    if conditions:
        lines.append("Kueue:")
        for c in _in_lifecycle_order(conditions):
            lines.append(f"  {c.get('type')}={c.get('status')} {c.get('reason', '')}: "
                         f"{c.get('message', '')}".rstrip(": "))
    if blockers:
        lines.append("In the way, and what fixes it:")
        for b in blockers:
            lines += [f"  - {b.what}", f"    fix: {b.fix}"]
    if w.phase is Phase.ADMITTED and not ex.alternatives:
        lines.append("It is admitted; nothing m2g decides stands in its way.")
    elif ex.alternatives or not blockers:
        lines += _alternative_lines(ex)
    return "\n".join(lines) + "\n"


def _decision_lines(now: AdmissionResult, again: bool = False) -> list[str]:
    """``again``: the workload runs, so the decision is for the same request arriving now
    (its own GPUs and kW count as in use)."""
    when = "now, were it submitted again" if again else "now"
    lines = [f"m2g would decide {when}: {now.decision.value}"
             + (f" (retry in {now.requeue_after_seconds}s)" if now.requeue_after_seconds else "")]
    for r in now.reasons:
        lines.append(f"  {r.decision:6} {r.policy}/{r.rule}: {r.message}")
    if now.placement is not None and now.placement.topology_level:
        lines.append(f"  placement: {now.placement.topology_level}")
    return lines


def _alternative_lines(ex: Explanation) -> list[str]:
    if not ex.alternatives:
        return ["No single change m2g can evaluate would change the outcome."]
    return ["What would change the outcome:",
            *(f"  - {a.change}: {a.result.decision.value}" for a in ex.alternatives)]


# ---- submit --dry-run --------------------------------------------------------------------

def render_preview(ex: Explanation | None, notes: Sequence[str] = ()) -> str:
    """What ``m2g submit --dry-run`` says after the manifests: the AdmissionCheck answer m2g
    would give the workload now (``ex`` None: not evaluated; ``notes`` say why or what was
    assumed). Written to stderr, so the manifests on stdout stay a clean document."""
    lines = [f"note: {n}" for n in notes]
    if ex is not None:
        now = ex.now
        lines += [f"m2g would decide now: {now.decision.value} → AdmissionCheck "
                  f"{check_state(now.decision).value}", f"  {message(now)}"]
        if now.placement is not None and now.placement.topology_level:
            lines.append(f"  placement: {now.placement.topology_level}")
        if now.decision is not Decision.ADMIT:  # what would admit it
            lines += _alternative_lines(ex)
    return "".join(f"{line}\n" for line in lines)


def queue_by_name(snap: ClusterSnapshot, name: str) -> QueueState | None:
    return next((q for q in snap.queues if q.name == name), None)
