"""The twin's trace mapping: validation, skipped rows, NVL72 sizes, seeded flavours, re-timing."""

from __future__ import annotations

import pytest
from twinkit import trace as T

import tests.unit.twin_path as tp

HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
          "deletion_time,scheduled_time\n")


def csv_of(*rows: str) -> str:
    return HEADER + "".join(r + "\n" for r in rows)


def test_missing_columns_is_one_line_error() -> None:
    with pytest.raises(T.TraceError, match=r"lacks column.*num_gpu"):
        T.read_trace("name,qos\npod-1,LS\n")


def test_bad_rows_are_skipped_and_counted() -> None:
    read = T.read_trace(csv_of(
        "p0,1,1,1,1000,,LS,Running,0,100,10",       # good
        "p1,1,1,0,0,,BE,Running,0,100,10",          # CPU only
        "p2,1,1,1,1000,,LS,Pending,5,100,",         # never scheduled
        "p3,1,1,x,1000,,LS,Running,0,100,10",       # unreadable
        "p4,1,1,1,1000,,LS,Running,50,40,60",       # deleted before scheduled
        "p5,1,1,2,1000,,BE,Running,7,900,8",        # good
    ))
    assert read.rows == 6
    assert [p.name for p in read.pods] == ["p0", "p5"]
    assert read.skipped == {"no GPU": 1, "never scheduled": 1, "unreadable number": 1,
                            "inconsistent times": 1}
    assert read.pods[1].runtime == 892
    assert read.pods[1].censored  # ends last: still running when the trace ends


def test_shared_gpu_counts_as_its_fraction() -> None:
    read = T.read_trace(csv_of("p0,1,1,1,250,,LS,Running,0,100,10"))
    assert read.pods[0].gpus == 0.25


def test_no_usable_row_is_an_error_not_a_traceback() -> None:
    read = T.read_trace(csv_of("p1,1,1,0,0,,BE,Running,0,100,10"))
    with pytest.raises(T.TraceError, match=r"no usable GPU pod.*1 no GPU"):
        T.plan_jobs(read, T.Mapping(), factory_gpus=144, horizon_s=3600)


@pytest.mark.parametrize(("gpus", "expected"), [(0.25, 4), (0.5, 8), (1, 16), (2, 32),
                                                (4, 64), (8, 72)])
def test_nvl72_sizes_are_whole_trays_within_a_rack(gpus: float, expected: int) -> None:
    import random

    m = T.Mapping(multi_rack_probability=0.0)
    assert T.nvl72_gpus(gpus, m, random.Random(1)) == expected


def test_eight_gpu_pods_can_become_two_rack_jobs() -> None:
    import random

    m = T.Mapping(multi_rack_probability=1.0)
    assert T.nvl72_gpus(8, m, random.Random(1)) == 144


def test_mapping_is_seeded_and_follows_qos() -> None:
    read = T.read_trace(csv_of(*[f"p{i},1,1,1,1000,,{q},Running,{i},{i + 500},{i}"
                                 for i, q in enumerate(["LS", "BE", "Burstable"] * 30)]))
    a = T.map_pods(read.pods, T.Mapping(seed=3))
    b = T.map_pods(read.pods, T.Mapping(seed=3))
    c = T.map_pods(read.pods, T.Mapping(seed=4))
    assert a == b and a != c
    for job, pod in zip(a, read.pods, strict=True):
        if job.foreign:
            assert (job.kind, job.tier, job.checkpoint_s) == ("", 0, 0)
        elif pod.qos == "LS":
            assert job.kind == "inference" and job.tier in (0, 1) and job.checkpoint_s == -1
        elif pod.qos == "BE":
            assert job.tier in (2, 3) and job.namespace == "research"
        else:
            assert job.kind == "training" and job.tier == 0
    assert {j.pods * j.gpus_per_pod for j in a} == {j.gpus for j in a}


def test_window_starts_after_the_last_long_gap() -> None:
    read = T.read_trace(csv_of("a,1,1,1,1000,,LS,Running,0,10,0",
                               "b,1,1,1,1000,,LS,Running,200000,200010,200000",
                               "c,1,1,1,1000,,LS,Running,200100,200110,200100"))
    assert T.window_start(read.pods) == 200000


def test_retiming_reaches_the_target_demand_and_keeps_sizes() -> None:
    rows = [f"p{i},1,1,1,1000,,BE,Running,{i * 600},{i * 600 + 1800},{i * 600}"
            for i in range(400)]
    read = T.read_trace(csv_of(*rows))
    plan = T.plan_jobs(read, T.Mapping(), factory_gpus=1152, horizon_s=6 * 3600, demand=0.3)
    assert plan.offered_gpus == pytest.approx(0.3 * 1152, rel=0.05)
    assert plan.compression > 1
    assert all(j.runtime == 1800 for j in plan.jobs)  # runtimes kept, arrivals compressed
    assert max(j.arrival for j in plan.jobs) <= 6 * 3600
    as_recorded = T.plan_jobs(read, T.Mapping(), factory_gpus=1152, horizon_s=6 * 3600,
                              demand=None)
    assert as_recorded.compression == 1.0
    assert [j.gpus for j in as_recorded.jobs] == [j.gpus for j in plan.jobs[:len(
        as_recorded.jobs)]]


