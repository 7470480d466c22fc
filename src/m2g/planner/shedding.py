"""Shedding and restoring: meet a grid or power limit by deactivating flexible work, paced.

Shortfall = measured site draw − the lowest limit in force within ``shed_lead_seconds``
(a grid event's target, a ramp's next steps or a notified event's, else the site
budget). Workloads that m2g shed within ``settle_seconds``, or longer while Kueue still holds
their quota (their pods are still stopping — unless the snapshot shows none of them bound; at
most ``settle_max_seconds``), still count as
shed (the meter lags), so a reconcile never sheds twice for the same kW.

* Victims: admitted workloads the Preemption stage finds eligible, highest score first, until
  the shortfall is covered — but no more kW per reconcile than the ramp allows
  (``ramp_kw_per_second`` × seconds since the last shed or restore, at most ``max_step_kw``).
  Among equal scores, as few workloads as it takes (``choose_victims``): the largest first,
  and as the last one the smallest that covers the rest — fewer jobs paused, fewer writes
  (each one passes Kueue's webhooks), and no more overshoot than needed.
* Stale or missing power: never shed (docs/signals.md: a stale reading is no reason to act).
* Restore: when there is no shortfall, workloads m2g shed come back (once Kueue has finished
  evicting them: ``evicted``; before ``min_shed_seconds`` once the reading shows their
  pause and they fit twice over: ``settled``), oldest first, each that keeps the site
  ``restore_band`` below its limit with their kW and the kW not drawing yet
  (``in_flight_kw``) added — the band is the job's own kW, at least the meter's noise
  (``meter_noise_fraction``) and at most ``restore_margin`` of the limit — at the same
  ramp (first fit: one that does not fit leaves the room to a smaller one paused after
  it — stopping at it left a 16-rack twin event 30–80 kW under its target for 150 s with
  25 paused jobs of 4–21 kW waiting behind a 21 kW one, 2026-12-06) —
  during an active grid event too (``restore_during_events``): the kW that jobs finishing
  during the event free go back to the paused work before new flexible work gets them
  (m2g.planner.headroom admits restored work first).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from m2g.model.cluster import ClusterSnapshot, LivePods, Phase, WorkloadState
from m2g.model.factory import FactorySnapshot
from m2g.model.plan import CapAction, ResizeAction, ShedAction
from m2g.planner import sparse
from m2g.planner.config import PlannerConfig
from m2g.planner.curtail import Ladders, lift_caps, settling_cap_kw
from m2g.planner.curves import curve_of
from m2g.planner.inputs import InputBuilder
from m2g.planner.memo import NOT_READ, EndingFacts, PlanMemo
from m2g.planner.resize import Shrinkable, grow_back, plan_levers, settling_shrink_kw, shrinkable
from m2g.planner.resize import potential_kw as shrink_potential_kw
from m2g.policy import Evaluator, PreemptionResult

#: Rounds of "pause for what the caps cannot cover" per reconcile (each pause removes that
#: job's cap from the potential; the rest shrinks geometrically, and what is left over after
#: the last round waits for the next reconcile).
MAX_PAUSE_ROUNDS = 4


def workload_kw(w: WorkloadState, config: PlannerConfig) -> float:
    """The workload's draw when running (its estimate, else GPUs × the default), under its
    power cap if m2g set one (m2g.planner.curves)."""
    full = w.view.estimated_kw or w.view.gpus * config.default_kw_per_gpu
    return full * curve_of(w).power(w.power_cap) if w.power_cap < 1.0 else full


def saving_kw(w: WorkloadState, config: PlannerConfig) -> float:
    """What shedding it saves: its draw above the idle its GPUs keep drawing."""
    return workload_kw(w, config) * config.shed_saving_fraction


def drawing(w: WorkloadState, snap: ClusterSnapshot) -> bool:
    """Has it a bound, unfinished pod, so that pausing or capping it saves kW the meter shows?
    (True when the snapshot did not read the pods.) A workload whose pods have all finished
    while its Workload is not Finished yet — a busy Kueue or job controller, seconds to
    minutes — draws nothing: a 16-rack twin event at load 8 paused 22 such workloads for
    ~290 kW it counted as saved, and never reached its target."""
    return snap.live_pods is None or w.key in snap.live_pods


def bound(w: WorkloadState, snap: ClusterSnapshot) -> bool:
    """Has a pod of it been bound to a node: in the pods read (``live_pods``), else, the pods
    not read, in Kueue's placements."""
    return w.key in (snap.placements if snap.live_pods is None else snap.live_pods)


def not_drawing_yet(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig,
                    read_at: datetime | None = None) -> bool:
    """Admitted within ``settle_seconds`` and some of it not in the site reading yet
    (``not_drawing_share`` > 0)."""
    return not_drawing_share(w, snap, config, read_at) > 0.0


