"""Node levers: m2g's own NoSchedule taints, and draining a maintenance window's nodes on time.

Kueue's topology-aware scheduling picks nodes when it reserves quota, before m2g's admission
check runs, so an admission check cannot steer a TAS flavor; a taint can (Kueue TAS and
kube-scheduler both skip nodes with a NoSchedule taint the pods do not tolerate;
docs/controllers.md). m2g taints:

* ``m2g.io/maintenance=<window>``: the nodes a MaintenanceWindow covers, from
  ``maintenance_taint_lead_seconds`` before it starts until it ends;
* ``m2g.io/thermal=<rack>``: the nodes of a rack in thermal alarm (``rack_alarm``), until the
  alarm bit is clear and a fresh inlet reading is ``thermal_clear_margin_c`` under the limit
  (no telemetry at all: clear; a stale reading keeps the taint).

It removes only taints under its own keys. A NoSchedule taint leaves running pods alone, so
``drain_actions`` evicts, through Kueue (deactivation, as shedding does), the admitted
workloads with pods on a window's nodes that would not finish before it starts: from the
window's drain lead time on, paced by the shedding ramp, freshest checkpoint first, and all
that remain in the last ``drain_deadline_seconds``. A drained workload is reactivated once
``min_shed_seconds`` have passed and its pods are gone; Kueue requeues it, TAS places it off the
tainted nodes and m2g's admission check decides it again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from m2g.model.cluster import Phase, WorkloadState
from m2g.model.factory import MaintenanceWindow, Node, Rack, rack_alarm
from m2g.model.labels import M2G_TAINT_PREFIX, TAINT_MAINTENANCE, TAINT_THERMAL
from m2g.model.plan import NodeTaintUpdate, ShedAction, TaintEffect
from m2g.planner.config import PlannerConfig
from m2g.planner.inputs import InputBuilder
from m2g.planner.shedding import last_action, workload_kw

MAX_TAINT_VALUE = 63  # a taint value is a label value


def taint_value(text: str) -> str:
    """``text`` as a valid taint value: at most 63 characters of [A-Za-z0-9._-], alphanumeric
    at both ends."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "-" for c in text)
    return cleaned[:MAX_TAINT_VALUE].strip("._-")


def _window_of(snap_now: datetime, node: Node, windows: Iterable[MaintenanceWindow],
               lead: Callable[[MaintenanceWindow], float]) -> MaintenanceWindow | None:
    """The earliest window covering ``node`` that is active or starts within its ``lead``."""
    hits = [w for w in windows if w.covers(node) and w.end > snap_now
            and w.start - timedelta(seconds=lead(w)) <= snap_now]
    return _earliest(hits)


def _earliest(windows: Iterable[MaintenanceWindow]) -> MaintenanceWindow | None:
    return min(windows, key=lambda w: (w.start, w.name), default=None)


def _thermal_clear(rack: Rack | None, config: PlannerConfig) -> bool:
    """May a thermal taint go? Alarm bit clear and the inlet fresh and under the margin (or no
    thermal telemetry at all); a stale reading keeps the taint."""
    if rack is None:
        return True
    if rack.thermal_alarm:
        return False
    if rack.inlet_c.missing:
        return True
    if rack.inlet_c.stale or rack.inlet_c.value is None:
        return False
    return rack.limit_c <= 0 or rack.inlet_c.value < rack.limit_c - config.thermal_clear_margin_c


def taint_updates(builder: InputBuilder, config: PlannerConfig) -> list[NodeTaintUpdate]:
    """Add, change or remove m2g's maintenance and thermal taints, node by node."""
    factory = builder.snap.factory
    now = factory.now
    racks = {r.name: r for r in factory.racks}
    out: list[NodeTaintUpdate] = []
    for node in factory.nodes:
        current = dict(node.m2g_taints)
        window = _window_of(now, node, factory.maintenance,
                            lambda _: config.maintenance_taint_lead_seconds)
        want: dict[str, tuple[str, str]] = {}
        if window is not None:
            when = "under way" if window.start <= now else \
                f"starts at {window.start:%Y-%m-%d %H:%M:%S}Z"
            want[TAINT_MAINTENANCE] = (taint_value(window.name),
                                       f"maintenance window {window.name} {when}")
        rack = racks.get(node.rack)
        if rack is not None and rack_alarm(rack):
            inlet = rack.inlet_c.value
            want[TAINT_THERMAL] = (taint_value(rack.name), f"rack {rack.name} in thermal alarm"
                                   + (f" (inlet {inlet:.1f} °C, limit {rack.limit_c:.1f} °C)"
                                      if inlet is not None and not rack.inlet_c.stale else ""))
        elif TAINT_THERMAL in current and not _thermal_clear(rack, config):
            want[TAINT_THERMAL] = (current[TAINT_THERMAL], "")  # hysteresis: keep it
        for key, (value, reason) in sorted(want.items()):
            if current.get(key) != value:
                out.append(NodeTaintUpdate(node.name, key, value, TaintEffect.NO_SCHEDULE,
                                           True, reason))
        for key in sorted(current):
            if key.startswith(M2G_TAINT_PREFIX) and key not in want:
                why = "maintenance window over or gone" if key == TAINT_MAINTENANCE else (
                    f"rack {node.rack} cooled below its limit" if key == TAINT_THERMAL
                    else "m2g no longer sets this taint")
                out.append(NodeTaintUpdate(node.name, key, current[key],
                                           TaintEffect.NO_SCHEDULE, False, why))
    return out


