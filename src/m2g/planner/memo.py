"""What one plan may keep for the next (issue 14): the parts of a reconcile that do not depend
on the clock, kept with exactly the inputs they were worked out from and reused only while
those inputs are the same.

A ``PlanMemo`` is owned by its caller — the controller's Manager keeps one, as it keeps the
Evaluator and the snapshot memo — and handed to ``make_plan``; nothing in it reads a clock or
does I/O, and a plan made with it equals the plan made without it (tests/unit/
test_plan_memo_steps.py: random sequences of changes, each plan compared). What it keeps:

* ``exclusive``: ``m2g.planner.curtail.exclusive_workloads`` — which admitted workloads are
  alone on their nodes — with the admitted workloads' keys and a copy of the placements it
  was worked out from (a copy: a mapping changed in place is then a miss, not a stale hit).
  The snapshot memo hands the same placements on while no pod and no workload link changed.
* ``ending``: per drawing workload, what ``m2g.planner.shedding.ending`` reads of it that does
  not move with the clock — whether it can end soon at all (a declared runtime, not shed,
  admitted, every pod running), from when its runtime counts, its throughput share and the kW
  its end frees — with the WorkloadState object and the LivePods it was read from (the
  snapshot memo keeps an unchanged workload's state object, and a changed one is a new object,
  so a miss; the LivePods are compared by value: any pod's change makes the snapshot build
  them all anew) and the config. Only the time test runs per workload per reconcile.

Nothing else is kept: the Preemption and Admission stages' results move with the clock
(waitSeconds, a checkpoint's age, an event's remaining seconds are read by the shipped
policies), so a memo of them by the workload's inputs would never hit (docs/benchmarks.md,
twenty-ninth and thirty-first sessions).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from m2g.model.cluster import LivePods, WorkloadState

#: what ``ending`` keeps of one workload: None (it cannot end soon: no runtime, shed, never
#: admitted, a pod waiting or stopping, no throughput) or (start, runtime, throughput × share,
#: kW its end frees)
EndingFacts = tuple[datetime, float, float, float] | None


@dataclass
class PlanMemo:
    """The parts of a plan kept for the next one (see the module). ``reused`` counts the
    reuses by part (what a test and a bench read)."""

    #: (a copy of the placements, the admitted workloads' keys in order, the result)
    exclusive: tuple[dict[str, tuple[str, ...]], list[str], frozenset[str]] | None = None
    #: (the config's ending_lead_seconds, default_kw_per_gpu, shed_saving_fraction) the
    #: entries were read with, and by workload key: (its state, its LivePods or ``NOT_READ``,
    #: its facts)
    ending_config: tuple[float, float, float] | None = None
    ending: dict[str, tuple[WorkloadState, LivePods | object, EndingFacts]] = field(
        default_factory=dict)
    reused: Counter[str] = field(default_factory=Counter)

    def clear(self) -> None:
        """Forget everything kept (the next plan works everything out)."""
        self.exclusive, self.ending_config = None, None
        self.ending = {}


#: the LivePods mark of a snapshot that did not read the pods (``live_pods`` None)
NOT_READ = object()
