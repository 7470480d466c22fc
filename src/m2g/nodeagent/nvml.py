"""GPU backends of the node agent: NVML through nvidia-ml-py (the official binding), a fake
with the same behaviour for KWOK, tests and the twin, and a read-only wrapper.

NVML speaks milliwatts; everything here is watts. NVML's rules that the fake copies: a limit
outside [min, max] is refused (``InvalidArgument``), setting one needs root
(``NoPermission``; in a container: CAP_SYS_ADMIN, docs/node-agent.md). Errors are
``GpuError`` with one line, never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from m2g.errors import M2gError
from m2g.model.powerlimit import Device

#: The fake's defaults: a GB300 (1,400 W TDP); NVML's min limit on it is not public, 200 W is
#: assumed (the sweep's lowest cap is 25 % of TDP).
FAKE_DEFAULT_W, FAKE_MIN_W, FAKE_MAX_W = 1400.0, 200.0, 1400.0


class GpuError(M2gError):
    """NVML (or the fake) refused or failed: one line."""


class GpuBackend(Protocol):
    """What the agent needs of the GPUs of its node."""

    def devices(self) -> list[Device]: ...

    def set_limit(self, index: int, watts: float) -> None: ...

    def close(self) -> None: ...


@dataclass
class FakeNvml:
    """``gpus`` GPUs that keep their limits in memory (and NVML's range check)."""

    gpus: int = 4
    default_w: float = FAKE_DEFAULT_W
    min_w: float = FAKE_MIN_W
    max_w: float = FAKE_MAX_W
    node: str = "fake"
    limits: dict[int, float] = field(default_factory=dict)
    calls: list[tuple[int, float]] = field(default_factory=list)

    def devices(self) -> list[Device]:
        return [Device(i, f"GPU-fake-{self.node}-{i}", self.limits.get(i, self.default_w),
                       self.default_w, self.min_w, self.max_w) for i in range(self.gpus)]

    def set_limit(self, index: int, watts: float) -> None:
        if not 0 <= index < self.gpus:
            raise GpuError(f"GPU {index}: no such device")
        if not self.min_w <= watts <= self.max_w:
            raise GpuError(f"GPU {index}: {watts:g} W outside [{self.min_w:g}, {self.max_w:g}]")
        self.calls.append((index, watts))
        self.limits[index] = watts

    def close(self) -> None:
        return


@dataclass
class ReadOnly:
    """Reads through ``inner``, never sets a limit (``--read-only``; a lent GPU machine)."""

    inner: GpuBackend

    def devices(self) -> list[Device]:
        return self.inner.devices()

    def set_limit(self, index: int, watts: float) -> None:
        raise GpuError(f"read-only: GPU {index} left at its limit (wanted {watts:g} W)")

    def close(self) -> None:
        self.inner.close()


class Nvml:
    """The node's GPUs through nvidia-ml-py (``import pynvml``). ``Nvml()`` raises GpuError
    when the binding or the driver library is missing."""

    def __init__(self, binding: Any = None) -> None:
        if binding is None:
            try:
                import pynvml  # nvidia-ml-py: m2g[node-agent]
            except ImportError:
                raise GpuError("nvidia-ml-py is not installed: pip install 'm2g[node-agent]'"
                               ) from None
            binding = pynvml
        self._n = binding
        self._call(self._n.nvmlInit)
        self._handles: Sequence[Any] = [
            self._call(self._n.nvmlDeviceGetHandleByIndex, i)
            for i in range(int(self._call(self._n.nvmlDeviceGetCount)))]

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._n.NVMLError as exc:
            raise GpuError(f"NVML {fn.__name__}: {exc}") from None

    def devices(self) -> list[Device]:
        out = []
        for i, h in enumerate(self._handles):
            lo, hi = self._call(self._n.nvmlDeviceGetPowerManagementLimitConstraints, h)
            uuid = self._call(self._n.nvmlDeviceGetUUID, h)
            out.append(Device(
                i, uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                self._call(self._n.nvmlDeviceGetPowerManagementLimit, h) / 1000.0,
                self._call(self._n.nvmlDeviceGetPowerManagementDefaultLimit, h) / 1000.0,
                lo / 1000.0, hi / 1000.0,
                self._call(self._n.nvmlDeviceGetPowerUsage, h) / 1000.0))
        return out

    def set_limit(self, index: int, watts: float) -> None:
        if not 0 <= index < len(self._handles):
            raise GpuError(f"GPU {index}: no such device")
        self._call(self._n.nvmlDeviceSetPowerManagementLimit, self._handles[index],
                   round(watts * 1000))

    def close(self) -> None:
        try:
            self._n.nvmlShutdown()
        except self._n.NVMLError:
            return
