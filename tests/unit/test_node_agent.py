"""The GPU power-limit protocol (m2g.model.powerlimit) and the node agent's step
(m2g.nodeagent): clamping, the lease fail-safe, the rate limit, read-only, NVML errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from m2g.model.powerlimit import (
    Device,
    LimitPhase,
    decide,
    node_limit_state,
    parse_spec,
)
from m2g.nodeagent.core import NodeAgentCore
from m2g.nodeagent.nvml import FakeNvml, GpuError, Nvml, ReadOnly

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def obj(fraction: float = 0.75, expires: datetime | None = None, watts: int | None = None,
        node: str = "n1", generation: int = 3) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node, "fraction": fraction,
                            "expiresAt": (expires or T0 + timedelta(seconds=120)).strftime(
                                "%Y-%m-%dT%H:%M:%SZ"), "workloads": ["t/a"], "reason": "dr"}
    if watts is not None:
        spec["watts"] = watts
    return {"metadata": {"name": node, "generation": generation}, "spec": spec}


def dev(limit: float = 1400.0, default: float = 1400.0, lo: float = 200.0,
        hi: float = 1400.0, index: int = 0) -> Device:
    return Device(index, f"GPU-{index}", limit, default, lo, hi)


def test_fraction_of_default_and_clamped_to_the_device_range() -> None:
    spec = parse_spec(obj(0.75))
    assert decide(spec, [dev()], T0).targets == {0: 1050}
    low = parse_spec(obj(0.1))
    assert decide(low, [dev()], T0).targets == {0: 200}  # the device's min
    absolute = parse_spec(obj(watts=5000))
    assert decide(absolute, [dev(limit=700)], T0).targets == {0: 1400}  # the device's max


def test_nothing_changes_when_the_limit_is_in_force() -> None:
    d = decide(parse_spec(obj(0.75)), [dev(limit=1050)], T0)
    assert d.targets == {} and d.phase is LimitPhase.APPLIED


def test_released_invalid_or_expired_restores_the_default() -> None:
    capped = [dev(limit=700), dev(limit=1400, index=1)]
    assert decide(None, capped, T0).targets == {0: 1400}
    bad = parse_spec({"metadata": {"name": "n1"}, "spec": {"nodeName": "n1", "fraction": 3}})
    assert isinstance(bad, str)
    assert decide(bad, capped, T0).phase is LimitPhase.INVALID
    lease_end = T0 + timedelta(seconds=120)
    spec = parse_spec(obj(0.5, expires=lease_end))
    within = decide(spec, capped, lease_end + timedelta(seconds=59), grace_seconds=60)
    assert within.phase is LimitPhase.APPLIED and within.targets == {1: 700}
    after = decide(spec, capped, lease_end + timedelta(seconds=61), grace_seconds=60)
    assert after.phase is LimitPhase.EXPIRED and after.targets == {0: 1400}


def test_a_lease_more_than_an_hour_ahead_is_refused() -> None:
    far = parse_spec(obj(0.5, expires=T0 + timedelta(hours=2)))
    d = decide(far, [dev(limit=700)], T0)
    assert d.phase is LimitPhase.INVALID and d.targets == {0: 1400}


def test_rate_limit_delays_lowering_never_restoring() -> None:
    spec = parse_spec(obj(0.5))
    just = T0 - timedelta(seconds=2)
    held = decide(spec, [dev()], T0, last_change=just, min_interval_seconds=5)
    assert held.phase is LimitPhase.PENDING and held.targets == {}
    assert decide(spec, [dev()], T0, last_change=T0 - timedelta(seconds=6),
                  min_interval_seconds=5).targets == {0: 700}
    assert decide(None, [dev(limit=700)], T0, last_change=just,
                  min_interval_seconds=5).targets == {0: 1400}


def test_core_applies_reports_and_restores_on_release() -> None:
    gpus = FakeNvml(gpus=2, node="n1")
    core = NodeAgentCore("n1", gpus)
    status = core.step(obj(0.75), T0)
    assert status is not None and status["phase"] == "Applied"
    assert [g["limitWatts"] for g in status["gpus"]] == [1050, 1050]
    assert status["observedGeneration"] == 3 and status["appliedAt"] == "2026-12-01T10:00:00Z"
    assert core.step(obj(0.75), T0 + timedelta(seconds=10)) is None  # nothing new to say
    core.release(T0 + timedelta(seconds=20))
    assert gpus.limits == {0: 1400, 1: 1400}


def test_core_restores_after_the_lease_when_the_controller_is_gone() -> None:
    gpus = FakeNvml(gpus=1, node="n1")
    core = NodeAgentCore("n1", gpus, grace_seconds=30)
    core.step(obj(0.5), T0)
    assert gpus.limits == {0: 700}
    status = core.step(obj(0.5), T0 + timedelta(seconds=151))  # lease 120 s + 30 s grace
    assert status is not None and status["phase"] == "Expired"
    assert gpus.limits == {0: 1400}


def test_read_only_never_sets_a_limit() -> None:
    inner = FakeNvml(gpus=1, node="n1")
    core = NodeAgentCore("n1", ReadOnly(inner))
    status = core.step(obj(0.5), T0)
    assert status is not None and status["phase"] == "ReadOnly"
    assert "would set GPU 0 700 W" in status["message"]
    assert inner.calls == [] and status["gpus"][0]["limitWatts"] == 1400


def test_fake_refuses_out_of_range_like_nvml() -> None:
    with pytest.raises(GpuError, match="outside"):
        FakeNvml(gpus=1).set_limit(0, 100)


class _Err(Exception):
    pass


class FakeBinding:
    """pynvml's shape, milliwatts."""

    NVMLError = _Err

    def __init__(self, refuse_set: bool = False) -> None:
        self.limit_mw, self.refuse_set, self.sets = 700_000, refuse_set, []

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return 1
    def nvmlDeviceGetHandleByIndex(self, i: int) -> str: return f"h{i}"
    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: str) -> tuple[int, int]:
        return 200_000, 700_000
    def nvmlDeviceGetUUID(self, h: str) -> bytes: return b"GPU-abc"
    def nvmlDeviceGetPowerManagementLimit(self, h: str) -> int: return self.limit_mw
    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: str) -> int: return 700_000
    def nvmlDeviceGetPowerUsage(self, h: str) -> int: return 650_500

    def nvmlDeviceSetPowerManagementLimit(self, h: str, mw: int) -> None:
        if self.refuse_set:
            raise _Err("Insufficient Permissions")
        self.sets.append(mw)
        self.limit_mw = mw


