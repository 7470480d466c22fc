"""Golden tests of the operator commands' renderers (m2g queues / workloads / signals / explain)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from m2g.model.cluster import (
    CheckState,
    ClusterSnapshot,
    FlavorQuota,
    FlavorState,
    Phase,
    QueueState,
    WorkloadState,
)
from m2g.model.factory import (
    MISSING,
    FactorySnapshot,
    GridEvent,
    MaintenanceWindow,
    Node,
    PowerDomain,
    Rack,
    Reading,
)
from m2g.model.inputs import WorkloadKind, WorkloadView
from m2g.planner.explain import explain
from m2g_cli.selectors import parse_selector
from m2g_cli.views import (
    Listing,
    Output,
    SortKeyError,
    explanation_data,
    render_explanation,
    render_preview,
    render_queues,
    render_signals,
    render_workloads,
    sort_items,
    sort_lists,
    sort_path,
)
from tests.unit.goldens import golden
from tests.unit.policy_helpers import evaluator, policy

NOW = datetime(2026, 11, 29, 16, 0, tzinfo=UTC)


def cluster() -> ClusterSnapshot:
    nodes = tuple(Node(f"r{r}-n{i:02d}", f"rack-{r}", gpus_allocated=2 if i % 3 == 0 else 0,
                       reasons=("GpuXid",) if (r, i) == (1, 4) else ())
                  for r in range(2) for i in range(18))
    racks = (Rack("rack-0", "block-0", "pd-0", "uuid.0", Reading(118.4, 4.0), 132.0,
                  Reading(27.5, 4.0), 32.0),
             Rack("rack-1", "block-0", "pd-0", "uuid.1", Reading(None, 400.0), 132.0,
                  Reading(31.8, 400.0), 32.0, thermal_alarm=True))
    f = FactorySnapshot(
        now=NOW, site="phx-1", site_budget_kw=300.0, site_limit_c=32.0,
        power_domains=(PowerDomain("pd-0", 300.0),), racks=racks, nodes=nodes,
        maintenance=(MaintenanceWindow("swap-pdu", NOW + timedelta(hours=2),
                                       NOW + timedelta(hours=4), racks=("rack-1",)),),
        grid_events=(GridEvent("srp-dr-0529", NOW - timedelta(minutes=5),
                               NOW + timedelta(hours=3), level=2, target_kw=180.0),))

    def wl(name: str, phase: Phase, state: CheckState | None, tier: int, gpus: int,
           msg: str = "", shed: bool = False) -> WorkloadState:
        v = WorkloadView(name=name, namespace="ml", queue="research", cluster_queue="research",
                         kind=WorkloadKind.TRAINING, flex_tier=tier, gpus=gpus, wait_seconds=754,
                         labels={"team": "llm" if "llama" in name else "search"})
        return WorkloadState("ml", name, v, phase, "research", "m2g-policy", state, msg,
                             shed_by_m2g=shed)
    workloads = (wl("llama-8b-ft", Phase.ADMITTED, CheckState.READY, 0, 8),
                 wl("sweep-17", Phase.RESERVED, CheckState.PENDING, 2, 16),
                 wl("pretrain-405b", Phase.INACTIVE, CheckState.READY, 3, 64, shed=True))
    queues = (QueueState("prod", (FlavorQuota("gb300", "nvidia.com/gpu", 96, 96),),
                         cohort="org", used_gpus=40, weight=1.0),
              QueueState("research", (FlavorQuota("gb300", "nvidia.com/gpu", 30, 48),),
                         cohort="org", used_gpus=8, pending_workloads=3, stop_policy="Hold"))
    return ClusterSnapshot(f, workloads, queues, (FlavorState("gb300"),))


@pytest.mark.parametrize("out", [Output.TABLE, Output.WIDE, Output.JSON])
def test_queues(out: Output) -> None:
    golden(f"queues_{out.value}.txt", render_queues(cluster(), out))


def raws() -> dict[str, dict[str, Any]]:
    """The Workload objects behind cluster()'s workloads: owners, ages, spec.active."""
    def obj(name: str, minutes: int, owners: list[dict[str, Any]], active: bool = True
            ) -> dict[str, Any]:
        created = (NOW - timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")
        return {"metadata": {"name": name, "namespace": "ml", "creationTimestamp": created,
                             "ownerReferences": owners}, "spec": {"active": active}}
    return {"ml/llama-8b-ft": obj("llama-8b-ft", 3, [
                {"kind": "Pod", "name": "not-it"},
                {"kind": "PyTorchJob", "name": "llama-ft", "controller": True}]),
            "ml/sweep-17": obj("sweep-17", 300, [{"kind": "Job", "name": "sweep"}]),
            "ml/pretrain-405b": obj("pretrain-405b", 1, [], active=False)}


@pytest.mark.parametrize("out", [Output.TABLE, Output.WIDE, Output.YAML])
def test_workloads(out: Output) -> None:
    golden(f"workloads_{out.value}.txt", render_workloads(cluster(), out, raws=raws()))


def test_workload_job_active_and_age_come_from_the_object() -> None:
    items = json.loads(render_workloads(cluster(), Output.JSON, raws=raws()))["items"]
    assert [(i["job"], i["active"], i["ageSeconds"]) for i in items] == [
        ("llama-ft", True, 180.0), ("sweep", True, 18000.0), ("", False, 60.0)]
    bare = json.loads(render_workloads(cluster(), Output.JSON))["items"]  # no objects
    assert [(i["job"], i["active"], i["ageSeconds"]) for i in bare] == [
        ("", True, None), ("", True, None), ("", False, None)]
    table = render_workloads(cluster(), Output.WIDE, raws=raws()).splitlines()
    assert table[0].split()[:5] == ["NAMESPACE", "NAME", "JOB", "QUEUE", "CLUSTERQUEUE"]
    assert table[2].split()[2] == "sweep" and table[2].split()[-1] == "5h"
    assert table[3].split()[10] == "false" and table[0].split()[-1] == "AGE"


def test_the_namespace_column_only_for_every_namespace() -> None:
    """kubectl's habit: ``get -n NS`` (or the context's namespace) has no NAMESPACE column,
    ``get -A`` has it first; the other cells are the same."""
    every = render_workloads(cluster(), Output.TABLE, raws=raws()).splitlines()
    ns = cluster().workloads[0].namespace
    one = render_workloads(cluster(), Output.TABLE, namespace=ns, raws=raws()).splitlines()
    assert every[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert one[0].split()[:2] == ["NAME", "JOB"]
    mine = [line.split()[1:] for line in every[1:] if line.split()[0] == ns]
    assert mine and [line.split() for line in one[1:]] == mine


def test_workloads_filters() -> None:
    text = render_workloads(cluster(), Output.TABLE, namespace="other")
    assert text == "No workloads found.\n"


def test_workloads_label_selector() -> None:
    def names(selector: str) -> list[str]:
        text = render_workloads(cluster(), Output.JSON, labels=parse_selector(selector))
        return [w["name"] for w in json.loads(text)["items"]]
    assert names("team=llm") == ["llama-8b-ft"]
    assert names("team!=llm") == ["sweep-17", "pretrain-405b"]
    assert names("team in (llm,search)") == ["llama-8b-ft", "sweep-17", "pretrain-405b"]
    assert names("missing") == []


@pytest.mark.parametrize("render", [render_queues, render_workloads])
def test_lists_are_kubectl_lists_of_the_same_items(render: Any) -> None:
    """-o json|yaml of a list command: apiVersion v1, kind List, the rows as items."""
    for out in (Output.JSON, Output.YAML):
        text = render(cluster(), out)
        data = json.loads(text) if out is Output.JSON else yaml.safe_load(text)
        assert list(data) == ["apiVersion", "kind", "items"]
        assert (data["apiVersion"], data["kind"]) == ("v1", "List")
        assert data["items"] and all("name" in i or "clusterQueue" in i for i in data["items"])


def test_no_headers_drops_only_the_header_line() -> None:
    full = render_workloads(cluster(), Output.WIDE).splitlines()
    bare = render_workloads(cluster(), Output.WIDE, listing=Listing(no_headers=True))
    assert full[0].startswith("NAMESPACE") and bare.splitlines() == full[1:]
    assert render_queues(cluster(), Output.TABLE, Listing(True)).splitlines() == \
        render_queues(cluster(), Output.TABLE).splitlines()[1:]


def test_sort_by_a_field_of_the_items() -> None:
    def names(expr: str, out: Output = Output.JSON) -> list[str]:
        text = render_workloads(cluster(), out, listing=Listing(sort_by=expr))
        if out is Output.JSON:
            return [w["name"] for w in json.loads(text)["items"]]
        return [line.split()[1] for line in text.splitlines()[1:]]
    assert names(".gpus") == ["llama-8b-ft", "sweep-17", "pretrain-405b"]
    assert names("{.name}") == ["llama-8b-ft", "pretrain-405b", "sweep-17"]
    assert names(".name", Output.TABLE) == names(".name")
    assert names(".flexTier") == ["llama-8b-ft", "sweep-17", "pretrain-405b"]
    queues = json.loads(render_queues(cluster(), Output.JSON, Listing(sort_by=".usedGpus")))
    assert [q["clusterQueue"] for q in queues["items"]] == ["research", "prod"]


def test_sort_by_puts_numbers_before_text_and_empty_values_last() -> None:
    items = [{"v": None}, {"v": "b"}, {"v": 10}, {}, {"v": "a"}, {"v": 2.5}, {"v": ""}]
    assert [i.get("v", "-") for i in sort_items(items, ".v")] == [2.5, 10, "a", "b", None, "-",
                                                                   ""]


@pytest.mark.parametrize("expr", ["name", ".", "{.name", ".a..b", "$.name", ".a[0]", ""])
def test_sort_by_that_is_not_a_field_path_is_one_line(expr: str) -> None:
    with pytest.raises(SortKeyError, match="not a field path"):
        sort_path(expr)


def test_sort_by_a_field_no_item_has_names_the_fields() -> None:
    with pytest.raises(SortKeyError, match=r"'.nope': no such field.*\.name, \.job"):
        render_workloads(cluster(), Output.TABLE, listing=Listing(sort_by=".nope"))
    assert render_workloads(cluster(), Output.TABLE, namespace="other",
                            listing=Listing(sort_by=".nope")) == "No workloads found.\n"


def test_workloads_selected_by_the_api_server() -> None:
    text = render_workloads(cluster(), Output.JSON, keys={"ml/sweep-17", "other/x"})
    assert [w["name"] for w in json.loads(text)["items"]] == ["sweep-17"]


@pytest.mark.parametrize("out", [Output.TABLE, Output.WIDE])
def test_signals(out: Output) -> None:
    text = render_signals(cluster().factory, out)
    assert "stale" in text and "ALARM" in text  # rack-1's stale power and its alarm
    golden(f"signals_{out.value}.txt", text)


def test_signals_says_what_it_has_no_reading_or_budget_for() -> None:
    """A site with no budget and no telemetry (m2g installed, Prometheus not yet pointed at
    it): the site line says so instead of "draw stale kW, budget 0 kW, ... 0.0 °C"."""
    racks = (Rack("rack-0", "b0", "pd0", power_kw=MISSING, inlet_c=MISSING),
             Rack("rack-1", "b0", "pd0", power_kw=MISSING, inlet_c=MISSING))
    f = FactorySnapshot(now=NOW, site="site", racks=racks)
    first = render_signals(f, Output.TABLE).splitlines()[0]
    assert first == ("Site site: draw stale, budget none, limit in force none; "
                     "no inlet readings"), first


def test_signals_json_is_machine_readable() -> None:
    data = json.loads(render_signals(cluster().factory, Output.JSON))
    assert data["site"]["drawKw"] is None  # one rack stale: the site sum is stale
    assert data["gridEvent"]["targetKw"] == 180.0


def test_signals_sorted_by_a_rack_field_without_the_racks_header() -> None:
    """--sort-by sorts the racks (every -o); --no-headers drops only the racks' header
    line: the site, grid-event and maintenance lines stay."""
    f = cluster().factory
    full = render_signals(f, Output.TABLE).splitlines()
    text = render_signals(f, Output.TABLE, Listing(True, ".healthyGpus"))
    assert [line.split()[0] for line in text.splitlines()[-2:]] == ["rack-1", "rack-0"]
    assert text.splitlines()[:-2] == [x for x in full[:-2] if not x.startswith("RACK ")]
    golden("signals_no_headers_sort_healthy.txt", text)
    data = json.loads(render_signals(f, Output.JSON, Listing(sort_by="{.healthyGpus}")))
    assert [r["name"] for r in data["racks"]] == ["rack-1", "rack-0"]
    with pytest.raises(SortKeyError, match=r"no such field.*\.name, \.powerDomain"):
        render_signals(f, Output.TABLE, Listing(sort_by=".nope"))


def test_sort_lists_sorts_each_list_that_has_the_field() -> None:
    a, b = [{"n": 2, "s": "x"}, {"n": 1, "s": "y"}], [{"n": 5}, {"n": 3}]
    assert sort_lists([a, b], ".n") == [[a[1], a[0]], [b[1], b[0]]]
    assert sort_lists([a, b], ".s") == [a, b]  # b has no .s: kept as it is
    assert sort_lists([a, []], ".n") == [[a[1], a[0]], []]
    with pytest.raises(SortKeyError, match=r"'.nope': no such field in these items \(fields: "
                                           r"\.n, \.s\)"):
        sort_lists([a, b], ".nope")


def test_explain(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", {"dr.yaml": policy("dr", "Admission", """
        - name: defer
          when: "grid.event.active && workload.flexTier >= 2"
          decision: Defer
          requeueAfter: "grid.event.endsInSeconds"
          messageExpression: "'grid event ' + grid.event.id + ' asks for ' + string(int(grid.event.targetKw)) + ' kW'"
    """)})
    snap = cluster()
    ex = explain(snap, snap.workloads[1], ev)
    conditions = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
                   "message": "Quota reserved in ClusterQueue research"}]
    golden("explain_table.txt", render_explanation(ex, Output.TABLE, conditions))
    # Kueue stores conditions in whatever order it set them; m2g shows them in life order
    shuffled = [{"type": "Custom", "status": "True"}, {"type": "PodsReady", "status": "False"},
                *conditions]
    got = [c["type"] for c in explanation_data(ex, shuffled)["kueueConditions"]]
    assert got == ["QuotaReserved", "PodsReady", "Custom"]
    text = render_explanation(ex, Output.TABLE, shuffled)
    assert text.index("QuotaReserved=") < text.index("PodsReady=") < text.index("Custom=")


def test_submit_preview(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", {"dr.yaml": policy("dr", "Admission", """
        - name: defer
          when: "grid.event.active && workload.flexTier >= 2"
          decision: Defer
          requeueAfter: "grid.event.endsInSeconds"
          messageExpression: "'grid event ' + grid.event.id + ' is active'"
    """)})
    snap = cluster()
    text = render_preview(explain(snap, snap.workloads[1], ev), ["a note"])
    golden("submit_preview.txt", text)
    assert text.splitlines()[1] == "m2g would decide now: Defer → AdmissionCheck Retry"
    admitted = explain(snap, snap.workloads[0], ev)
    assert render_preview(admitted).splitlines()[1:] == ["  admitted: no policy objected"]
    assert render_preview(None, ["no admission decision: no cluster"]) == \
        "note: no admission decision: no cluster\n"
