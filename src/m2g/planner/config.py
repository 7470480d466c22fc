"""Planner settings: hysteresis, pacing and defaults, with the reasons for their values."""

from __future__ import annotations

from dataclasses import dataclass

from m2g.model import labels as L


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the planner. Defaults suit a GB300 NVL72 factory (docs/controllers.md)."""

    check_name: str = "m2g-policy"
    #: A percentage grid event's baseline: the mean site draw over this many seconds before
    #: its start (docs/controllers.md, "Grid events"; the twin's definition, twin-metrics.md).
    baseline_window_seconds: float = 60.0
    #: Site-draw samples kept for it (the controller's history), seconds.
    draw_history_seconds: float = 900.0
    #: Quota changes smaller than this many GPUs (one NVL72 tray) are not worth an update.
    quota_hysteresis_gpus: int = 4
    #: A raised quota waits this long after the last change (lowering is immediate: safety).
    quota_raise_dwell_seconds: float = 120.0
    #: Ramp limit for shedding and restoring, kW per second. Synchronous training makes MW-scale
    #: swings; pausing or resuming a job is itself a grid transient (field-notes §9.2).
    ramp_kw_per_second: float = 50.0
    #: The most kW one reconcile may shed or restore, whatever the time since the last action.
    max_step_kw: float = 500.0
    #: Shed workloads keep drawing until their pods are gone; count them as shed for this long.
    #: (A cap counts as saved for this long too, unless the node agents report it in force.)
    settle_seconds: float = 60.0
    #: Curtail against the lowest limit that starts within this long (a grid event's ramp
    #: steps, a notified event), not only the one in force: a cap shows in the meter 7–10 s
    #: after m2g sets it and a pause once Kueue has stopped its pods, so a site that
    #: curtails for each ramp step when it starts is over the limit for that long. In a
    #: 16-rack twin event (2026-12-07, run F: a 16 s ramp in four steps, m2g planning for the
    #: limit in force) the draw followed each step 7–10 s late and reached the final target
    #: 32.8 s after the start, 15.8 s after the ramp. 15 s (as ``ending_lead_seconds``: what
    #: the meter shows within that long) covers such a ramp from its first second; the
    #: 30 s tried in 2026-12-02's twin (ninth session) ran on older accounting of what is
    #: settling. 0: the limit in force only.
    shed_lead_seconds: float = 15.0
    #: Work expected to end within this long (its own ``m2g.io/expected-runtime-seconds``
    #: from the start of its pods, slowed by its cap) frees its kW about as soon as a pause
    #: would show in the meter (Kueue stops the pods, then the meter's lag): the pause rounds
    #: count it as freed and never pause it (m2g.planner.shedding.ending). Caps are planned
    #: as before. A job that runs past its expected end no longer counts, so a runtime
    #: declared too short delays a pause by at most this long. In a 16-rack twin event
    #: (2026-12-07, run D) m2g paused every running flex-2/3 job (26, 280 GPUs) in the
    #: ramp's first 12 s while ~250 GPUs of other work ended within the next 20 s, and
    #: brought all 26 back within 12–68 s: most of the event's performance loss. With 15 s,
    #: in one twin invocation beside the rule before (2026-12-07, 29th session): 8 pauses
    #: against 34, weighted performance 0.890 against 0.845, the target reached as fast
    #: (32.8 / 32.6 s) and 15.8 s above it after the ramp against 23.9. 0: off.
    ending_lead_seconds: float = 15.0
    #: A cap the node agents report in force (GPUPowerLimit status) shows in the site meter
    #: within this long (the PDU/exporter interval and the scrape); then it no longer counts
    #: as settling: the meter has it (counting it again held a 16-rack twin 40–90 kW above
    #: the event's target for minutes).
    meter_lag_seconds: float = 5.0
    #: ... and for as long as Kueue still holds its quota (its pods have not stopped), up to
    #: this long: on a busy cluster evicting ~100 workloads took minutes, and after 60 s m2g
    #: shed 4× the kW needed (docs/benchmarks.md). Bounded, so a workload Kueue never
    #: releases cannot hide a real shortfall for good. Restoring also waits for the release
    #: (reactivating mid-eviction: see min_shed_seconds), up to this long.
    settle_max_seconds: float = 300.0
    #: A shed workload stays shed at least this long: restoring one that Kueue is still
    #: evicting can leave its Job suspended for good (seen with Kueue v0.19.2).
    min_shed_seconds: float = 60.0
    #: ... unless its pause has settled: Kueue released its quota (its pods stopped) at least
    #: ``meter_lag_seconds`` before the site reading, which then shows it gone, and no pod of
    #: it is bound. Then it may come back early (m2g.planner.shedding.settled), with room for
    #: it twice over beyond its ``restore_band`` under the lowest limit known for the next
    #: ``min_shed_seconds`` (hysteresis), and not if it was shed within ``min_shed_seconds``
    #: of its last restore (a workload that flapped waits the full dwell). A 16-rack twin
    #: event (2026-12-06) had 27–60 kW of room from 40 s on while the paused flex-2/3 jobs
    #: waited for the 60 s dwell: ~0.10 of its weighted performance. False: every restore
    #: waits ``min_shed_seconds``.
    early_restore: bool = True
    #: Admit new flexible work (``share_headroom``), lift caps and grow elastic Jobs back
    #: only while the site stays this fraction below its limit after it; and the most a
    #: restore of paused work keeps under the limit beyond its own kW (``restore_band``).
    restore_margin: float = 0.05
    #: The site meter's noise, as a fraction of the limit: the least a restore of paused
    #: work keeps under the limit beyond its own kW (``restore_band``). 0.01: the tolerance
    #: of the twin's grid figures (docs/twin-metrics.md; its simulator has no meter noise).
    meter_noise_fraction: float = 0.01
    #: Spend the site's headroom once across the work one reconcile admits
    #: (m2g.planner.headroom): flexible work that does not fit in what the work before it
    #: left gets Retry, after ``headroom_retry_seconds``.
    share_headroom: bool = True
    #: Bring paused work back (and lift caps) during an active grid event too, when the site
    #: has room under the event's target beyond ``restore_margin`` (what restores and
    #: admissions not drawing yet will take counted): jobs that finish during an event free
    #: kW, and without it they went to new flexible work while the paused jobs waited for the
    #: event's end (a 16-rack twin event kept 7 % of its flex-2 work, where 97.6 % was
    #: reachable). False: shed work returns only after the event.
    restore_during_events: bool = True
    headroom_retry_seconds: int = 30
    #: The lowest flex tier the headroom gate holds back (one lower from SIMPLE level 2 of an
    #: active grid event), as the shipped grid-demand-response policy does.
    headroom_min_tier: int = 2
    #: ... and while a grid event is active, every tier from this one: new flexible work
    #: starts only in the room the running work leaves (0: firm work too — firm new work
    #: then waits for the room instead of flexible running work making it; 3: as outside
    #: events).
    headroom_event_min_tier: int = 1
    #: ... and the tiers below it (firm work) during an active grid event only while the
    #: room plus what m2g can still free (sheds not in the meter yet, running flexible work
    #: not paused: m2g.planner.shedding.reach_kw) covers them: flexible work makes room for
    #: firm work, but once it is all paused firm work waits for room. False: firm work is
    #: never held (as before 2026-12-04).
    hold_firm_beyond_reach: bool = True
    #: ... and while work m2g paused for power waits to come back during an active grid
    #: event (``restore_during_events``), new firm work starts only in the room left beyond
    #: that paused work's kW: paused work first, as restores come before cap lifts. The
    #: room jobs finishing free went to new firm work first: in a 16-rack twin event
    #: (2026-12-06, 23rd session) ~24 firm arrivals (~590 kW estimated) were admitted into
    #: it while the ~29 paused flex-2/3 jobs (~280 kW) waited out the whole event (flex 2 /
    #: 3 kept 0.04 / 0.07 of their work). False: firm work is not held for paused work.
    restore_before_firm: bool = True
    #: Kueue v0.19 keeps a workload's quota reserved until a Retry's requeueAfterSeconds has
    #: passed, and only then evicts it; so m2g asks for at most this long (the policy's own
    #: wait is in the message) and a deferred workload blocks others no longer than this.
    max_retry_hold_seconds: int = 60
    #: A Retry whose wait ends within ``max_retry_hold_seconds`` (a grid event ending in 58 s)
    #: asks Kueue for this much longer: Kueue evicts the workload at the Retry's
    #: ``requeueAt``, and m2g's Ready when the wait ends (the decision flips to Admit) must
    #: reach it first, or the workload loses its quota and queues again (the demo of
    #: 2026-12-07, 20:56:44: the event's end and ``requeueAt`` in the same second, the
    #: deferred job still waiting after the event). A wait over the cap is asked at the cap
    #: (the decision is still Defer then). 0: the wait alone.
    retry_grace_seconds: int = 5
    #: A workload that preempted others to reserve its quota and that m2g holds back keeps
    #: its quota (Pending, not Retry) while its victims wait, up to this long after the
    #: reservation (m2g.planner.preemptors: a Retry hands the quota back to the victims,
    #: and the preemptor preempts them again at its next attempt). 0: Retry as any other.
    preemptor_hold_seconds: int = 600
    #: While a grid event is active, a ClusterQueue all of whose new work the headroom gate
    #: holds gets ``withinClusterQueue: Never`` (the site's value back after the event):
    #: Kueue then does not evict running work for work m2g holds (m2g.planner.eventhold).
    hold_preemption_during_events: bool = True
    #: A gang Kueue TAS split over NVLink domains though it fits in one gets Retry (a new
    #: assignment at its next reservation) while it has waited less than this since it was
    #: created (m2g.planner.split); after that it is admitted as assigned. 0: off.
    split_retry_seconds: int = 120
    #: ... asking again this long after each such Retry (Kueue holds the quota until then).
    split_retry_requeue_seconds: int = 5
    #: An elastic Job's workload (Kueue refuses it a topology request) that fits one NVLink
    #: domain is answered before Kueue reserves quota for it, Ready with the nodeSelector of a
    #: domain that has its pods free, so Kueue's TAS places it there (m2g.planner.preplace).
    #: False (the default): it is answered once Kueue has reserved it, wherever Kueue placed
    #: it. Off until it pays: a 16-rack twin run with it on (2026-12-07, docs/benchmarks.md,
    #: "Twenty-ninth session — Issue 15: NVLink placement of elastic jobs") placed 91.4 % of the
    #: ≤ 72-GPU jobs in one NVLink domain (77.4 % before) but held GPU allocation outside the
    #: event to 65.9 % (86.5 %) and completed 271 jobs (506); a second, choosing domains in
    #: Kueue's view too, 81.4 %, 62.9 % and 311.
    nvlink_preplace: bool = False
    #: Shedding a workload saves its draw above idle, not its whole estimate: a GB300 idles at
    #: ~242 W of ~1,337 W under training (docs/signals.md), so 82% of the estimate.
    shed_saving_fraction: float = 0.82
    #: kW per GPU for a workload that states no estimate (GB300 at training load, docs/signals.md).
    default_kw_per_gpu: float = 1.34
    #: The KAI Topology m2g keeps in step with node labels (templates name it: --set topology=).
    kai_topology_name: str = "nvl72"
    #: Its candidate levels, coarse to fine; a level is used when some GPU node carries the
    #: label. The site's topology mapping (``TopologyLabels.levels``: block, rack, NVLink clique,
    #: hostname), the levels of the Kueue Topology ``m2g topology generate`` writes; the clique
    #: is what m2g's templates request from KAI by default (nvlink_level).
    kai_topology_levels: tuple[str, ...] = L.DEFAULT_TOPOLOGY_LABELS.levels()
    #: kW per GPU when turning a power budget into a KAI Queue GPU limit (None: default_kw_per_gpu).
    kai_kw_per_gpu: float | None = None
    #: Taint a maintenance window's nodes (NoSchedule) this long before it starts, so no new
    #: pod lands there; the same hour the maintenance-hold policy stops admissions.
    maintenance_taint_lead_seconds: float = 3600.0
    #: Start evicting the work on a window's nodes this long before it starts (a window's
    #: ``spec.drainLeadSeconds`` overrides it): time to checkpoint and stop gracefully.
    maintenance_drain_lead_seconds: float = 900.0
    #: In the last this-many seconds before a window, evict everything still on its nodes at
    #: once (until then evictions are paced by the ramp, like shedding).
    drain_deadline_seconds: float = 300.0
    #: Graded curtailment (docs/curtailment.md): cap the GPUs of flexible jobs before pausing
    #: any. False: pauses only (the ``pause-only`` baseline of the twin).
    power_caps: bool = True
    #: The per-GPU caps m2g steps through, as fractions of each GPU's default limit, mildest
    #: first. Below 0.5 the measured throughput collapses (0.19–0.23 at 0.25: dvfs_sweep.csv).
    cap_levels: tuple[float, ...] = (0.875, 0.75, 0.625, 0.5)
    #: Throughput a job may lose over its life, by flex tier 0–3 (Emerald Conductor's tiers).
    flex_allowance: tuple[float, float, float, float] = (0.0, 0.10, 0.25, 0.50)
    #: How long a cap is planned to last when no grid event says (its flex is spent over it).
    cap_horizon_seconds: float = 1800.0
    #: The lease m2g writes on a node's GPUPowerLimit (renewed at half of it); the node agent
    #: restores full power after lease + its grace (60 s) without a renewal.
    cap_lease_seconds: float = 120.0
    #: A thermal taint stays until the rack's inlet is this far under its limit (hysteresis:
    #: an inlet hovering at the limit does not flap the taint).
    thermal_clear_margin_c: float = 1.0
    #: A Reservation keeps its capacity free from this long before its start (its
    #: ``spec.leadSeconds`` overrides it): work admitted then must finish before the start.
    reservation_lead_seconds: float = 3600.0
    #: Expected runtime of a workload without ``m2g.io/expected-runtime-seconds`` (the
    #: templates' default), for reservations and the forecast.
    default_runtime_seconds: float = 3600.0
    #: A workload a reservation holds back is asked again after this long (Retry).
    reservation_retry_seconds: int = 30
