"""Lint warnings for policy patterns that cost O(domains) per workload.

A comprehension (``exists``, ``all``, ``exists_one``, ``map``, ``filter``) over ``domains`` or a
``topology`` list visits every rack, clique or block. Where it reads neither ``workload`` nor
``queue`` it is computed once per snapshot (a leading match condition or a variable: see
m2g.policy.batch), which is fine. Inside a per-workload stage (Admission, Placement,
Preemption) anywhere else it runs once per workload — or once per workload class — and at
1,400 racks that is thousands of steps per decision (cel-expr-python also copies a ``filter``'s
or ``map``'s result list at every step: quadratic). ``m2g policy lint`` prints these as
warnings (exit code unchanged); docs/policies.md, "Writing fast policies", says what to do
instead (a per-snapshot variable, or the ``facts`` index).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from m2g.policy.batch.cel_source import hoistable, split_match
from m2g.policy.compiler import CompiledPolicy, PolicySet
from m2g.policy.errors import Problem
from m2g.policy.fired import slots
from m2g.policy.inline import strip_strings
from m2g.policy.spec import Stage

PER_WORKLOAD = (Stage.ADMISSION, Stage.PLACEMENT, Stage.PREEMPTION)
_SCAN = re.compile(r"(?<![\w.])(domains|topology\s*\.\s*[A-Za-z_]\w*)\s*\.\s*"
                   r"(exists_one|exists|all|map|filter)\s*\(")
_SPACE = re.compile(r"\s+")


def scans(source: str) -> list[str]:
    """The comprehensions over domains / topology lists in ``source``, as
    ``topology.racks.filter``."""
    return [_SPACE.sub("", m.group(1)) + "." + m.group(2)
            for m in _SCAN.finditer(strip_strings(source))]


def _per_workload(policy: CompiledPolicy) -> Iterator[tuple[str, int, str]]:
    """(what, line, source) of every expression of ``policy`` evaluated per workload."""
    once = set(hoistable(policy))
    for name in policy.variables.order:
        if name not in once:
            yield f"variable {name}", policy.line, policy.variables.bare[name]
    _, per_item = split_match(policy)
    for prog in per_item:
        yield "matchCondition", policy.line, prog.bare
    for rule in policy.rules:  # bare: the variables they read are reported as variables
        yield f"rule {rule.name}", rule.line, " ".join(
            [rule.when.bare, *(prog.bare for _, prog in slots(rule))])


def scan_warnings(pset: PolicySet) -> list[Problem]:
    """One warning per per-workload expression that scans the factory."""
    out: list[Problem] = []
    for policy in pset.policies:
        if policy.stage not in PER_WORKLOAD:
            continue
        for what, line, source in _per_workload(policy):
            found = scans(source)
            if found:
                out.append(Problem(
                    policy.file, line, policy.name, "",
                    f"warning: {what}: {', '.join(dict.fromkeys(found))} runs once per workload "
                    "(O(domains) per decision); compute what does not depend on the workload "
                    "in a variable that reads neither workload nor queue (once per snapshot), "
                    "or read the facts index (docs/policies.md, \"Writing fast policies\")"))
    return out
