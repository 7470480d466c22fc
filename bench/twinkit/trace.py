"""openb-shaped trace → NVL72 jobs (pure; docs/twin.md "The trace mapping").

``read_trace(text)`` validates the columns of any CSV shaped like Alibaba's openb pod list and
keeps its GPU pods (bad rows are skipped and counted, never raised); ``plan_jobs`` maps them onto
an NVL72 factory and re-times the arrivals to a target GPU demand. Every random choice comes from
one ``random.Random(seed)`` drawn in row order, so a trace and a seed give the same jobs.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import pairwise

REQUIRED = ("name", "num_gpu", "gpu_milli", "qos", "creation_time", "deletion_time",
            "scheduled_time")
TRAY_GPUS = 4  # GPUs per GB300 compute tray (one Kubernetes node)
RACK_GPUS = 72  # one NVL72 rack = one NVLink domain
GAP_RESTART_S = 86_400  # the replay window starts after the trace's last gap longer than this


class TraceError(ValueError):
    """A trace that cannot be used at all; ``str`` is one line."""


@dataclass(frozen=True)
class TracePod:
    """One usable row: a GPU pod that ran (times in the trace's seconds)."""

    name: str
    gpus: float  # num_gpu, or gpu_milli / 1000 for a shared GPU
    qos: str
    created: int  # creation_time: the submission the replay re-enacts
    runtime: int  # deletion_time − scheduled_time
    deleted: int
    censored: bool = False  # still running when the trace ends


@dataclass(frozen=True)
class ReadResult:
    pods: tuple[TracePod, ...]
    rows: int
    skipped: dict[str, int]  # reason → rows


def _int(row: dict[str, str], key: str) -> int | None:
    raw = (row.get(key) or "").strip()
    if not raw or not raw.isascii():  # float() reads "٨" (Arabic-Indic) as 8: not openb's
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) else None


def read_trace(text: str) -> ReadResult:
    """Rows of an openb-shaped CSV; raises TraceError only when no row could ever be used."""
    reader = csv.DictReader(io.StringIO(text.removeprefix("\ufeff")))  # a spreadsheet's BOM
    header = [h.strip() for h in reader.fieldnames or []]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise TraceError(f"trace lacks column(s) {', '.join(missing)} (openb's columns: "
                         f"{', '.join(REQUIRED)})")
    reader.fieldnames = header
    rows, skipped, raw = 0, Counter[str](), []
    for row in reader:
        rows += 1
        reason, pod = _pod(row)
        if pod is None:
            skipped[reason] += 1
        else:
            raw.append(pod)
    end = max((p.deleted for p in raw), default=0)
    pods = tuple(replace(p, censored=p.deleted >= end) for p in raw)
    return ReadResult(tuple(sorted(pods, key=lambda p: (p.created, p.name))), rows,
                      dict(skipped))


def _pod(row: dict[str, str]) -> tuple[str, TracePod | None]:
    num, milli = _int(row, "num_gpu"), _int(row, "gpu_milli")
    created, deleted = _int(row, "creation_time"), _int(row, "deletion_time")
    scheduled = _int(row, "scheduled_time")
    if num is None or created is None or deleted is None:
        return "unreadable number", None
    if num <= 0:
        return "no GPU", None
    if scheduled is None:
        return "never scheduled", None
    if created < 0 or scheduled < created or deleted <= scheduled:
        return "inconsistent times", None
    gpus = float(num)
    if num == 1 and milli is not None and 0 < milli < 1000:
        gpus = milli / 1000.0
    return "", TracePod(str(row.get("name") or "").strip() or f"row-{created}", gpus,
                        str(row.get("qos") or "").strip(), created, deleted - scheduled,
                        deleted)


# ---- mapping onto NVL72 ----------------------------------------------------------------------