def test_nvml_backend_speaks_milliwatts() -> None:
    b = FakeBinding()
    gpus = Nvml(b)
    [d] = gpus.devices()
    assert (d.uuid, d.limit_w, d.min_w, d.max_w, d.power_w) == ("GPU-abc", 700, 200, 700, 650.5)
    gpus.set_limit(0, 525)
    assert b.sets == [525_000]


def test_nvml_refusal_is_reported_not_raised() -> None:
    core = NodeAgentCore("n1", Nvml(FakeBinding(refuse_set=True)))
    status = core.step(obj(0.5), T0)
    assert status is not None and status["phase"] == "Failed"
    assert "Insufficient Permissions" in status["message"]


def test_real_binding_without_a_driver_is_one_line() -> None:
    pytest.importorskip("pynvml")
    try:
        gpus = Nvml()
    except GpuError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("NVML")
        return
    gpus.close()  # a machine with a driver: this test is about machines without one
    pytest.skip("an NVML driver is present")


def test_snapshot_view_of_an_object() -> None:
    o = obj(0.5) | {"status": {"phase": "Applied", "appliedAt": "2026-12-01T10:00:05Z",
                               "gpus": [{"limitWatts": 700, "defaultWatts": 1400}]}}
    s = node_limit_state(o)
    assert s is not None and s.spec is not None and s.spec.fraction == 0.5
    assert s.applied_fraction == 0.5 and s.phase == "Applied"
