"""CEL runtimes behind one small interface.

* ``cel-expr-python`` — the CEL project's C++ runtime (default; also does static type checks).
* ``cel-python`` — the pure-Python interpreter ``celpy`` (fallback; evaluation only).

Both evaluate the same source against the same plain data (m2g.model.PolicyInput.cel_data), so
the policy test suite can run on both and their answers can be compared.
"""

from __future__ import annotations

import importlib.util
import threading
from datetime import datetime
from typing import Any, Protocol

from m2g.policy.errors import EngineUnavailable

CEL_EXPR_PYTHON = "cel-expr-python"
CEL_PYTHON = "cel-python"
ENGINES = (CEL_EXPR_PYTHON, CEL_PYTHON)
_MODULES = {CEL_EXPR_PYTHON: "cel_expr_python", CEL_PYTHON: "celpy"}

#: The function a batch expression calls for the list it maps over (one workload per item; see
#: m2g.policy.batch). A function, not a variable: the snapshot's activation outlives a batch.
BATCH_ITEMS = "m2g__items"
#: Batch expressions read a policy's snapshot-wide variables, computed once, from this map.
HOISTED = "m2g__h"

#: The top-level CEL variables every expression may read.
INPUT_VARIABLES = ("workload", "site", "grid", "domains", "topology", "facts", "queue", "flavor",
                   "domain", "now")


class CelCompileError(Exception):
    """An expression that does not parse (or, in a typed environment, does not type-check)."""


class CelEvalError(Exception):
    """An expression that failed at run time (no such key, division by zero, wrong type...)."""


class Program(Protocol):
    """A compiled expression. ``source`` is the text compiled (with the policy variables it
    needs bound around it); ``bare`` is the same text without those bindings, for a batch
    expression that binds every variable once (m2g.policy.batch)."""

    source: str
    bare: str

    def run(self, activation: Any) -> Any:
        """Evaluate; return a plain Python value or raise CelEvalError."""


class Runtime(Protocol):
    """A CEL runtime: compiles sources once and evaluates them against an activation."""

    name: str

    def compile(self, source: str, bare: str | None = None) -> Program:
        """Compile; raise CelCompileError with a readable message."""

    def activation(self, data: dict[str, Any]) -> Any:
        """Convert input data once per decision; reuse it for every expression."""

    def compile_batch(self, source: str) -> Program | None:
        """Compile an unchecked batch expression (over ``m2g__items()``); None: not supported."""

    def run_batch(self, program: Program, activation: Any, items: list[Any]) -> Any:
        """Run a batch program with ``m2g__items()`` returning ``items``."""


def available_engines() -> list[str]:
    """The engines whose module can be imported here, in order of preference."""
    return [e for e in ENGINES if importlib.util.find_spec(_MODULES[e]) is not None]


def make_runtime(engine: str | None = None) -> Runtime:
    """The named runtime, or the first one that imports."""
    if engine is None:
        found = available_engines()
        if not found:
            raise EngineUnavailable("no CEL runtime: install cel-expr-python or cel-python")
        engine = found[0]
    if engine == CEL_EXPR_PYTHON:
        return CelExprRuntime()
    if engine == CEL_PYTHON:
        return CelPyRuntime()
    raise EngineUnavailable(f"unknown CEL engine {engine!r}; choose one of {', '.join(ENGINES)}")


def first_line(message: str) -> str:
    """CEL error texts carry a caret drawing over several lines; keep the first one, trimmed."""
    text = message.strip().splitlines()[0] if message.strip() else "error"
    for prefix in ("INVALID_ARGUMENT: ", "ERROR: "):
        text = text.removeprefix(prefix)
    return text.replace(" [INVALID_ARGUMENT]", "")


class _CelExprProgram:
    __slots__ = ("_error_type", "_expr", "bare", "source")

    def __init__(self, expr: Any, error_type: Any, source: str, bare: str | None = None) -> None:
        self._expr = expr
        self._error_type = error_type
        self.source = source
        self.bare = source if bare is None else bare

    def run(self, activation: Any) -> Any:
        try:
            result = self._expr.eval(activation)
        except Exception as exc:  # the C++ runtime raises RuntimeError and friends
            raise CelEvalError(first_line(str(exc))) from None
        if result.type() == self._error_type:
            raise CelEvalError(first_line(str(result.value())))
        return result.plain_value()