@dataclass(frozen=True)
class Mapping:
    """The documented, seeded mapping rule (docs/twin.md)."""

    seed: int = 15
    gpu_scale: float = 16.0  # NVL72 GPUs per trace GPU (before rounding up to whole trays)
    multi_rack_probability: float = 0.25  # an 8-GPU pod becomes a 2-rack (144-GPU) job
    foreign_probability: float = 0.05  # a job arrives without any m2g label
    inference_tier1_probability: float = 0.6  # LS: flex tier 1, else 0
    finetune_probability: float = 0.5  # BE: fine-tuning (tier 2), else batch (tier 3)
    no_checkpoint_probability: float = 0.1  # a checkpointing kind that never checkpoints
    checkpoint_choices_s: tuple[int, ...] = (600, 1800, 3600)  # trace seconds
    training_checkpoint_choices_s: tuple[int, ...] = (1800, 3600)
    #: what a template-made gang of ≤ 72 GPUs asks Kueue TAS for: "required" (the templates)
    #: or "preferred" (one rack only preferred, the mapping before 2026-12-02)
    gang_topology: str = "required"
    #: share of the elastic candidates (``elastic_candidate``) submitted as elastic Jobs that
    #: m2g may shrink (0: none, the mapping before 2026-12-05); drawn from a random stream of
    #: its own, so the other draws, and every other job, stay as without it
    elastic_probability: float = 0.5
    #: an elastic job's ``m2g.io/min-parallelism``: this share of its pods, rounded up
    elastic_min_fraction: float = 0.5