def test_a_thin_trace_says_it_cannot_reach_the_demand() -> None:
    read = T.read_trace(csv_of("p0,1,1,1,1000,,LS,Running,0,60,0"))
    plan = T.plan_jobs(read, T.Mapping(), factory_gpus=1152, horizon_s=3600)
    assert plan.notes and "offers only" in plan.notes[0]


def test_the_shipped_trace_maps() -> None:
    read = T.read_trace((tp.DATA / "openb" / "openb_pod_list_default.csv").read_text())
    assert read.rows == 8152
    assert read.skipped["no GPU"] == 1088
    plan = T.plan_jobs(read, T.Mapping(), factory_gpus=1152, horizon_s=9 * 3600)
    assert plan.offered_gpus == pytest.approx(0.9 * 1152, rel=0.02)
    assert all(j.gpus % T.TRAY_GPUS == 0 for j in plan.jobs)


def test_warm_start_prefills_what_would_be_running() -> None:
    rows = [f"p{i},1,1,1,1000,,BE,Running,{i * 1000},{i * 1000 + 5000},{i * 1000}"
            for i in range(20)]
    read = T.read_trace(csv_of(*rows))
    plan = T.plan_jobs(read, T.Mapping(), factory_gpus=1152, horizon_s=10_000, demand=None,
                       warm_s=7_500)
    pre = [j for j in plan.jobs if j.prefill]
    # arrivals 3000..7000 still run at 7500: they start at once with what they have left
    assert [j.source for j in pre] == ["p3", "p4", "p5", "p6", "p7"]
    assert [j.runtime for j in pre] == [500, 1500, 2500, 3500, 4500]
    assert all(j.arrival == 0 for j in pre)
    later = [j for j in plan.jobs if not j.prefill]
    assert later[0].source == "p8" and later[0].arrival == 500 and later[0].runtime == 5000


def test_a_template_gang_requires_its_nvlink_domain_a_foreign_one_prefers_a_rack() -> None:
    from twinkit.jobs import PREFERRED, REQUIRED, manifest

    from m2g.model import labels as L
    from m2g.sim.power import PowerModel

    assert T.job_topology(4, foreign=False) == T.job_topology(4, foreign=True) == ""
    assert T.job_topology(16, foreign=False) == "required-clique"
    assert T.job_topology(72, foreign=True) == "preferred-rack"
    assert T.job_topology(144, foreign=False) == "required-block"
    job = T.TraceJob("twin-00001", "p", 0.0, 600.0, 16, "training", 0, "training",
                     "m2g-training", 1800, False, T.job_topology(16, False), False)
    ann = manifest(job, 60.0, PowerModel())["spec"]["template"]["metadata"]["annotations"]
    assert ann[REQUIRED] == L.GPU_CLIQUE and PREFERRED not in ann
    foreign = T.TraceJob("twin-00002", "p", 0.0, 600.0, 16, "", 0, "research", "", 0, True,
                         T.job_topology(16, True), False)
    ann = manifest(foreign, 60.0, PowerModel())["spec"]["template"]["metadata"]["annotations"]
    assert ann == {PREFERRED: L.RACK}


def test_gangs_can_be_made_to_only_prefer_a_rack() -> None:
    assert T.job_topology(16, foreign=False, gang="preferred") == "preferred-rack"
    read = T.read_trace(csv_of(*[f"p{i},1,1,1,1000,,Burstable,Running,{i},{i + 500},{i}"
                                 for i in range(20)]))
    a = T.map_pods(read.pods, T.Mapping(seed=3, multi_rack_probability=0.0))
    b = T.map_pods(read.pods, T.Mapping(seed=3, multi_rack_probability=0.0,
                                        gang_topology="preferred"))
    assert {j.topology for j in a if not j.foreign} == {"required-clique"}
    assert {j.topology for j in b} == {"preferred-rack"}
    assert [j.gpus for j in a] == [j.gpus for j in b]  # the same draws


def test_a_bom_and_non_ascii_digits() -> None:
    """Thirtieth session probe: a UTF-8 BOM (a spreadsheet's export) made the first column
    read as missing ("trace lacks column(s) name"), and float() read Arabic-Indic digits as
    numbers ("٨" GPUs as 8): not a number openb writes, so the row is skipped and counted."""
    read = T.read_trace("\ufeff" + csv_of("p0,1,1,1,1000,,LS,Running,0,100,10",
                                          "p1,1,1,\u0668,1000,,LS,Running,0,100,10"))
    assert [p.name for p in read.pods] == ["p0"]
    assert read.skipped == {"unreadable number": 1}
