"""A gang Kueue TAS split over NVLink domains though it fits in one gets Retry while it may
still wait (m2g.planner.split)."""

from __future__ import annotations

from dataclasses import replace

from m2g.model.cluster import CheckState, ClusterSnapshot, WorkloadState
from m2g.model.factory import FactorySnapshot, Node, PowerDomain, Rack
from m2g.planner.split import RULE, split
from tests.unit.test_curtail import CFG, NOW
from tests.unit.test_headroom import pending, ready
from tests.unit.test_preemptors import victim


def two_racks() -> FactorySnapshot:
    nodes = tuple(Node(f"r{r}-n{i}", f"rack-{r}", clique=f"c{r}") for r in (0, 1)
                  for i in range(18))
    racks = tuple(Rack(f"rack-{r}", "b0", "pd-0", clique=f"c{r}") for r in (0, 1))
    return FactorySnapshot(now=NOW, power_domains=(PowerDomain("pd-0"),), racks=racks,
                           nodes=nodes)


def gang(name: str, gpus: int = 16, waited: int = 10, **kw: object) -> WorkloadState:
    w = pending(name, 0, gpus=gpus)
    view = w.view.model_copy(update={"topology_assigned": True, "wait_seconds": waited})
    return replace(w, view=view, **kw)  # type: ignore[arg-type]


def at(*placed: tuple[WorkloadState, tuple[str, ...]]) -> ClusterSnapshot:
    return ClusterSnapshot(two_racks(), tuple(w for w, _ in placed),
                           placements={w.key: hosts for w, hosts in placed})


SPLIT = ("r0-n16", "r0-n17", "r1-n0", "r1-n1")
WHOLE = ("r0-n0", "r0-n1", "r0-n2", "r0-n3")


def test_a_split_gang_that_fits_in_one_clique_gets_retry() -> None:
    a, b = gang("split"), gang("whole")
    out = split([ready(a), ready(b)], at((a, SPLIT), (b, WHOLE)), CFG)
    assert [u.state for u in out] == [CheckState.RETRY, CheckState.READY]
    assert out[0].rule == RULE and out[0].requeue_after_seconds == CFG.split_retry_requeue_seconds
    assert "2 NVLink domains (c0, c1)" in out[0].message and "110 s from now" in out[0].message


def test_after_its_wait_it_is_admitted_as_assigned() -> None:
    late = gang("late", waited=CFG.split_retry_seconds)
    assert split([ready(late)], at((late, SPLIT)), CFG) == [ready(late)]
    off = replace(CFG, split_retry_seconds=0)
    early = gang("early")
    assert split([ready(early)], at((early, SPLIT)), off) == [ready(early)]


def test_what_does_not_fit_in_one_clique_or_is_unknown_is_left_alone() -> None:
    big = gang("big", gpus=80)  # more than one clique (72 GPUs)
    odd = gang("odd")
    hosts = ("r0-n0", "elsewhere")
    s = at((big, SPLIT), (odd, hosts))
    assert split([ready(big), ready(odd)], s, CFG) == [ready(big), ready(odd)]


def test_a_preemptor_whose_victims_wait_is_left_to_the_hold() -> None:
    p = gang("p", uid="uid-p")
    s = replace(at((p, SPLIT)), workloads=(p, victim("v", "uid-p")))
    assert split([ready(p)], s, CFG) == [ready(p)]


def test_a_retry_already_given_is_not_written_again() -> None:
    a = gang("again", check_state=CheckState.RETRY)
    assert split([ready(a)], at((a, SPLIT)), CFG) == []


def test_an_elastic_jobs_workload_is_left_alone() -> None:
    """Kueue places an elastic Job unconstrained (it refuses a topology request on one): a
    split is its placement. And the new slice that grows one back must not get Retry: in a
    16-rack twin run (2026-12-06) that Retry stopped three running flex-2 jobs m2g had grown
    back, and they never ran again. Before, they got Retry like any gang."""
    grown = gang("grown", elastic_job="grown", parallelism=4, min_parallelism=2,
                 full_parallelism=4)
    assert split([ready(grown)], at((grown, SPLIT)), CFG) == [ready(grown)]
