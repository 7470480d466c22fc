"""An evaluation budget for cel-python, which has none of its own.

cel-expr-python stops an evaluation after ``ITERATION_BUDGET`` comprehension steps ("Iteration
budget exceeded"); cel-python would run ``range``-like nested ``map``s for as long as they take.
``budget_runner`` gives celpy an interpreter whose macro steps (``map``, ``filter``, ``all``,
``exists``, ``exists_one``) count against the same budget, shared by every nested comprehension
of one evaluation; past it the evaluation fails with the same message as the C++ runtime, so
``failurePolicy`` treats both engines alike.
"""

from __future__ import annotations

from typing import Any

#: Comprehension steps per evaluation, at most: cel-expr-python's own default.
ITERATION_BUDGET = 10_000
BUDGET_MESSAGE = "Iteration budget exceeded"


class BudgetExceeded(Exception):
    """Raised inside celpy; not a CELEvalError, so short-circuit macros cannot swallow it."""

    def __init__(self) -> None:
        super().__init__(BUDGET_MESSAGE)


class _Counter:
    __slots__ = ("left",)

    def __init__(self, budget: int) -> None:
        self.left = budget

    def step(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise BudgetExceeded


def budget_runner(budget: int = ITERATION_BUDGET) -> type[Any]:
    """A celpy Runner class whose evaluations stop after ``budget`` comprehension steps."""
    from celpy import InterpretedRunner
    from celpy.evaluation import Evaluator

    class BudgetEvaluator(Evaluator):
        counter: _Counter

        def sub_evaluator(self, ast: Any) -> Evaluator:
            sub = BudgetEvaluator(ast, activation=self.activation)
            sub.counter = self.counter
            return sub

        def build_macro_eval(self, child: Any) -> Any:
            return self._counted(super().build_macro_eval(child))

        def build_ss_macro_eval(self, child: Any) -> Any:
            return self._counted(super().build_ss_macro_eval(child))

        def _counted(self, sub_expr: Any) -> Any:
            counter = self.counter

            def step(value: Any) -> Any:
                counter.step()
                return sub_expr(value)

            return step

    class BudgetRunner(InterpretedRunner):
        def evaluate(self, context: Any) -> Any:
            e = BudgetEvaluator(ast=self.ast, activation=self.new_activation())
            e.counter = _Counter(budget)
            return e.evaluate(context)

    return BudgetRunner
