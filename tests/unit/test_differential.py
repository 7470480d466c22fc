"""Differential tests: the example policies give the same answers on both CEL runtimes, and the
batch path (one fused evaluation for many policies and workloads) gives the same answers as one
input at a time."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from m2g.model.factory import domain_views, grid_view, site_view
from m2g.model.inputs import PolicyInput, QueueView
from m2g.policy import Evaluator, Stage, load_dir
from m2g.policy.batch import split_by_gates, workload_data
from m2g.policy.batch.cel_source import FIELD_ALIAS
from m2g.testing.scenarios import SCENARIOS, factory, workloads
from tests.unit.policy_helpers import evaluator, policy

POLICIES = Path(__file__).resolve().parents[2] / "policies"
#: Racks kept from the 16-rack benchmark factory: a hot one (rack-03, in the hot-rack scenario),
#: the two with a window (rack-08, rack-09, in the maintenance scenario), on two power domains
#: and three blocks. Small enough for the pure-Python engine to be quick.
RACKS = ("rack-02", "rack-03", "rack-08", "rack-09")



def _small(scenario: str) -> dict[str, object]:
    snap = factory(scenario)
    snap = replace(snap, racks=tuple(r for r in snap.racks if r.name in RACKS),
                   nodes=tuple(n for n in snap.nodes if n.rack in RACKS))
    return {"site": site_view(snap), "grid": grid_view(snap), "domains": domain_views(snap),
            "now": snap.now}


@pytest.fixture(scope="module")
def sample() -> list[PolicyInput]:
    """Trace workloads over the four scenarios; those of a scenario share its snapshot."""
    base = {s: _small(s) for s in SCENARIOS}
    queue = QueueView(name="cq-0", nominal_gpus=576, used_gpus=97)
    out = [PolicyInput(workload=w, queue=queue, **base[SCENARIOS[i % 4]])  # type: ignore[arg-type]
           for i, w in enumerate(workloads(16))]
    # the trace's jobs fit the racks clear of the window; one that does not is deferred
    big = out[3].workload.model_copy(update={"gpus": 64, "pod_sets": ()})
    return [*out, out[3].model_copy(update={"workload": big})]


@pytest.fixture(scope="module")
def fast() -> Evaluator:
    return Evaluator(load_dir(POLICIES, "cel-expr-python"))


def test_engines_and_batch_agree_on_example_policies(sample: list[PolicyInput],
                                                     fast: Evaluator) -> None:
    slow = Evaluator(load_dir(POLICIES, "cel-python"))
    one = [fast.admission(i).to_json() for i in sample]
    assert [slow.admission(i).to_json() for i in sample] == one
    assert [r.to_json() for r in fast.admission_many(sample)] == one
    assert [r.to_json() for r in Evaluator(fast.policy_set).admission_many(sample)] == one
    decisions = {r["decision"] for r in one}
    assert len(decisions) >= 2, f"the sample should exercise several outcomes, got {decisions}"
    reasons = {r["policy"] for res in one for r in res["reasons"]}
    assert {"thermal-admission", "maintenance-admission"} <= reasons


def test_example_policies_run_in_one_combined_expression(sample: list[PolicyInput],
                                                         fast: Evaluator) -> None:
    """No example Admission or Placement policy falls back to a slower form (benchmark): on
    each scenario, every policy is decided by its gate or runs in the combined expression."""
    ev = Evaluator(fast.policy_set)
    policies = [p for s in (Stage.ADMISSION, Stage.PLACEMENT) for p in ev.policy_set.by_stage[s]]
    for inp in sample[:4]:
        snap = ev._fused.snapshots.get(inp)
        idle, comb = split_by_gates(ev._fused, snap, policies)
        assert comb is not None
        assert sorted(p.name for p in [*idle, *comb.policies]) == sorted(p.name for p in policies)
        assert all(g is not None for g in snap.gates.values())  # no gate raised
    assert ev._fused.snapshots.get(sample[3]).hoisted["maintenance-admission"][0] == (
        "windows", "siteWindows", "siteWindow")
    assert ev._fused.snapshots.get(sample[2]).hoisted["thermal-admission"][0] == ("hotRacks",)


def test_batch_falls_back_per_item_on_errors(tmp_path: Path) -> None:
    ev = evaluator(tmp_path, "cel-expr-python", {
        "a.yaml": policy("a", "Admission", """
            - {name: team, when: "workload.labels['team'] == 'x'", decision: Reject}
            - {name: big, when: "workload.gpus > 8", decision: Defer, requeueAfter: "60"}
        """, extra="failurePolicy: Ignore"),
    })
    site = PolicyInput().site
    items = [PolicyInput(workload={"gpus": g, "labels": lbl}, site=site)  # type: ignore[arg-type]
             for g, lbl in [(4, {"team": "x"}), (16, {}), (2, {"team": "y"})]]
    batched = [r.to_json() for r in ev.admission_many(items)]
    assert batched == [ev.admission(i).to_json() for i in items]
    assert [r["decision"] for r in batched] == ["Reject", "Defer", "Admit"]
    assert batched[1]["errors"][0]["rule"] == "team"  # the missing label, reported per item


def test_batch_splits_over_the_iteration_budget(tmp_path: Path) -> None:
    """cel-expr-python stops an evaluation after 10,000 comprehension steps: a batch whose
    expression would take more is run in smaller chunks, with the same answers."""
    ev = evaluator(tmp_path, "cel-expr-python", {
        "a.yaml": policy("a", "Admission", """
            - {name: many, when: "workload.labels.all(k, [1, 2, 3, 4].all(i, i > 0)) &&
                                  workload.gpus in [0, 1, 2, 3, 4, 5, 6, 7].map(i, i * 2)",
               decision: Defer, requeueAfter: "60"}
        """),
    })
    site = PolicyInput().site
    labels = {f"l{i}": "x" for i in range(60)}
    items = [PolicyInput(workload={"gpus": g % 9, "labels": labels}, site=site)  # type: ignore[arg-type]
             for g in range(200)]
    batched = [r.to_json() for r in ev.admission_many(items)]
    assert batched == [ev.admission(i).to_json() for i in items]
    assert {r["decision"] for r in batched} == {"Admit", "Defer"}
    assert not any(r["errors"] for r in batched if "errors" in r)


def test_workload_data_equals_pydantic_dump(sample: list[PolicyInput]) -> None:
    fields = {"gpus", "flex_tier", "kind", "pod_sets", "labels", "annotations", "checkpoint",
              "estimated_kw", "name"}
    for inp in sample:
        w = inp.workload
        assert workload_data(w, fields) == w.model_dump(mode="json", by_alias=True,
                                                        include=fields)
        assert workload_data(w, None) == w.model_dump(mode="json", by_alias=True)
        assert workload_data(w, set()) == {}


def test_batch_runs_in_chunks_of_at_most_max_chunk() -> None:
    """A long batch is evaluated a few items at a time (cel-expr-python's comprehensions cost
    quadratic time and arena memory in the list's length), with the same answers in order."""
    from m2g.policy.batch import FusedCache
    from m2g.policy.runtime import make_runtime

    runtime = make_runtime("cel-expr-python")
    sizes: list[int] = []
    inner = runtime.run_batch

    def counting(program: object, act: object, items: list[object]) -> object:
        sizes.append(len(items))
        return inner(program, act, items)  # type: ignore[arg-type]

    runtime.run_batch = counting  # type: ignore[method-assign]
    program = runtime.compile_batch("m2g__items().map(w, w.n * 2)")
    assert program is not None
    act = runtime.activation({})
    items = [{"n": i} for i in range(10)]
    assert FusedCache(runtime, max_chunk=4).run(program, act, items) == [2 * i for i in range(10)]
    assert sizes == [4, 4, 2]
    sizes.clear()
    assert FusedCache(runtime, max_chunk=100).run(program, act, items) == [2 * i for i in range(10)]
    assert sizes == [10]


PACING = policy("pacing", "Admission", """
    - name: backoff
      when: "workload.waitSeconds < 100 * workload.requeueCount"
      decision: Defer
      requeueAfter: "100 * workload.requeueCount - workload.waitSeconds"
      messageExpression: "'waited ' + string(workload.waitSeconds) + ' s'"
""", extra="""
matchConditions:
  - {name: churning, expression: "workload.requeueCount >= 7"}
""")


def test_match_conditions_decided_per_class_then_only_the_passing_items(
        tmp_path: Path) -> None:
    """A policy whose item match conditions read fewer fields than it does (admission-pacing:
    requeueCount, then waitSeconds per workload) has them decided per class first; only the
    items that pass are evaluated. Same answers as one input at a time, and the subset path
    is the one taken."""
    from m2g.policy.batch import _Items, _passing

    ev = evaluator(tmp_path, "cel-expr-python", {"p.yaml": PACING})
    site = PolicyInput().site
    items = [PolicyInput(workload={"gpus": 1, "requeueCount": i % 10,  # type: ignore[arg-type]
                                   "waitSeconds": 7 * i}, site=site) for i in range(120)]
    batched = [r.to_json() for r in ev.admission_many(items)]
    assert batched == [ev.admission(i).to_json() for i in items]
    assert [r["decision"] for r in batched].count("Defer") > 10
    assert "Admit" in {r["decision"] for r in batched}
    pol = ev.policy_set.by_stage[Stage.ADMISSION][0]
    snap = ev._fused.snapshots.get(items[0])
    passing = _passing(ev._fused, snap.activation(ev.policy_set.runtime), pol,
                       _Items(ev._fused, [pol], items))
    assert passing == [i for i in range(120) if i % 10 >= 7]


def test_match_conditions_that_raise_are_left_to_each_item(tmp_path: Path) -> None:
    """The per-class match conditions raise (a missing label): the policy is evaluated as
    usual, and each item's error is reported where it belongs."""
    ev = evaluator(tmp_path, "cel-expr-python", {"p.yaml": policy("p", "Admission", """
        - {name: big, when: "workload.waitSeconds > 50", decision: Defer, requeueAfter: "60"}
    """, extra="""
    matchConditions:
      - {name: team, expression: "workload.labels['team'] == 'x'"}
    """)})
    site = PolicyInput().site
    items = [PolicyInput(workload={"gpus": 1, "waitSeconds": 9 * i,  # type: ignore[arg-type]
                                   "labels": {"team": "x"} if i % 3 else {}}, site=site)
             for i in range(60)]
    batched = [r.to_json() for r in ev.admission_many(items)]
    assert batched == [ev.admission(i).to_json() for i in items]
    assert {r["decision"] for r in batched} >= {"Defer", "Admit"}


def test_class_keys_partition_as_item_classes(sample: list[PolicyInput]) -> None:
    """ClassKeys (keys read from the views, one column per field) groups the items as
    item_classes does on their plain data, for a subset too."""
    from m2g.policy.batch import ClassKeys, item_classes

    for fields in (["gpus"], ["flex_tier", "gpus"], ["annotations", "gpus"], ["checkpoint"],
                   ["kind", "power_cap"]):
        data = [workload_data(i.workload, set(fields)) for i in sample]
        want = item_classes(data, [FIELD_ALIAS[f] for f in fields])
        got = ClassKeys(sample).classes(fields, False)
        assert want is not None and got is not None
        assert got == want
        where = list(range(1, len(sample), 2))
        sub = item_classes([data[i] for i in where], [FIELD_ALIAS[f] for f in fields])
        assert ClassKeys(sample).classes(fields, False, where=where) == sub


def test_class_keys_tell_scalars_of_other_types_apart() -> None:
    """An int's and a str's class key is the value itself (no tuple per workload): 1, True,
    1.0 and "1" are four classes to CEL and stay four (0, False, 0.0, "" too); equal values of
    one type are one."""
    from types import SimpleNamespace

    from m2g.policy.batch import ClassKeys

    values = [1, True, 1.0, "1", 1, None, 0, False, 0.0, "", 1, "1", True]
    items = [SimpleNamespace(workload=SimpleNamespace(priority=v)) for v in values]
    got = ClassKeys(items).classes(["priority"], False)  # type: ignore[arg-type]
    assert got is not None
    reps, of = got
    assert len(reps) == 9  # 1, True, 1.0, "1", None, 0, False, 0.0, ""
    for i, v in enumerate(values):
        same = [j for j, u in enumerate(values) if type(u) is type(v) and u == v]
        assert {of[j] for j in same} == {of[i]}
        assert sum(1 for j in range(len(values)) if of[j] == of[i]) == len(same)


def _running(n: int, level: int = 2) -> list[PolicyInput]:
    """``n`` admitted workloads in one emergency snapshot: four tiers, a few priorities and
    every checkpoint age its own (some never checkpoint, some over two intervals)."""
    grid = PolicyInput(grid={"event": {"active": True, "level": level}}).grid  # type: ignore[arg-type]
    site = PolicyInput().site
    return [PolicyInput(site=site, grid=grid, workload={  # type: ignore[arg-type]
        "name": f"w{i}", "gpus": 4, "flexTier": i % 4, "priority": (i % 5) * 100 - 100,
        "checkpoint": {"intervalSeconds": 0 if i % 7 == 0 else 600,
                       "lastAgeSeconds": 13 * i, "reported": i % 3 == 0}})
        for i in range(n)]


def test_rules_of_a_policy_split_by_what_they_read(fast: Evaluator) -> None:
    """checkpoint-preemption over workloads that each have their own checkpoint age: its tier
    and priority rules are evaluated once per class of flexTier / priority, only its
    checkpoint rules per workload (the split path is taken), with the answers of one workload
    at a time on both engines, reasons in the rules' order."""
    import m2g.policy.batch as batch

    items = _running(200)
    slow = Evaluator(load_dir(POLICIES, "cel-python"))
    one = [slow.preemption(i).to_json() for i in items]
    ev = Evaluator(fast.policy_set)
    taken: list[bool] = []
    inner = batch._split

    def spy(*args: object) -> object:
        out = inner(*args)  # type: ignore[arg-type]
        taken.append(out is not None)
        return out

    batch._split = spy  # type: ignore[assignment]
    try:
        batched = [r.to_json() for r in ev.preemption_many(items)]
    finally:
        batch._split = inner
    assert taken == [True]
    assert batched == one == [fast.preemption(i).to_json() for i in items]
    rules = [[r["rule"] for r in res["reasons"]] for res in batched]
    assert ["flexible", "fresh-checkpoint", "priority"] in rules
    assert {r["eligible"] for r in batched} == {True, False}
    assert len({r["score"] for r in batched}) > 40


def test_split_rules_that_raise_fall_back_to_the_whole_policy(tmp_path: Path) -> None:
    """A rule of a split part raises for some items (a missing label): the policy is
    evaluated as a whole, and each item's error is reported where it belongs."""
    ev = evaluator(tmp_path, "cel-expr-python", {"p.yaml": policy("p", "Preemption", """
        - {name: tier, when: "workload.flexTier >= 1", eligible: true, score: "1.0"}
        - {name: team, when: "workload.labels['team'] == 'x'", score: "2.0"}
        - {name: age, when: "workload.checkpoint.lastAgeSeconds > 100",
           score: "double(workload.checkpoint.lastAgeSeconds)"}
    """, extra="failurePolicy: Ignore")})
    items = [i.model_copy(update={"workload": i.workload.model_copy(update={
        "labels": {"team": "x"} if k % 9 else {}})}) for k, i in enumerate(_running(90))]
    batched = [r.to_json() for r in ev.preemption_many(items)]
    assert batched == [ev.preemption(i).to_json() for i in items]
    assert any(r.get("errors") for r in batched)
    assert len({r["score"] for r in batched}) > 20


def test_nested_models_as_pydantic_dumps_them() -> None:
    """workload_data's nested models field by field, as pydantic's JSON dump (an int in a
    float field, unvalidated, is written as a float: the fast path hands it to pydantic)."""
    from m2g.model.inputs import Checkpoint, PowerCap, WorkloadView, shallow_copy

    views = [WorkloadView(checkpoint=Checkpoint(interval_seconds=60, last_age_seconds=7,
                                                reported=True),
                          power_cap=PowerCap(capped=True, fraction=0.5)),
             WorkloadView(power_cap=shallow_copy(PowerCap(), fraction=1, capped=True))]
    for w in views:
        got = workload_data(w, {"checkpoint", "power_cap"})
        want = w.model_dump(mode="json", by_alias=True, include={"checkpoint", "power_cap"})
        assert got == want
        assert [type(v) for v in got["powerCap"].values()] == [
            type(v) for v in want["powerCap"].values()]


def test_split_rules_keep_the_rules_order(tmp_path: Path) -> None:
    """Rules of one class part around a per-workload one: the reasons still come in the
    rules' order."""
    ev = evaluator(tmp_path, "cel-expr-python", {"p.yaml": policy("p", "Preemption", """
        - {name: tier, when: "workload.flexTier >= 1", eligible: true, score: "1.0"}
        - {name: age, when: "workload.checkpoint.lastAgeSeconds > 100",
           score: "double(workload.checkpoint.lastAgeSeconds)"}
        - {name: high, when: "workload.flexTier >= 2", score: "3.0"}
    """)})
    items = _running(90)
    batched = [r.to_json() for r in ev.preemption_many(items)]
    assert batched == [ev.preemption(i).to_json() for i in items]
    assert ["tier", "age", "high"] in [[r["rule"] for r in res["reasons"]] for res in batched]


def test_cheap_class_keys_are_not_probed() -> None:
    """Integer checkpoint ages: the first PROBE of 3,000 workloads are all distinct, all of
    them fall into 1,400 classes. A column of cheap keys (scalars, flat models) is keyed
    whole, so the classes are found; one of dear keys (labels) is still probed first."""
    from m2g.model.inputs import Checkpoint
    from m2g.policy.batch import ClassKeys, item_classes

    items = [i.model_copy(update={"workload": i.workload.model_copy(update={
        "checkpoint": Checkpoint(interval_seconds=600, last_age_seconds=k % 1400),
        "labels": {"n": str(k % 1400)}})}) for k, i in enumerate(_running(3_000))]
    got = ClassKeys(items).classes(["checkpoint"], False, len(items) // 2)
    data = [workload_data(i.workload, {"checkpoint"}) for i in items]
    assert got is not None and len(got[0]) == 1400
    assert got == item_classes(data, ["checkpoint"])
    assert ClassKeys(items).classes(["labels"], False, len(items) // 2) is None


def test_items_over_a_base_decide_as_whole_inputs(sample: list[PolicyInput],
                                                  fast: Evaluator) -> None:
    """Evaluator.admission_items / preemption_items (WorkloadItems over one base input, no
    input per workload) decide as admission_many / preemption_many of whole inputs."""
    from m2g.model.inputs import WorkloadItem

    ev = Evaluator(fast.policy_set)
    base = PolicyInput(**_small(SCENARIOS[0]))  # type: ignore[arg-type]
    queue = QueueView(name="cq-0", nominal_gpus=576, used_gpus=97)
    items = [WorkloadItem(i.workload, queue) for i in sample]
    whole = [base.with_workload(i.workload, queue) for i in sample]
    assert [r.to_json() for r in ev.admission_items(base, items)] == [
        r.to_json() for r in Evaluator(fast.policy_set).admission_many(whole)]
    running = _running(120, level=3)
    pbase = PolicyInput(site=running[0].site, grid=running[0].grid)
    got = ev.preemption_items(pbase, [WorkloadItem(i.workload, i.queue) for i in running])
    assert [r.to_json() for r in got] == [fast.preemption(i).to_json() for i in running]
    assert ev.admission_items(base, []) == []
    slow = Evaluator(load_dir(POLICIES, "cel-python"))  # no batch programs: one at a time
    assert [r.to_json() for r in slow.preemption_items(pbase, [
        WorkloadItem(i.workload, i.queue) for i in running[:20]])] == [
        r.to_json() for r in got[:20]]


def test_map_keys_only_for_literal_keys(tmp_path: Path) -> None:
    """A map field read only as ``'k' in workload.annotations`` or at a literal key is keyed by
    those keys; any other use (a whole map, a computed key, a member of it, a key that is part
    of a larger operand) reads all of it."""
    import json

    from m2g.policy.batch.cel_source import map_keys

    def keys(when: str, message: str = "'m'") -> tuple[str, ...] | None:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        ev = evaluator(folder, "cel-expr-python", {"p.yaml": policy("p", "Admission", f"""
            - {{name: r, when: {json.dumps(when)}, decision: Admit,
               messageExpression: {json.dumps(message)}}}
        """)})
        return map_keys(ev.policy_set.by_stage[Stage.ADMISSION], "annotations")

    assert keys("!('a/b' in workload.annotations) && \"c\" in workload.annotations") == (
        "a/b", "c")
    assert keys("'x' in workload.annotations", "workload.annotations['y']") == ("x", "y")
    assert keys("workload.gpus > 0") == ()
    assert keys("workload.annotations.size() > 1") is None
    assert keys("workload.annotations == {}") is None
    assert keys("'a' + workload.name in workload.annotations") is None
    assert keys("workload.name + 'a' in workload.annotations") is None
    assert keys("workload.annotations[workload.name] == 'x'") is None
    assert keys("workload.annotations.exists(k, k == 'a')") is None
    assert keys("r'a' in workload.annotations") is None


def test_items_that_differ_only_in_unread_annotations_are_one_class(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A policy that reads two annotation keys sees workloads that agree on them (present or
    not, with the same values) as one class, whatever else their annotations hold: the batch
    evaluates one item per class and decides as one input at a time."""
    from typing import Any

    from m2g.policy.batch import FusedCache

    ev = evaluator(tmp_path, "cel-expr-python", {"p.yaml": policy("p", "Admission", """
        - {name: pinned, when: "'pin' in workload.annotations", decision: Defer,
           messageExpression: "'pinned to ' + workload.annotations['pin']"}
        - {name: other, when: "!('pin' in workload.annotations) && workload.gpus > 2",
           decision: Defer, message: "big"}
    """)})
    site = PolicyInput().site
    items = [PolicyInput(site=site, workload={  # type: ignore[arg-type]
        "gpus": i % 4, "annotations": {"stamp": str(i), **({"pin": f"r{i % 3}"} if i % 2 else {})}})
        for i in range(120)]
    runs: list[int] = []
    original = FusedCache.run

    def counting(self: FusedCache, program: Any, act: Any, rows: list[Any]) -> list[Any]:
        runs.append(len(rows))
        return original(self, program, act, rows)

    monkeypatch.setattr(FusedCache, "run", counting)
    batched = [r.to_json() for r in ev.admission_many(items)]
    monkeypatch.undo()
    assert runs and max(runs) <= 4 * 4  # pin r0/r1/r2 or none × 4 GPU counts: not 120 stamps
    assert batched == [ev.admission(i).to_json() for i in items]
    assert {r["decision"] for r in batched} == {"Defer", "Admit"}
    assert "pinned to r1" in str(batched)


def test_class_keys_read_several_fields_in_one_pass_as_apart() -> None:
    """ClassKeys reads the fields of a key together, one pass over the views (issue 14), from
    where each column ends: after a probe of the first PROBE, beside a column read whole
    before, with a WorkloadItem's ``updates`` applied — the classes are item_classes' of
    the plain data, whole and for a subset."""
    from m2g.model.inputs import Checkpoint, WorkloadItem
    from m2g.policy.batch import ClassKeys, item_classes

    running = _running(3_000)
    items = []
    for k, i in enumerate(running):
        view = i.workload.model_copy(update={"labels": {"n": str(k % 7)}, "checkpoint":
                                             Checkpoint(last_age_seconds=k % 4)})
        moved = {"checkpoint": Checkpoint(interval_seconds=600, last_age_seconds=k % 5)} \
            if k % 3 else {"priority": 7 + k % 2}
        items.append(WorkloadItem(view, i.queue, moved))
    fields = ["flex_tier", "labels", "checkpoint", "priority"]
    data = [workload_data(i.workload, set(fields)) for i in items]
    want = item_classes(data, [FIELD_ALIAS[f] for f in fields])
    assert want is not None and 40 < len(want[0]) < 1_000
    assert ClassKeys(items).classes(fields, False, len(items) // 2) == want  # probed first
    keys = ClassKeys(items)
    assert keys.classes(["priority"], False) is not None  # one column whole, then the rest
    assert keys.classes(fields, False, len(items) // 2) == want
    where = list(range(5, len(items), 3))
    sub = item_classes([data[i] for i in where], [FIELD_ALIAS[f] for f in fields])
    assert keys.classes(fields, False, where=where) == sub
    assert ClassKeys(items).classes(fields, False, where=where) == sub
