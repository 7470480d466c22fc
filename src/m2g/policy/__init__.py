"""The m2g policy engine: the v1alpha1 contract of docs/policy-format.md, on CEL.

Typical use::

    pset = load_dir(Path("policies"))            # atomic: PolicySetError lists every problem
    result = Evaluator(pset).admission(PolicyInput(...))
"""

from m2g.policy.compiler import PolicySet
from m2g.policy.errors import EngineUnavailable, InputError, PolicyError, PolicySetError, Problem
from m2g.policy.evaluate import Evaluator
from m2g.policy.loader import build, load_dir, read_dir, read_texts
from m2g.policy.results import (
    AdmissionResult,
    CapacityResult,
    FairnessResult,
    PlacementResult,
    PreemptionResult,
    Reason,
)
from m2g.policy.runtime import ENGINES, available_engines, make_runtime
from m2g.policy.spec import Decision, Stage, StopPolicy

__all__ = [
    "ENGINES",
    "AdmissionResult",
    "CapacityResult",
    "Decision",
    "EngineUnavailable",
    "Evaluator",
    "FairnessResult",
    "InputError",
    "PlacementResult",
    "PolicyError",
    "PolicySet",
    "PolicySetError",
    "PreemptionResult",
    "Problem",
    "Reason",
    "Stage",
    "StopPolicy",
    "available_engines",
    "build",
    "load_dir",
    "make_runtime",
    "read_dir",
    "read_texts",
]
