"""Both CEL engines stop a runaway evaluation after the same comprehension budget."""

from __future__ import annotations

import pytest

from m2g.policy.celpy_budget import ITERATION_BUDGET
from m2g.policy.runtime import CelEvalError, CelPyRuntime, Runtime, make_runtime

TEN = "[1,2,3,4,5,6,7,8,9,10]"
#: 10^5 steps: ten times the budget.
NESTED_MAP = f"{TEN}.map(a, {TEN}.map(b, {TEN}.map(c, {TEN}.map(d, {TEN}.map(e, a))))).size() > 0"
NESTED_EXISTS = (f"{TEN}.exists(a, {TEN}.exists(b, {TEN}.exists(c, {TEN}.exists(d, "
                 f"{TEN}.exists(e, a < 0)))))")


def small(engine: str) -> Runtime:
    """cel-python with a budget of 500 steps (10,000 take seconds in the interpreter)."""
    return CelPyRuntime(budget=500) if engine == "cel-python" else make_runtime(engine)


@pytest.mark.parametrize("engine", ["cel-expr-python", "cel-python"])
@pytest.mark.parametrize("source", [NESTED_MAP, NESTED_EXISTS])
def test_runaway_comprehension_stops(engine: str, source: str) -> None:
    rt = small(engine)
    with pytest.raises(CelEvalError, match="Iteration budget exceeded"):
        rt.compile(source).run(rt.activation({}))


def test_default_runtime_has_the_budget() -> None:
    rt = make_runtime("cel-python")
    assert rt._env.runner_class.__name__ == "BudgetRunner"  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ["cel-expr-python", "cel-python"])
def test_within_budget_still_evaluates(engine: str) -> None:
    rt = make_runtime(engine)
    # 10 * 10 = 100 steps (+ 10 outer), well under the budget
    src = f"{TEN}.map(a, {TEN}.map(b, a * b)).size() == 10"
    assert rt.compile(src).run(rt.activation({})) is True
    assert ITERATION_BUDGET == 10_000


def test_budget_is_per_evaluation() -> None:
    rt = small("cel-python")
    prog = rt.compile(f"{TEN}.map(a, {TEN}.map(b, a)).size() == 10")
    act = rt.activation({})
    for _ in range(6):  # 6 x 110 steps: more than the budget in total, not in one
        assert prog.run(act) is True
