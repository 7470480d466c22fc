"""Memory bounds of policy evaluation (issue 11, "bounded everything"; docs/reliability.md).

* m2g.policy.cost: a static bound on what one evaluation can allocate; the compiler refuses
  an expression above 16 MiB. Before, 14 variables that each doubled the last built an 80 MB
  string from a 10 KB literal (827 MB for one evaluation), and a lint-clean 9.6 KB rule with a
  literal concatenated in a 99 × 99 nested ``map`` took 2.4 GB for 16 workloads in ``m2g
  policy eval``.
* m2g.policy.batch: cel-expr-python keeps what an evaluation allocates on its activation until
  it is dropped; the snapshot's activation is dropped once the heap grew by RETAIN_BYTES, chunks
  are sized by the growth per item, and the per-input fallback drops its activations the same
  way. Before, ``topology.racks.map(a, workload.name + 'x')`` over 3,000 racks took 8.7 GB for
  100 workloads (0.5 GB after).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from m2g.model.inputs import PolicyInput
from m2g.policy import PolicySetError, load_dir
from m2g.policy.batch import caches
from m2g.policy.cost import INPUT_BYTES, ITERATIONS, MAX_ALLOC, CostError, estimate
from m2g.policy.evaluate import Evaluator
from m2g.policy.runtime import CelExprRuntime
from tests.unit.policy_helpers import policy, write

ROOT = Path(__file__).resolve().parents[2]
LIT = "x" * 1000


def doubling(n: int, literal: str = "x" * 10_000) -> str:
    """A policy whose variable v{n-1} is ``literal`` doubled n-1 times."""
    lines = [f"- {{name: v0, expression: \"workload.name + '{literal}'\"}}"]
    lines += [f"- {{name: v{i}, expression: 'variables.v{i - 1} + variables.v{i - 1}'}}"
              for i in range(1, n)]
    return policy("bomb", "Admission", f"""
        - {{name: r, when: 'size(variables.v{n - 1}) < 0', decision: Reject, message: m}}
    """, extra="variables:\n" + "\n".join("  " + line for line in lines))


def test_estimates() -> None:
    assert estimate("'abc'").size == 3
    assert estimate("'abc' + 'de'").alloc == 5
    assert estimate("workload.gpus + 1").alloc == 0  # numbers add, they copy nothing
    c = estimate(f"[1, 2].map(a, workload.name + '{LIT}')")
    assert c.alloc >= ITERATIONS * (INPUT_BYTES + 1000)
    # nested comprehensions share the budget: no ITERATIONS squared
    assert estimate(f"[1].map(a, [2].map(b, '{LIT}' + 'y'))").alloc < 2 * ITERATIONS * 1100
    sizes = {"v": estimate("'" + LIT + "'")}
    assert estimate("variables.v + variables.v", sizes.get).size == 2000
    with pytest.raises(CostError):
        estimate("'unterminated")


@pytest.mark.parametrize("engine", ["cel-expr-python", "cel-python"])
def test_a_doubling_bomb_is_refused(tmp_path: Path, engine: str) -> None:
    with pytest.raises(PolicySetError, match=r"may allocate .* in one evaluation \(bound 16"):
        load_dir(write(tmp_path, {"p.yaml": doubling(14)}), engine)
    load_dir(write(tmp_path, {"p.yaml": doubling(3, "x")}), engine)  # small: fine


def test_a_literal_in_a_nested_map_is_refused(tmp_path: Path) -> None:
    ninety_nine = "[" + ",".join(str(i) for i in range(99)) + "]"
    when = f"size({ninety_nine}.map(a, {ninety_nine}.map(b, workload.name + '{'x' * 9000}'))) < 0"
    assert len(when) < 10 * 1024  # what the CRD lets in
    with pytest.raises(PolicySetError, match="may allocate"):
        load_dir(write(tmp_path, {"p.yaml": policy("n", "Admission", f"""
            - {{name: r, when: "{when}", decision: Reject, message: m}}
        """)}), "cel-expr-python")


def test_every_shipped_expression_is_read_and_far_below_the_bound() -> None:
    """The parser reads every expression of the shipped policies (no fallback to the crude
    bound) and each, with the variables it needs, stays below an eighth of MAX_ALLOC."""
    import yaml

    worst = 0
    for path in [*sorted((ROOT / "deploy" / "policies").glob("*.yaml")),
                 *sorted((ROOT / "policies").rglob("*.yaml"))]:
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") not in ("Policy", "TenantPolicy"):
                continue
            spec = doc["spec"]
            costs: dict[str, Any] = {}
            for var in spec.get("variables") or []:
                costs[var["name"]] = estimate(var["expression"], costs.get)
            for rule in spec.get("rules") or []:
                for key, src in rule.items():
                    if key in ("when", "messageExpression", "score", "eligible", "quota",
                               "weight", "minCap", "requeueAfter", "topologyLevel"):
                        own = estimate(str(src), costs.get)
                        worst = max(worst, own.alloc + sum(c.alloc for c in costs.values()))
    assert 0 < worst < MAX_ALLOC // 8, worst


def _inputs(n: int, racks: int) -> list[PolicyInput]:
    """``n`` inputs sharing one factory of ``racks`` racks (one snapshot, as in a reconcile)."""
    base = PolicyInput.model_validate({"workload": {"name": "w", "gpus": 1}, "domains": {
        f"r{i}": {"kind": "rack"} for i in range(racks)}})
    return [base.model_copy(update={"workload": base.workload.model_copy(
        update={"name": f"w{i}"})}) for i in range(n)]


def _peak_heap(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Samples of the heap after every batch and every per-input walk."""
    seen: list[int] = []
    run_batch = CelExprRuntime.run_batch

    def sampled(self: Any, program: Any, act: Any, items: list[Any]) -> Any:
        out = run_batch(self, program, act, items)
        seen.append(caches.heap_bytes() or 0)
        return out

    monkeypatch.setattr(CelExprRuntime, "run_batch", sampled)
    return seen


@pytest.mark.skipif(caches.heap_bytes() is None, reason="no heap measure here")
def test_the_batch_activation_is_dropped_when_it_grows(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(caches, "RETAIN_BYTES", 24 << 20)
    monkeypatch.setattr(caches, "CHUNK_BYTES", 8 << 20)
    seen = _peak_heap(monkeypatch)
    ev = Evaluator(load_dir(write(tmp_path, {"p.yaml": policy("m", "Admission", """
        - {name: r, when: "size(topology.racks.map(a, workload.name + 'x')) < 0",
           decision: Reject, message: m}
    """)}), "cel-expr-python"))
    start = caches.heap_bytes() or 0
    results = ev.admission_many(_inputs(40, 700))  # ~8 MB an evaluation (list copies)
    assert [r.decision for r in results] == ["Admit"] * 40
    assert len(seen) > 3  # chunked
    # without the drop: 40 x ~8 MB kept on the activation (~320 MB)
    assert max(seen) - start < 100 << 20, (max(seen) - start) >> 20


def test_syntax_the_parser_does_not_know_cannot_hide_a_variable() -> None:
    """Backquoted fields and message literals are read; text it cannot read gets the crude
    bound, which still counts each variable reference by its size."""
    from m2g.policy.cost import Cost, crude

    assert estimate("a.`b-c`").size == INPUT_BYTES
    assert estimate("google.protobuf.Value{}").alloc == 0
    big = Cost(10_000_000, 0)
    assert crude("variables.v + variables.v ~", lambda _: big).alloc > 2 * big.size