def not_drawing_share(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig,
                      read_at: datetime | None = None) -> float:
    """The share of its kW not in the site reading yet, for work admitted within
    ``settle_seconds`` (else 0): all of it when no pod of it is bound, or (the pods read:
    ``live_pods``) when its last pod started running less than ``meter_lag_seconds`` before
    the reading (``read_at``, default: the site reading's time; at most
    ``sparse.STARTING_SECONDS`` before now); else the share of its bound pods not running
    yet. A pod's draw shows in the meter only after the exporter's interval and the scrape,
    as a cap's does: counted as drawing once bound, the kW of a 16-rack twin's firm and
    restored jobs (~180 kW, bound and not metered for 5–10 s) read as room, and m2g lifted 11
    of the 12 caps it had just set for them 0.7–3.6 s later (2026-12-06, 24th session).
    (Counting a gang whole while any of its pods waited read 1,469 kW beside a 1,865 kW
    reading at a twin's warm start, 2026-12-07: more than the factory draws.)"""
    if not (w.phase is Phase.ADMITTED and w.admitted_at is not None
            and (snap.now - w.admitted_at).total_seconds() < config.settle_seconds):
        return 0.0
    live = snap.live_pods
    if live is None:
        return 0.0 if bound(w, snap) else 1.0
    pods = live.get(w.key)
    if pods is None:
        return 1.0
    start = pods.started_at
    if start is not None and start > snap.now - timedelta(seconds=sparse.STARTING_SECONDS):
        if read_at is None:
            read_at = _read_at(snap) or snap.now
        if start + timedelta(seconds=config.meter_lag_seconds) > read_at:
            return 1.0
    return min(1.0, pods.waiting / pods.running) if pods.waiting and pods.running else 0.0


def restoring(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig) -> bool:
    """Restored by m2g within ``settle_max_seconds`` and not admitted again yet (Kueue
    re-queues it, m2g's check answers it): the room it was restored into is its own."""
    return (w.restored_at is not None and not w.shed_by_m2g
            and w.phase in (Phase.PENDING, Phase.RESERVED)
            and (snap.now - w.restored_at).total_seconds() < config.settle_max_seconds)


