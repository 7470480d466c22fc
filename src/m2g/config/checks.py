"""Which AdmissionChecks m2g answers, and with which policies (docs/configuration.md).

Kueue's protocol: an admission check controller answers every AdmissionCheck whose
``spec.controllerName`` is its own (``m2g.io/policy``), whatever the check is called. A check may
name a configuration in ``spec.parameters``:

    parameters: {apiGroup: m2g.io, kind: AdmissionCheckConfig, name: inference}

which is the entry ``inference`` of the site configuration's ``admissionChecks.configs``. Its
``policies`` select the Admission and Placement policies that answer that check (Capacity,
Preemption and Fairness stay site-wide). A reference m2g cannot resolve makes the check's
``Active`` condition False with reason ``BadParametersRef`` (as Kueue's own controllers do): its
ClusterQueues admit nothing until it is fixed — the fail-safe way round.

Pure: ``resolve_checks`` maps the checks seen in the cluster to ``CheckSetup`` values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from m2g.signals.config import CAMEL

PARAMETERS_GROUP = "m2g.io"
PARAMETERS_KIND = "AdmissionCheckConfig"


class CheckConfig(BaseModel):
    """What one AdmissionCheck's parameters select."""

    model_config = CAMEL

    #: The Admission and Placement policies (Policy names) that answer this check; absent: all.
    policies: tuple[str, ...] | None = None


class AdmissionCheckSettings(BaseModel):
    """The ``admissionChecks`` section of the site configuration."""

    model_config = CAMEL

    #: The check m2g creates if missing and keeps Active (m2g run --check-name overrides it).
    name: str = Field(default="m2g-policy", min_length=1, max_length=253)
    #: Configurations AdmissionChecks name in ``spec.parameters`` (kind AdmissionCheckConfig).
    configs: dict[str, CheckConfig] = Field(default_factory=dict)


@dataclass(frozen=True)
class CheckSetup:
    """How m2g treats one of its AdmissionChecks in this reconcile."""

    name: str
    active: bool  # its Active condition: True, or False with ``reason`` and ``message``
    reason: str
    message: str
    policies: tuple[str, ...] | None = None  # None: every policy of the set


def _bad(name: str, message: str) -> CheckSetup:
    return CheckSetup(name, False, "BadParametersRef", message)


def _setup(name: str, params: Mapping[str, Any] | None, configs: Mapping[str, CheckConfig],
           known: frozenset[str]) -> CheckSetup:
    if not params:
        return CheckSetup(name, True, "Active", "m2g answers this admission check")
    group, kind, ref = params.get("apiGroup"), params.get("kind"), params.get("name")
    if (group, kind) != (PARAMETERS_GROUP, PARAMETERS_KIND):
        return _bad(name, f"parameters {group}/{kind} are not m2g's: use apiGroup "
                          f"{PARAMETERS_GROUP}, kind {PARAMETERS_KIND}")
    config = configs.get(str(ref))
    if config is None:
        listed = ", ".join(sorted(configs)) or "none"
        return _bad(name, f"no admissionChecks.configs entry {ref!r} in m2g's site "
                          f"configuration (configured: {listed})")
    missing = sorted(set(config.policies or ()) - known)
    if missing:
        return _bad(name, f"config {ref!r} selects policies that are not loaded: "
                          f"{', '.join(missing)}")
    return CheckSetup(name, True, "Active", f"m2g answers this admission check with config "
                      f"{ref!r}", config.policies)


def resolve_checks(checks: Mapping[str, Mapping[str, Any] | None], default: str,
                   configs: Mapping[str, CheckConfig], policy_names: Iterable[str]
                   ) -> dict[str, CheckSetup]:
    """One ``CheckSetup`` per check of m2g's (name → its ``spec.parameters``), plus ``default``
    (created if missing); ``policy_names`` are the policies loaded now."""
    known = frozenset(policy_names)
    out = {name: _setup(name, params, configs, known) for name, params in sorted(checks.items())}
    out.setdefault(default, CheckSetup(default, True, "Active",
                                       "m2g answers this admission check"))
    return out