class CelExprRuntime:
    """cel-expr-python, evaluating in an untyped (dyn) environment over plain dicts.

    Static checking happens separately, in m2g.policy.schema.TypeChecker, against typed
    declarations; evaluating over dicts avoids building protobuf messages per decision.
    """

    name = CEL_EXPR_PYTHON

    def __init__(self) -> None:
        try:
            from cel_expr_python import cel
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise EngineUnavailable(f"{CEL_EXPR_PYTHON} is not importable: {exc}") from None
        self._cel = cel
        variables = {name: cel.Type.DYN for name in (*INPUT_VARIABLES, HOISTED)}
        variables["now"] = cel.Type.TIMESTAMP
        # The batch reaches CEL through a function, so that one activation (and the CEL values
        # converted from its snapshot, which cost far more than the rules) serves many batches.
        self._items: list[Any] = []
        self._lock = threading.Lock()
        items = cel.FunctionDecl(BATCH_ITEMS, [cel.Overload(
            f"{BATCH_ITEMS}_0", cel.Type.List(cel.Type.DYN), [], False, impl=self._batch)])
        self._env = cel.NewEnv(variables=variables, functions=[items])

    def _batch(self) -> list[Any]:
        return self._items

    def compile(self, source: str, bare: str | None = None) -> Program:
        try:
            return _CelExprProgram(self._env.compile(source), self._cel.Type.ERROR, source, bare)
        except Exception as exc:
            raise CelCompileError(first_line(str(exc))) from None

    def compile_batch(self, source: str) -> Program | None:
        try:
            expr = self._env.compile(source, disable_check=True)
        except Exception as exc:
            raise CelCompileError(first_line(str(exc))) from None
        return _CelExprProgram(expr, self._cel.Type.ERROR, source)

    def run_batch(self, program: Program, activation: Any, items: list[Any]) -> Any:
        with self._lock:
            self._items = items
            try:
                return program.run(activation)
            finally:
                self._items = []

    def activation(self, data: dict[str, Any]) -> Any:
        return self._env.Activation(data=data)


class _CelPyProgram:
    __slots__ = ("_prog", "bare", "source")

    def __init__(self, prog: Any, source: str, bare: str | None = None) -> None:
        self._prog = prog
        self.source = source
        self.bare = source if bare is None else bare

    def run(self, activation: Any) -> Any:
        from celpy.evaluation import CELEvalError as CelPyError

        try:
            result = self._prog.evaluate(activation)
        except CelPyError as exc:
            raise CelEvalError(_celpy_message(exc)) from None
        except Exception as exc:
            raise CelEvalError(str(exc) or type(exc).__name__) from None
        if isinstance(result, CelPyError):
            raise CelEvalError(_celpy_message(result))
        return _from_celpy(result)


def _celpy_message(exc: BaseException) -> str:
    args = getattr(exc, "args", ())
    return str(args[0]) if args else str(exc)


class CelPyRuntime:
    """The pure-Python ``celpy`` interpreter (cel-python)."""

    name = CEL_PYTHON

    def __init__(self, budget: int | None = None) -> None:
        """``budget``: comprehension steps per evaluation (default: celpy_budget's)."""
        try:
            import celpy
        except ImportError as exc:
            raise EngineUnavailable(f"{CEL_PYTHON} is not importable ({exc}); it is an "
                                    "extra: pip install 'm2g[cel-python]'") from None
        from m2g.policy.celpy_budget import ITERATION_BUDGET, budget_runner

        self._celpy = celpy
        self._env = celpy.Environment(runner_class=budget_runner(budget or ITERATION_BUDGET))

    def compile(self, source: str, bare: str | None = None) -> Program:
        try:
            ast = self._env.compile(source)
            prog = self._env.program(ast, functions={"string": _celpy_string})
            return _CelPyProgram(prog, source, bare)
        except Exception as exc:
            raise CelCompileError(first_line(str(exc))) from None

    def compile_batch(self, source: str) -> Program | None:
        return None  # the interpreter gains nothing from batching

    def run_batch(self, program: Program, activation: Any, items: list[Any]) -> Any:
        raise NotImplementedError("cel-python does not batch")

    def activation(self, data: dict[str, Any]) -> Any:
        from celpy import celtypes
        from celpy.adapter import json_to_cel

        out: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, datetime):
                out[key] = celtypes.TimestampType(value)
            else:
                out[key] = json_to_cel(value)
        return out


def _celpy_string(value: Any) -> Any:
    """CEL's string(): celpy renders booleans as Python does ("True"); CEL says "true"."""
    from celpy import celtypes

    if isinstance(value, celtypes.BoolType):
        return celtypes.StringType("true" if value else "false")
    return celtypes.StringType(value)


def _from_celpy(value: Any) -> Any:
    """celpy's types subclass Python's; normalise to plain values for comparison and JSON."""
    from celpy import celtypes

    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.IntType | celtypes.UintType):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.ListType):
        return [_from_celpy(v) for v in value]
    if isinstance(value, celtypes.MapType):
        return {_from_celpy(k): _from_celpy(v) for k, v in value.items()}
    return value