def _finishes_before(w: WorkloadState, start: datetime) -> bool:
    runtime = w.view.expected_runtime_seconds
    return runtime > 0 and w.admitted_at is not None and \
        w.admitted_at + timedelta(seconds=runtime) <= start


def _checkpoint_order(w: WorkloadState, now: datetime) -> tuple[int, float, str]:
    """Freshest reported checkpoint first (least work lost), then workloads that reported
    none, the most recently started first."""
    ckpt = w.checkpoint_at(now)
    return (0 if ckpt.reported else 1), float(ckpt.last_age_seconds), w.key


def drain_actions(builder: InputBuilder, config: PlannerConfig,
                  skip: frozenset[str] = frozenset()) -> list[ShedAction]:
    """Evictions of work on nodes whose maintenance window is about to start, and the return
    of drained workloads once they are gone. ``skip``: workloads another part of the plan
    already acts on."""
    snap = builder.snap
    now = snap.now
    nodes = {n.name: n for n in snap.factory.nodes}
    due: list[tuple[WorkloadState, MaintenanceWindow]] = []
    of_node: dict[str, MaintenanceWindow | None] = {}  # each node's window, once

    def node_window(name: str) -> MaintenanceWindow | None:
        if name not in of_node:
            of_node[name] = _window_of(now, nodes[name], snap.factory.maintenance,
                                       lambda x: _lead(x, config))
        return of_node[name]

    # no window: none is due (at 1,400 racks, 60,000 admitted workloads' nodes looked at)
    for w in snap.workloads if snap.factory.maintenance else ():
        if w.phase is not Phase.ADMITTED or w.key in skip:
            continue
        window = _earliest(
            win for name in snap.placements.get(w.key, ()) if name in nodes
            if (win := node_window(name)) is not None)
        if window is None:
            continue
        if window.start > now and _finishes_before(w, window.start):
            continue
        due.append((w, window))
    out: list[ShedAction] = []
    if due:
        out += _paced(builder, config, due)
    for w in snap.workloads:
        if w.drained_for and w.phase is Phase.INACTIVE and w.key not in skip \
                and not snap.placements.get(w.key) and (w.shed_at is None or (
                    now - w.shed_at).total_seconds() >= config.min_shed_seconds):
            out.append(ShedAction(w.namespace, w.name, True, workload_kw(w, config),
                                  f"drained for {w.drained_for}: its pods are gone; back to "
                                  "the queue to be placed off the maintained nodes",
                                  drain=w.drained_for))
    return out


def _lead(window: MaintenanceWindow, config: PlannerConfig) -> float:
    return window.drain_lead_seconds if window.drain_lead_seconds is not None else \
        config.maintenance_drain_lead_seconds


def _paced(builder: InputBuilder, config: PlannerConfig,
           due: list[tuple[WorkloadState, MaintenanceWindow]]) -> list[ShedAction]:
    """The ramp's share of ``due`` (a workload larger than a full step may go alone, as in
    shedding), and everything whose window starts within ``drain_deadline_seconds``."""
    now = builder.snap.now
    last = last_action(builder)
    step = config.max_step_kw if last is None else min(
        config.max_step_kw, config.ramp_kw_per_second * max(0.0, (now - last).total_seconds()))
    out: list[ShedAction] = []
    used = 0.0
    for w, win in sorted(due, key=lambda x: (x[1].start, _checkpoint_order(x[0], now))):
        left = (win.start - now).total_seconds()
        kw = workload_kw(w, config)
        urgent = left <= config.drain_deadline_seconds
        fits = used + kw <= step or (not out and step >= config.max_step_kw)
        if not (urgent or fits):
            continue
        used += kw
        when = "under way" if left <= 0 else f"starts in {left:.0f}s"
        out.append(ShedAction(w.namespace, w.name, False, kw,
                              f"drain for maintenance window {win.name} ({when}): the "
                              "workload would not finish before it", drain=f"maintenance/"
                              f"{win.name}"))
    return out
