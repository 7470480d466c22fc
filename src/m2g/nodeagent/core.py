"""One node's agent step: read the devices, decide (m2g.model.powerlimit.decide), set the
limits that change, read back, and say what status to report.

``NodeAgentCore.step(obj, now)`` returns the status to write, or None when there is nothing
new to say (the same status as last written, or no object: a released node reports nothing,
there is no object to report on). ``release()`` restores every default (the agent's shutdown).
A device error is reported in the status (phase Failed) and tried again at the next step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from m2g.model.powerlimit import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_MIN_INTERVAL_SECONDS,
    Decision,
    LimitPhase,
    LimitSpec,
    decide,
    parse_spec,
    status_body,
)
from m2g.nodeagent.nvml import GpuBackend, GpuError, ReadOnly


@dataclass
class NodeAgentCore:
    """The agent of one node (``backend``: its GPUs)."""

    node: str
    backend: GpuBackend
    grace_seconds: float = DEFAULT_GRACE_SECONDS
    min_interval_seconds: float = DEFAULT_MIN_INTERVAL_SECONDS
    last_change: datetime | None = None
    applied_at: datetime | None = None
    _last_status: dict[str, Any] | None = field(default=None, repr=False)
    changes: int = 0  # limits set (for metrics and tests)

    def step(self, obj: Mapping[str, Any] | None, now: datetime) -> dict[str, Any] | None:
        spec: LimitSpec | str | None = None if obj is None else parse_spec(obj)
        try:
            devices = self.backend.devices()
        except GpuError as exc:
            return self._report(obj, {"phase": str(LimitPhase.FAILED), "message": str(exc)})
        decision = decide(spec, devices, now, last_change=self.last_change,
                          grace_seconds=self.grace_seconds,
                          min_interval_seconds=self.min_interval_seconds)
        decision = self._apply(decision, now)
        try:
            devices = self.backend.devices()
        except GpuError as exc:
            decision = Decision({}, LimitPhase.FAILED, str(exc))
        generation = spec.generation if isinstance(spec, LimitSpec) else 0
        return self._report(obj, status_body(devices, decision, generation, self.applied_at))

    def _apply(self, decision: Decision, now: datetime) -> Decision:
        if not decision.targets:
            return decision
        if isinstance(self.backend, ReadOnly):
            wanted = ", ".join(f"GPU {i} {w:g} W" for i, w in sorted(decision.targets.items()))
            return Decision({}, LimitPhase.READ_ONLY, f"read-only: would set {wanted}")
        try:
            for index, watts in sorted(decision.targets.items()):
                self.backend.set_limit(index, watts)
                self.changes += 1
        except GpuError as exc:
            return Decision({}, LimitPhase.FAILED, str(exc))
        self.last_change = self.applied_at = now
        return decision

    def _report(self, obj: Mapping[str, Any] | None,
                status: dict[str, Any]) -> dict[str, Any] | None:
        if obj is None or status == self._last_status:
            return None
        self._last_status = status
        return status

    def forget_status(self) -> None:
        """The status write failed: report again at the next step."""
        self._last_status = None

    def release(self, now: datetime) -> None:
        """Every GPU back to its default limit (shutdown: never leave a GPU capped)."""
        self.step(None, now)