@dataclass(frozen=True)
class TraceJob:
    """One NVL72 job of the replay (times in trace seconds from the replay's start)."""

    name: str  # Kubernetes name: twin-<index>
    source: str  # the trace row's name
    arrival: float
    runtime: float
    gpus: int
    kind: str  # m2g.io/workload-kind ("" for a foreign job)
    tier: int  # m2g.io/flex-tier (0 for a foreign job: m2g's default)
    namespace: str
    priority_class: str
    checkpoint_s: int  # 0: never checkpoints; -1: stateless (an eviction loses nothing)
    foreign: bool  # arrives without m2g labels and annotations
    topology: str  # "" | "required-clique" | "preferred-rack" | "required-block"
    censored: bool
    prefill: bool = False  # already running when the replay starts (warm start)
    min_pods: int = 0  # > 0: an elastic Job m2g may shrink to this many pods (0: not elastic)

    @property
    def elastic(self) -> bool:
        return self.min_pods > 0

    @property
    def pods(self) -> int:
        return max(1, self.gpus // TRAY_GPUS)

    @property
    def gpus_per_pod(self) -> int:
        return self.gpus // self.pods

    @property
    def work(self) -> float:
        """GPU-seconds at full speed (trace time)."""
        return self.gpus * self.runtime


def nvl72_gpus(trace_gpus: float, m: Mapping, rng: random.Random) -> int:
    """Trace GPUs × scale, rounded up to whole trays and capped at one rack; an 8-GPU pod may
    become a two-rack job (the trace has no gangs; large NVL72 training spans racks)."""
    if trace_gpus >= 8 and rng.random() < m.multi_rack_probability:
        return 2 * RACK_GPUS
    trays = max(1, math.ceil(trace_gpus * m.gpu_scale / TRAY_GPUS - 1e-9))
    return min(RACK_GPUS, trays * TRAY_GPUS)


def _flavour(qos: str, m: Mapping, rng: random.Random) -> tuple[str, int, str, str, int]:
    """(kind, tier, namespace, priority class, checkpoint seconds) by QoS class."""
    q = qos.upper()
    if q == "LS":
        tier = 1 if rng.random() < m.inference_tier1_probability else 0
        return "inference", tier, "inference", "m2g-serving", -1
    if q in ("BURSTABLE", "GUARANTEED"):
        ckpt = rng.choice(m.training_checkpoint_choices_s)
        return "training", 0, "prod-training", "m2g-training", ckpt
    # BE and anything unknown: flexible research work
    finetune = rng.random() < m.finetune_probability
    ckpt = 0 if rng.random() < m.no_checkpoint_probability else rng.choice(m.checkpoint_choices_s)
    if finetune:
        return "fine-tuning", 2, "research", "m2g-fine-tuning", ckpt
    return "batch", 3, "research", "m2g-batch", ckpt


def job_topology(gpus: int, foreign: bool, gang: str = "required") -> str:
    """The TAS request a job carries. An m2g-made gang asks for what the project's templates
    write (m2g.templates.sizing): up to one NVLink domain, that domain is **required**; more,
    one block is. A foreign job (not made by the templates) of more than one pod only prefers
    one rack, as a hand-written Kueue job often does; one pod needs nothing. ``gang``
    "preferred" makes every gang only prefer its rack (Kueue then splits it when no rack has
    room in its view)."""
    if gpus > RACK_GPUS:
        return "required-block"
    if gpus <= TRAY_GPUS:
        return ""
    return "preferred-rack" if foreign or gang == "preferred" else "required-clique"


ELASTIC_KINDS = ("fine-tuning", "batch")  # data-parallel training and batch work, tier ≥ 2


def elastic_candidate(kind: str, gpus: int, foreign: bool) -> bool:
    """A job a site would run as an elastic Job: data-parallel fine-tuning or batch work (flex
    tier ≥ 1 by its kind) of more than one pod within one rack, made by the templates (a
    foreign job declares no range). A two-rack job stays a fixed gang: Kueue v0.19 refuses an
    elastic Job with a required topology, and one block is what it needs."""
    return (not foreign and kind in ELASTIC_KINDS and TRAY_GPUS < gpus <= RACK_GPUS)


def elastic_min_pods(job: TraceJob, m: Mapping, rng: random.Random) -> int:
    """0 (fixed size), or the fewest pods the job may run on (``m2g.io/min-parallelism``).
    Draws once per candidate, from ``rng`` (the elastic stream), in row order."""
    if not elastic_candidate(job.kind, job.gpus, job.foreign) or m.elastic_probability <= 0:
        return 0
    if rng.random() >= m.elastic_probability:
        return 0
    return max(1, min(job.pods, math.ceil(job.pods * m.elastic_min_fraction - 1e-9)))


def map_pods(pods: Sequence[TracePod], m: Mapping) -> list[TraceJob]:
    """Every pod → one job, arrival = creation time relative to the first pod."""
    rng = random.Random(m.seed)
    elastic_rng = random.Random(f"{m.seed}/elastic")  # its own stream: other draws unchanged
    t0 = pods[0].created if pods else 0
    jobs = []
    for i, p in enumerate(pods):
        gpus = nvl72_gpus(p.gpus, m, rng)
        kind, tier, ns, prio, ckpt = _flavour(p.qos, m, rng)
        foreign = rng.random() < m.foreign_probability
        if foreign:  # no m2g labels: m2g's defaults (tier 0, kind unspecified, no checkpoint)
            kind, tier, ckpt, prio = "", 0, 0, ""
            ns = "research"
        topology = job_topology(gpus, foreign, m.gang_topology)
        job = TraceJob(f"twin-{i:05d}", p.name, float(p.created - t0), float(p.runtime),
                       gpus, kind, tier, ns, prio, ckpt, foreign, topology, p.censored)
        low = elastic_min_pods(job, m, elastic_rng)
        if low:  # Kueue v0.19: an elastic Job carries no topology request (unconstrained)
            job = replace(job, min_pods=low, topology="")
        jobs.append(job)
    return jobs


def window_start(pods: Sequence[TracePod], gap_s: int = GAP_RESTART_S) -> int:
    """Creation time of the first pod after the trace's last gap longer than ``gap_s``."""
    start = pods[0].created if pods else 0
    for a, b in pairwise(pods):
        if b.created - a.created > gap_s:
            start = b.created
    return start


# ---- re-timing -------------------------------------------------------------------------------

def offered_gpus(jobs: Sequence[TraceJob], compression: float, horizon: float) -> float:
    """Mean GPUs the jobs arriving within ``horizon`` ask for, once arrivals are divided by
    ``compression`` (Little's law with runtimes clipped at the horizon)."""
    busy = sum(j.gpus * min(j.runtime, horizon) for j in jobs
               if j.arrival / compression <= horizon)
    return busy / horizon if horizon > 0 else 0.0


def compression_for(jobs: Sequence[TraceJob], target_gpus: float, horizon: float) -> float:
    """The arrival compression that makes ``offered_gpus`` reach ``target_gpus`` (bisection;
    the largest useful one when the whole trace offers less)."""
    if not jobs or horizon <= 0:
        return 1.0
    hi = max(1.0, jobs[-1].arrival / horizon * 1.0001)
    if offered_gpus(jobs, hi, horizon) < target_gpus:
        return hi
    lo = 1e-6
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if offered_gpus(jobs, mid, horizon) < target_gpus:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class Plan:
    jobs: tuple[TraceJob, ...]
    rows: int
    skipped: dict[str, int]
    window_start: int  # trace seconds
    compression: float  # arrivals divided by this (1.0 = replayed as recorded)
    offered_gpus: float
    censored: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def plan_jobs(read: ReadResult, m: Mapping, *, factory_gpus: int, horizon_s: float,
              demand: float | None = 0.9, start: int | None = None,
              warm_s: float = 0.0) -> Plan:
    """The replay: the window from ``start`` (default ``window_start``), mapped, re-timed so
    the offered demand is ``demand`` × the factory (None: as recorded), cut at the horizon.
    ``warm_s`` (trace seconds, after re-timing) is history: the replay starts that far into
    the window, with the jobs that would still be running then submitted at once with the
    work they have left (``prefill``), so the factory is in its steady state from the start."""
    if not read.pods:
        raise TraceError("the trace has no usable GPU pod (skipped: " + (", ".join(
            f"{n} {r}" for r, n in sorted(read.skipped.items())) or "nothing read") + ")")
    begin = window_start(read.pods) if start is None else start
    pods = [p for p in read.pods if p.created >= begin]
    if not pods:
        raise TraceError(f"no GPU pod is created at or after the window start {begin} s")
    jobs = map_pods(pods, m)
    notes: list[str] = []
    factor = 1.0
    if demand is not None:
        target = demand * factory_gpus
        factor = compression_for(jobs, target, horizon_s + warm_s)
        if offered_gpus(jobs, factor, horizon_s + warm_s) < target * 0.99:
            notes.append(f"the whole window offers only "
                         f"{offered_gpus(jobs, factor, horizon_s + warm_s):.0f} GPUs of the "
                         f"{target:.0f} asked for")
    timed = tuple(t for t in (_retimed(j, factor, warm_s) for j in jobs
                              if j.arrival / factor <= horizon_s + warm_s) if t is not None)
    return Plan(timed, read.rows, read.skipped, begin, factor,
                offered_gpus(jobs, factor, horizon_s + warm_s),
                sum(1 for j in timed if j.censored), tuple(notes))


def _retimed(j: TraceJob, factor: float, warm_s: float) -> TraceJob | None:
    """Arrival re-timed and shifted by the warm-up; a job of the warm-up still running at its
    end arrives at 0 with the runtime it has left; one that ended before is dropped."""
    arrival = j.arrival / factor - warm_s
    if arrival >= 0:
        return replace(j, arrival=arrival)
    left = j.runtime + arrival
    return replace(j, arrival=0.0, runtime=left, prefill=True) if left > 0 else None


def size_histogram(jobs: Sequence[TraceJob]) -> dict[int, float]:
    """GPU count → share of jobs (the task-size distribution FGD weighs fragments by)."""
    counts = Counter(j.gpus for j in jobs)
    total = sum(counts.values())
    return {g: n / total for g, n in sorted(counts.items())} if total else {}