def in_flight_kw(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """kW the meter does not show yet but will: work admitted and not in the reading yet
    (its ``not_drawing_share``), and work restored and not admitted again yet — never more
    than the racks can still add to their readings (``room_under_rack_caps_kw``: a rack draws
    at most its cap). A 16-rack twin's warm start read "1,469 kW admitted and not drawing
    yet" beside a 1,788 kW reading of racks whose caps sum to 2,112 kW (2026-12-07): m2g
    held new work for room no rack could have drawn. Its cause, the pods not read while the
    site was far under its limit, is fixed in the snapshot (m2g.k8s.build._near_limit); the
    bound stands for pods m2g sees late or not at all."""
    read_at = _read_at(snap) or snap.now
    total = 0.0
    for w in sparse.of(snap).in_flight:
        share = not_drawing_share(w, snap, config, read_at)
        if share > 0.0:
            total += workload_kw(w, config) * share
        elif restoring(w, snap, config):
            total += workload_kw(w, config)
    return min(total, snap.factory.room_under_rack_caps_kw()) if total > 0.0 else total


def _budget_kw(builder: InputBuilder, config: PlannerConfig, since: datetime | None) -> float:
    """kW this reconcile may move, by the ramp limit."""
    if since is None:
        return config.max_step_kw
    elapsed = max(0.0, (builder.snap.now - since).total_seconds())
    return min(config.max_step_kw, config.ramp_kw_per_second * elapsed)


def settling(w: WorkloadState, now: datetime, config: PlannerConfig,
             pods_gone: bool = False, stopping: bool | None = None,
             read_at: datetime | None = None) -> bool:
    """Shed by m2g and still counted as shed although the meter may not show it yet: within
    ``settle_seconds``, or while Kueue still holds its quota and its pods are stopping
    within ``settle_max_seconds`` — unless its pods are known to be gone (``pods_gone``),
    when the meter has it. ``stopping``: are its pods being deleted (None: not known, then
    Kueue holding its quota stands for it). A pod not even being deleted once
    ``settle_seconds`` have passed still runs and draws: the meter is right, and counting it
    as saved would hide a real shortfall (Kueue slow to evict under load).

    ``read_at``: when the site reading was taken. Once its pods are gone and Kueue released
    its quota ``meter_lag_seconds`` before that (``metered``), the reading has the saving
    and it no longer settles, even within ``settle_seconds``: counting it on top of the meter
    held a grid event's draw above its target until ``settle_seconds`` ran out (make demo:
    the second shed step 60 s after the first)."""
    if not w.shed_by_m2g or w.shed_at is None:
        return False
    if pods_gone and read_at is not None and metered(w, read_at, config):
        return False
    age = (now - w.shed_at).total_seconds()
    return age < config.settle_seconds or (
        w.holds_quota and w.phase is Phase.INACTIVE and age < config.settle_max_seconds
        and not pods_gone and stopping is not False)


def metered(w: WorkloadState, read_at: datetime, config: PlannerConfig) -> bool:
    """Does a site reading taken at ``read_at`` show that ``w`` was shed: Kueue released
    its quota after the shed (its pods stopped: Kueue releases an evicted workload's quota
    once its job is stopped) at least ``meter_lag_seconds`` before the reading? Condition
    times are whole seconds and the shed stamp is not: a release up to one second before
    the stamp counts as this shed's."""
    if w.holds_quota or w.released_at is None or w.shed_at is None:
        return False
    return (w.released_at >= w.shed_at - timedelta(seconds=1)
            and w.released_at + timedelta(seconds=config.meter_lag_seconds) <= read_at)


def evicted(w: WorkloadState, now: datetime, config: PlannerConfig) -> bool:
    """May a shed workload come back: shed ``min_shed_seconds`` ago and Kueue has finished
    evicting it (quota released) — reactivating one mid-eviction can leave its Job suspended
    for good (Kueue v0.19.2, docs/benchmarks.md) — or, if Kueue never releases it,
    ``settle_max_seconds`` ago."""
    if w.shed_at is None:
        return True
    age = (now - w.shed_at).total_seconds()
    return age >= config.min_shed_seconds and (
        not w.holds_quota or age >= config.settle_max_seconds)


def settled(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig,
            read_at: datetime | None) -> bool:
    """May a shed workload come back before ``min_shed_seconds`` (``early_restore``): the
    reading taken at ``read_at`` shows its pause (Kueue released its quota, so its pods have
    stopped and the eviction is over, ``meter_lag_seconds`` before it: ``metered``), no pod
    of it is bound, and it was not shed within ``min_shed_seconds`` of its last restore
    (``restored_at``, kept through a shed: one that flapped waits the full dwell)."""
    if not config.early_restore or w.shed_at is None or read_at is None \
            or not metered(w, read_at, config):
        return False
    if bound(w, snap):
        return False
    return not flapped(w, config)


def settling_kw(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """kW shed or capped that the meter does not show yet. Only what m2g shed can settle
    (``settling`` is False for the rest whatever its pods): the pods are looked up for
    those alone, not for every workload (100,000 lookups at 1,400 racks)."""
    read_at = _read_at(snap)
    return sum(saving_kw(w, config) for w in sparse.of(snap).shed
               if w.shed_by_m2g and w.shed_at is not None
               and _settles(w, snap, config, read_at)) \
        + settling_cap_kw(snap, config) + settling_shrink_kw(snap, config)


def reach_kw(snap: ClusterSnapshot, config: PlannerConfig) -> float:
    """kW m2g can still take off the meter for new firm work during a grid event: what it
    shed or capped that the meter does not show yet, plus what pausing the running flexible
    work it has not paused would save (flex tier 2 and up, or 1 and up from SIMPLE level 3;
    drawing). Structural, not the Preemption stage's answer: a policy that exempts some of
    that work makes this an overestimate — firm work is then admitted as it was before."""
    event = snap.factory.grid_event()
    lowest = 1 if event is not None and event.level >= 3 else 2
    live, fraction = snap.live_pods, config.shed_saving_fraction  # (``drawing``, ``saving_kw``)
    return settling_kw(snap, config) + sum(
        workload_kw(w, config) * fraction for w in sparse.of(snap).flexible
        if w.phase is Phase.ADMITTED and w.view.flex_tier >= lowest and not w.shed_by_m2g
        and (live is None or w.key in live))


def ending(by_key: Mapping[str, WorkloadState], snap: ClusterSnapshot,
           config: PlannerConfig, memo: PlanMemo | None = None) -> dict[str, float]:
    """Key → the kW its end frees (``saving_kw``: its GPUs go idle, as when paused) of the
    drawing workloads in ``by_key`` expected to end within ``ending_lead_seconds``: all their
    pods running (none waiting or being deleted) and not shed, with their own
    ``expected_runtime_seconds``, counted from the later of their admission and their last
    pod's start, at the throughput of their cap (and of their replicas left, when shrunk).
    A workload past its expected end is not counted: a runtime declared too short delays a
    pause by at most ``ending_lead_seconds``. A pause shows in the meter only once Kueue has
    stopped the pods and the meter has caught up (~7–10 s in the 16-rack twin): a job that
    ends by then frees the same kW without the pause's restart and lost work, and in a
    twin event whose work runs minutes, ~250 GPUs of it ended in the 20 s after m2g had
    paused every running flex-2/3 job (2026-12-07, run D).
    ``memo``: each workload's facts that do not move with the clock (``_ending_facts``) kept
    from the plan before while its state is the very object they were read from and its
    LivePods are equal (m2g.planner.memo); only the time test runs for it again."""
    lead = config.ending_lead_seconds
    if lead <= 0:
        return {}
    now, live = snap.now, snap.live_pods
    out: dict[str, float] = {}
    seen = (lead, config.default_kw_per_gpu, config.shed_saving_fraction)
    kept = memo.ending if memo is not None and memo.ending_config == seen else {}
    fresh: dict[str, tuple[WorkloadState, LivePods | object, EndingFacts]] = {}
    hits = 0
    for key, w in by_key.items():
        pods = NOT_READ if live is None else live.get(key)
        was = kept.get(key)
        if was is not None and was[0] is w and (was[1] is pods or was[1] == pods):
            hits += 1
            fresh[key] = was
            got = was[2]
        else:
            got = _ending_facts(w, pods, config)
            fresh[key] = (w, pods, got)
        if got is not None:
            start, runtime, rate, kw = got
            left = runtime - (now - start).total_seconds()
            if left > 0 and left / rate <= lead:  # (past its expected end: not known)
                out[key] = kw
    if memo is not None:
        memo.ending, memo.ending_config = fresh, seen
        memo.reused["ending"] += hits
    return out


def _ending_facts(w: WorkloadState, pods: LivePods | object | None,
                  config: PlannerConfig) -> EndingFacts:
    """What ``ending`` reads of ``w`` that does not move with the clock: None when it cannot
    end soon (no runtime declared, shed, not admitted, no pods or some waiting or stopping —
    ``pods`` is its LivePods, None, or ``NOT_READ`` when the snapshot did not read the pods —
    or no throughput), else (from when its runtime counts, the runtime, its throughput × its
    share of replicas, the kW its end frees)."""
    runtime = w.view.expected_runtime_seconds
    if runtime <= 0 or w.shed_by_m2g or w.admitted_at is None:
        return None
    start = w.admitted_at
    if pods is not NOT_READ:
        if not isinstance(pods, LivePods) or pods.waiting or pods.stopping:
            return None
        if pods.started_at is not None and pods.started_at > start:
            start = pods.started_at
    rate = curve_of(w).throughput(w.power_cap) if w.power_cap < 1.0 else 1.0
    share = 1.0
    if w.full_parallelism and 0 < w.parallelism < w.full_parallelism:
        share = w.parallelism / w.full_parallelism
    if rate <= 0:
        return None
    return start, float(runtime), rate * share, saving_kw(w, config) * share


def _read_at(snap: ClusterSnapshot) -> datetime | None:
    """When the site reading was taken (None: no reading)."""
    draw = snap.factory.site_draw_kw()
    if draw.value is None or not math.isfinite(draw.age_seconds):
        return None
    return snap.now - timedelta(seconds=max(0.0, draw.age_seconds))


def _settles(w: WorkloadState, snap: ClusterSnapshot, config: PlannerConfig,
             read_at: datetime | None = None) -> bool:
    live = snap.live_pods
    if live is None:  # the pods were not read: placements, if any, say where they are
        known = snap.placements
        return settling(w, snap.now, config, bool(known) and w.key not in known,
                        read_at=read_at)
    pods = live.get(w.key)
    return settling(w, snap.now, config, pods is None,
                    None if pods is None else pods.stopping > 0, read_at=read_at)


def last_action(builder: InputBuilder) -> datetime | None:
    """The last shed, restore or cap change (the ramp counts from it; a restore's time is
    its ``restored_at``: restoring removes ``shed_at``)."""
    times = [t for w in sparse.of(builder.snap).stamped
             for t in (w.shed_at, w.restored_at, w.power_cap_at, w.resized_at)
             if t is not None]
    return max(times) if times else None


def shed_actions(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig,
                 last: datetime | None = None) -> tuple[list[ShedAction], str]:
    """Sheds or restores for this reconcile, and a one-line account of why (the caps of
    ``power_actions`` left out)."""
    sheds, _, _, why, _ = power_actions(evaluator, builder, config, last)
    return sheds, why


def power_actions(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig,
                  last: datetime | None = None, firm_kw: float = 0.0
                  ) -> tuple[list[ShedAction], list[CapAction], list[ResizeAction], str, int]:
    """Sheds, restores, caps and cap lifts, shrinks and grows of elastic Jobs for this
    reconcile (m2g.planner.curtail, m2g.planner.resize: caps and shrinks first, cheapest
    throughput per kW, pauses for the rest; restores in the reverse order), why, in one
    line, and how many drawing workloads a Preemption policy failed on while over the limit
    (never shed or capped: ``Plan.preemption_failed``). ``firm_kw``: kW of new firm work
    this plan admits beyond the room under the limit (m2g.planner.headroom.share_beyond),
    curtailed for now on top of any shortfall the meter shows."""
    factory = builder.snap.factory
    draw = factory.site_draw_kw()
    limit = factory.limit_ahead_kw(config.shed_lead_seconds)
    if draw.stale or draw.value is None:
        return [], [], [], ("site power is stale or missing: no shedding or restoring on stale "
                            "data"), 0
    if limit <= 0:
        return [], [], [], "no site budget or grid limit known", 0
    last = last if last is not None else last_action(builder)
    step = _budget_kw(builder, config, last)
    unseen = settling_kw(builder.snap, config)  # shed or capped, not in the meter yet
    shortfall = draw.value - unseen - limit
    if firm_kw > 0:  # the firm work's kW beyond the room: on top of the meter's shortfall
        shortfall = max(0.0, shortfall) + firm_kw
    if shortfall > 0:
        why = (f"site draw {draw.value:.0f} kW over the {limit:.0f} kW limit"
               f"{_ahead(factory, limit, config)} by {shortfall:.0f} kW"
               if firm_kw <= 0 else
               f"new firm work admitted {firm_kw:.0f} kW beyond the room under the "
               f"{limit:.0f} kW limit (site draw {draw.value:.0f} kW): {shortfall:.0f} kW "
               "to free")
        sheds, caps, resizes, (failed, vetoed) = _curtail(evaluator, builder, config,
                                                          shortfall, step)
        if caps:
            why += f": {len(caps)} cap(s) save {sum(c.kw for c in caps):.0f} kW"
        if resizes:
            why += f"; {len(resizes)} shrink(s) save {sum(r.kw for r in resizes):.0f} kW"
        ends = facts(evaluator, builder, config).ending
        if ends:
            why += (f"; {len(ends)} workload(s) expected to end within "
                    f"{config.ending_lead_seconds:g} s free {sum(ends.values()):.0f} kW "
                    "(no pause for it)")
        return sheds, caps, resizes, why + failed, vetoed
    event = factory.grid_event()
    active = event is not None and event.active(factory.now)
    if active and event is not None and not config.restore_during_events:
        return [], [], [], (f"grid event {event.id} is active: shed work returns after it "
                            "ends"), 0
    # the room less what restores and admissions not drawing yet will take (during an event
    # the kW freed by finished jobs go back to the paused work, restored in shed order)
    room = limit - draw.value - in_flight_kw(builder.snap, config)
    restores = _restore(builder, config, room, limit, step)
    # the reverse order: paused work first, then the caps — in kilowatts, not in time: the
    # room and the ramp go to the restores, and the kW of paused work that cannot come back
    # yet (Kueue still evicting it) stay reserved for it; the caps get what is left. Waiting
    # for its eviction instead kept 188 caps on for 74 s after a 16-rack twin event, with
    # 2 MW of room.
    restored = sum(a.kw for a in restores)
    back = {f"{a.namespace}/{a.name}" for a in restores}
    waiting = sum(workload_kw(w, config) for w in sparse.of(builder.snap).shed
                  if w.shed_by_m2g and not w.drained_for and w.phase is Phase.INACTIVE
                  and w.key not in back)
    # no grow during an active event: Kueue admits the larger size as a new Workload slice,
    # which m2g's own admission then defers as new flexible work (grid-demand-response), and
    # that Retry stops the running job: three restored flex-2 jobs grown back in a 16-rack
    # twin event (2026-12-06, 24th session) never ran again; shrunk, they keep running
    grows = [] if active else grow_back(builder, config, room - restored - waiting, limit,
                                        step - restored)
    grown = -sum(g.kw for g in grows)
    lifts = lift_caps(builder, config, room - restored - waiting - grown, limit,
                      step - restored - grown)
    during = f" during grid event {event.id}" if active and event is not None else ""
    if draw.value > limit:  # under it only by what the meter does not show yet
        return restores, lifts, grows, (
            f"site draw {draw.value:.0f} kW over the {limit:.0f} kW limit{during} by "
            f"{draw.value - limit:.0f} kW, all of it settling ({unseen:.0f} kW shed or "
            "capped, not in the meter yet)"), 0
    return restores, lifts, grows, (
        f"site draw {draw.value:.0f} kW under the {limit:.0f} kW limit{during}"), 0


def _ahead(factory: FactorySnapshot, limit: float, config: PlannerConfig) -> str:
    """The words for a ``limit`` still to come (lower than the one in force), else ""."""
    in_force = factory.effective_budget_kw()
    return f" (starting within {config.shed_lead_seconds:g} s)" \
        if limit > 0 and (in_force <= 0 or limit < in_force) else ""


def _preemption(evaluator: Evaluator, builder: InputBuilder
                ) -> tuple[list[WorkloadState], dict[str, PreemptionResult]]:
    """The admitted workloads, and the Preemption stage for each of them by key, once per
    reconcile (one batch)."""
    running = list(sparse.of(builder.snap).admitted)
    if not running:
        return running, {}
    results = evaluator.preemption_items(builder.base(), builder.items(running))
    return running, {w.key: r for w, r in zip(running, results, strict=True)}


@dataclass(frozen=True)
class CurtailFacts:
    """What ``_curtail`` reads of one snapshot whatever the shortfall and the ramp: the
    Preemption stage's ``results`` for every admitted workload, the drawing ones by key,
    the words for those a policy failed on, the eligible as ``candidates``' groups, and with
    power caps the cap ladders and the shrinkable elastic Jobs. ``facts`` works them out
    once per reconcile: ``make_plan`` plans the power actions a second time when firm work
    is admitted beyond the room, and that second plan redoes only the pause rounds and the
    levers (1.0–1.3 s CPU of a reconcile at 1,400 racks otherwise)."""

    evaluator: Evaluator
    config: PlannerConfig
    results: dict[str, PreemptionResult]
    by_key: dict[str, WorkloadState]
    failed: tuple[str, int]
    groups: list[tuple[float, list[Candidate]]]
    ladders: Ladders | None
    elastic: list[Shrinkable]
    #: the drawing workloads expected to end within ``ending_lead_seconds``: key → kW freed
    ending: dict[str, float]


def facts(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig) -> CurtailFacts:
    """``builder``'s CurtailFacts for ``evaluator`` and ``config``: the ones kept on the
    builder when made with these very objects (a snapshot's facts never change; the
    evaluator's policies and the config are what else they read), else new ones, kept."""
    got = builder.derived.get("curtail")
    if isinstance(got, CurtailFacts) and got.evaluator is evaluator and got.config is config:
        return got
    running, results = _preemption(evaluator, builder)
    live = builder.snap.live_pods  # (``drawing``, inlined: 60,000 at 1,400 racks)
    by_key = {w.key: w for w in running if live is None or w.key in live}
    groups = candidates(config, results, by_key)  # once: the rounds differ only in `paused`
    ladders, elastic = None, list[Shrinkable]()
    if config.power_caps:
        min_caps = {k: r.min_cap for k, r in results.items() if r.min_cap is not None}
        ladders = Ladders(builder, config, min_caps)  # once: the rounds differ in `paused`
        elastic = shrinkable(builder, config, ladders.horizon)
    got = CurtailFacts(evaluator, config, results, by_key, _failed_on(results, by_key), groups,
                       ladders, elastic, ending(by_key, builder.snap, config, builder.memo))
    builder.derived["curtail"] = got
    return got


def _failed_on(results: dict[str, PreemptionResult], drawing_keys: Mapping[str, object]
               ) -> tuple[str, int]:
    """"; N drawing workload(s) never shed or capped: a Preemption policy failed on them
    (first: ...)" — a ``score`` that errors for some inputs (failurePolicy Fail vetoes: m2g
    never sheds on an error) left a shortfall uncovered with no word why; "" when none — and
    how many they are."""
    hit = [(k, r) for k, r in results.items()
           if k in drawing_keys and r.errors and not r.eligible]
    if not hit:
        return "", 0
    key, first = min(hit, key=lambda kr: kr[0])
    e = first.errors[0]
    return (f"; {len(hit)} drawing workload(s) never shed or capped: a Preemption policy "
            f"failed on them (first {key}: {e.policy}/{e.rule}: {e.message[:120]})", len(hit))


def _curtail(evaluator: Evaluator, builder: InputBuilder, config: PlannerConfig,
             shortfall: float, step: float
             ) -> tuple[list[ShedAction], list[CapAction], list[ResizeAction],
                        tuple[str, int]]:
    """Caps first; pauses only for what the allowed caps of the jobs left running and the
    work expected to end before a pause would show (``ending``: never paused) cannot cover
    (a paused job's cap no longer counts: a few rounds, each pausing in the Preemption
    stage's order for the rest), then the caps on the jobs not paused for what is left.
    The Preemption stage's ``minCap`` bounds each job's caps. The last part: the words for
    the drawing workloads a Preemption policy failed on ("" when none) and their count."""
    known = facts(evaluator, builder, config)
    by_key, failed, groups = known.by_key, known.failed, known.groups
    ladders, elastic = known.ladders, known.elastic
    ends = frozenset(known.ending)
    freed = sum(known.ending.values())
    if ladders is None:  # no power caps
        return _shed(config, shortfall - freed, step, groups, by_key, ends), [], [], failed
    # what the event needs paused, whatever the ramp: (candidate, the round's shortfall),
    # the actions built only for those the ramp lets go (a 30 % cut at 1,400 racks pauses
    # all 23,000 candidates here, of which 385 fit: 0.1 s of messages, 2026-12-04)
    # the work ending soon: its kW are freed without a pause, its caps not counted on top
    pauses: list[tuple[Candidate, float]] = []
    paused: frozenset[str] = frozenset()
    for _ in range(MAX_PAUSE_ROUNDS):
        potential = ladders.potential_kw(paused | ends) \
            + shrink_potential_kw(elastic, paused | ends)
        need = shortfall - freed - sum(c.kw for c, _ in pauses) - potential
        if need <= 0:
            break
        more = _choose(groups, need, float("inf"), config, paused | ends)
        if not more:
            break
        pauses += [(c, need) for c in more]
        paused |= {c.key for c in more}
    left = shortfall - sum(c.kw for c, _ in pauses)
    caps, resizes = plan_levers(builder, config, left, step, ladders, elastic,
                                exclude=paused) if left > 0 else ([], [])
    # the ramp: this reconcile's kW go to the caps first (fast, cheap, reversible), then to
    # the pauses in the Preemption stage's order
    used = sum(c.kw for c in caps) + sum(r.kw for r in resizes)
    sheds = list[ShedAction]()
    for c, need in pauses:
        if not _fits(used + c.kw, step, bool(sheds) or bool(caps) or bool(resizes), config):
            break
        used += c.kw
        sheds.append(_pause(c, need, by_key))
    return sheds, caps, resizes, failed


def _fits(total: float, step: float, has_any: bool, config: PlannerConfig) -> bool:
    """Within the ramp; a single workload larger than a full step may go alone."""
    return total <= step or (not has_any and step >= config.max_step_kw)


@dataclass(frozen=True)
class Candidate:
    """A workload that may be shed: its Preemption score, key and saving (kW)."""

    score: float
    key: str
    kw: float


def choose_victims(candidates: Iterable[Candidate], shortfall: float, step: float,
                   config: PlannerConfig) -> list[Candidate]:
    """The workloads to shed, in order: highest score first, until their kW covers
    ``shortfall``, within the ramp's ``step`` (when no candidate of the current score fits,
    the step ends: lower scores never go before higher ones). Among equal scores, the fewest
    that fit: the largest first, and once a single one can cover what remains, the smallest
    such (then by key, so the choice is deterministic)."""
    return _choose(by_score(candidates), shortfall, step, config)


def by_score(candidates: Iterable[Candidate]) -> list[tuple[float, list[Candidate]]]:
    """The candidates by score, highest first, each score's largest first (then by key)."""
    groups: dict[float, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(c.score, []).append(c)
    return [(score, sorted(groups[score], key=lambda c: (-c.kw, c.key)))
            for score in sorted(groups, reverse=True)]


def _choose(groups: list[tuple[float, list[Candidate]]], shortfall: float, step: float,
            config: PlannerConfig, exclude: frozenset[str] = frozenset()) -> list[Candidate]:
    """choose_victims over ``by_score``'s groups, the keys in ``exclude`` left out (the groups
    are worked out once per reconcile; each pause round leaves out those paused before)."""
    out: list[Candidate] = []
    covered = 0.0
    for _, group in groups:
        pool = [c for c in group if c.key not in exclude] if exclude else list(group)
        if step == math.inf and math.isfinite(covered) and all(
                math.isfinite(c.kw) for c in pool):
            pool, covered = _take_largest(pool, shortfall, covered, out)
        while pool and covered < shortfall:
            fitting = [c for c in pool if _fits(covered + c.kw, step, bool(out), config)]
            if not fitting:  # the ramp: lower scores wait for the next step
                return out
            rest = shortfall - covered
            covers = [c for c in fitting if c.kw >= rest]
            pick = min(covers, key=lambda c: (c.kw, c.key)) if covers else fitting[0]
            pool.remove(pick)
            out.append(pick)
            covered += pick.kw
        if covered >= shortfall:
            break
    return out


def _take_largest(pool: list[Candidate], shortfall: float, covered: float,
                  out: list[Candidate]) -> tuple[list[Candidate], float]:
    """_choose's loop over one score's ``pool`` (largest first) without a ramp (every
    candidate fits): the largest while none covers the rest, then the smallest that does —
    by index instead of a pass over the pool per pick (the pause rounds pick hundreds of
    workloads from pools of thousands at 1,400 racks). Returns the pool left and the kW
    covered; what is left to pick (a sum that rounds under the shortfall) goes on as before."""
    head = 0
    while head < len(pool) and covered < shortfall:
        rest = shortfall - covered
        if pool[head].kw < rest:  # none covers the rest: the largest
            out.append(pool[head])
            covered += pool[head].kw
            head += 1
            continue
        last = head  # the covers are a prefix (largest first); the smallest kW, then key
        while last + 1 < len(pool) and pool[last + 1].kw >= rest:
            last += 1
        first = last
        while first > head and pool[first - 1].kw == pool[last].kw:
            first -= 1
        out.append(pool[first])
        covered += pool[first].kw
        return pool[head:first] + pool[first + 1:], covered
    return pool[head:], covered


def candidates(config: PlannerConfig, results: dict[str, PreemptionResult],
               by_key: Mapping[str, WorkloadState]) -> list[tuple[float, list[Candidate]]]:
    """The eligible workloads (``results``: the Preemption stage's, of the workloads in
    ``by_key``) as ``by_score``'s groups."""
    return by_score(Candidate(r.score, k, saving_kw(by_key[k], config))
                    for k, r in results.items() if r.eligible and k in by_key)


def _shed(config: PlannerConfig, shortfall: float, step: float,
          groups: list[tuple[float, list[Candidate]]], by_key: Mapping[str, WorkloadState],
          exclude: frozenset[str] = frozenset()) -> list[ShedAction]:
    """Pauses for ``shortfall`` among the eligible (``groups``: ``candidates``), those in
    ``exclude`` left out."""
    if not groups or step <= 0 or shortfall <= 0:
        return []
    return [_pause(c, shortfall, by_key)
            for c in _choose(groups, shortfall, step, config, exclude)]


def _pause(c: Candidate, shortfall: float, by_key: Mapping[str, WorkloadState]
           ) -> ShedAction:
    """The action pausing ``c``, chosen to cover ``shortfall``."""
    w = by_key[c.key]
    return ShedAction(w.namespace, w.name, False, c.kw, f"shed {c.kw:.0f} kW (score "
                      f"{c.score:.1f}) to cover a {shortfall:.0f} kW shortfall")


def restore_band(kw: float, limit: float, config: PlannerConfig, flapped: bool = False
                 ) -> float:
    """kW a restore of ``kw`` of paused work keeps under ``limit`` (hysteresis): its own kW
    — so only a rise of the draw as large as the job itself (or its estimate off by all of
    it) sheds it again — at least the meter's noise (``meter_noise_fraction`` of the limit)
    and at most ``restore_margin`` of it; ``restore_margin`` for a job that ``flapped`` (shed
    again within ``min_shed_seconds`` of its last restore: the draw moves by more than its
    kW here). ``restore_margin`` whatever the job's size (as before 2026-12-07) kept ~57 kW
    of a 16-rack twin event's 1,147 kW target empty while paused flex-2/3 jobs of 5–21 kW
    waited for it, from 50 s to the event's end (25th session): a margin sized to the site
    held back work sized to jobs."""
    margin = limit * config.restore_margin
    return max(limit * config.meter_noise_fraction, margin if flapped else min(kw, margin))


def flapped(w: WorkloadState, config: PlannerConfig) -> bool:
    """Was ``w`` shed within ``min_shed_seconds`` of its last restore (``m2g.io/restored-at``
    stays through a shed)?"""
    back, shed = w.restored_at, w.shed_at
    return back is not None and shed is not None \
        and (shed - back).total_seconds() < config.min_shed_seconds


def _restore(builder: InputBuilder, config: PlannerConfig, room: float, limit: float,
             step: float) -> list[ShedAction]:
    """The paused workloads that come back (oldest shed first, first fit, within ``room``
    less each one's ``restore_band`` and the ramp's ``step``): those ``evicted`` after
    ``min_shed_seconds``, and those whose pause has ``settled`` earlier when they fit twice
    over in the room under the lowest limit known for the next ``min_shed_seconds``."""
    snap = builder.snap
    now, read_at = snap.now, _read_at(snap)
    shed = sorted(((w, evicted(w, now, config)) for w in sparse.of(snap).shed
                   if w.shed_by_m2g and not w.drained_for and w.phase is Phase.INACTIVE),
                  key=lambda wd: (wd[0].shed_at or now, wd[0].key))
    out: list[ShedAction] = []
    used = 0.0
    ahead = snap.factory.limit_ahead_kw(max(config.min_shed_seconds, config.shed_lead_seconds))
    early_room = room - max(0.0, limit - ahead) if ahead > 0 else room
    for w, due in shed:
        if not due and not settled(w, snap, config, read_at):
            continue
        kw = workload_kw(w, config)
        band = restore_band(kw, limit, config, flapped(w, config))
        need, free = (kw, room) if due else (2 * kw, early_room)  # early: room for it twice
        if used + need > free - band or not _fits(used + kw, step, bool(out), config):
            continue  # first fit: a smaller one paused later may fit in what is left
        used += kw
        out.append(ShedAction(w.namespace, w.name, True, kw,
                              f"restore {kw:.0f} kW{'' if due else ' (its pause settled)'}: "
                              f"{room - used:.0f} kW headroom remains"))
    return out
