"""Which PromQL feeds which signal, and how old its value may be before it counts as stale.

``SignalConfig`` is frozen; the defaults read NVIDIA DCGM exporter series for GPUs and the factory
telemetry simulator's facility series (``m2g_sim_*``) for racks and power domains. A site points
the facility signals at its own DCIM/BMS exporter by overriding ``query`` and ``key_label`` in a
YAML file (``load_signal_config``). Default queries are plain selectors on purpose: then
``timestamp(<query>)`` is the age of each sample; an aggregating query only ages with Prometheus's
look-back window (docs/signals.md).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class SignalName(StrEnum):
    """The signals m2g reads."""

    GPU_POWER_W = "gpu_power_w"
    GPU_TEMP_C = "gpu_temp_c"
    GPU_XID = "gpu_xid"
    RACK_POWER_KW = "rack_power_kw"
    RACK_INLET_C = "rack_inlet_c"
    COOLANT_TEMP_C = "coolant_temp_c"
    DOMAIN_POWER_KW = "domain_power_kw"


class SignalScope(StrEnum):
    """What one series of the signal describes; ``key_label`` names it."""

    GPU = "gpu"  # one series per GPU; key_label = the node, gpu_label = the GPU index
    RACK = "rack"
    POWER_DOMAIN = "powerDomain"


class SignalConfigError(Exception):
    """A signal configuration file that cannot be used; the message is one line."""


class SignalSpec(BaseModel):
    """One signal: its PromQL, what its series describe and its maximum age."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    query: str = Field(min_length=1)
    scope: SignalScope
    key_label: str = Field(min_length=1, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    gpu_label: str = Field(default="gpu", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    max_age_seconds: float = Field(gt=0)
    scale: float = 1.0  # multiply values by this (e.g. 0.001 for a W series feeding a kW signal)


DCGM_HOST_LABEL = "Hostname"

DEFAULT_SIGNALS: dict[SignalName, SignalSpec] = {
    SignalName.GPU_POWER_W: SignalSpec(
        query="DCGM_FI_DEV_POWER_USAGE", scope=SignalScope.GPU,
        key_label=DCGM_HOST_LABEL, max_age_seconds=60),
    SignalName.GPU_TEMP_C: SignalSpec(
        query="DCGM_FI_DEV_GPU_TEMP", scope=SignalScope.GPU,
        key_label=DCGM_HOST_LABEL, max_age_seconds=60),
    SignalName.GPU_XID: SignalSpec(
        query="DCGM_FI_DEV_XID_ERRORS", scope=SignalScope.GPU,
        key_label=DCGM_HOST_LABEL, max_age_seconds=120),
    SignalName.RACK_POWER_KW: SignalSpec(
        query="m2g_sim_rack_power_kilowatts", scope=SignalScope.RACK,
        key_label="rack", max_age_seconds=60),
    SignalName.RACK_INLET_C: SignalSpec(
        query="m2g_sim_rack_inlet_celsius", scope=SignalScope.RACK,
        key_label="rack", max_age_seconds=120),
    SignalName.COOLANT_TEMP_C: SignalSpec(
        query="m2g_sim_rack_coolant_supply_celsius", scope=SignalScope.RACK,
        key_label="rack", max_age_seconds=120),
    SignalName.DOMAIN_POWER_KW: SignalSpec(
        query="m2g_sim_power_domain_power_kilowatts", scope=SignalScope.POWER_DOMAIN,
        key_label="power_domain", max_age_seconds=60),
}


class SignalConfig(BaseModel):
    """Where Prometheus is and the spec of every signal (missing ones take the default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = "http://127.0.0.1:9090"
    timeout_seconds: float = Field(default=5.0, gt=0)
    signals: dict[SignalName, SignalSpec] = Field(default_factory=lambda: dict(DEFAULT_SIGNALS))

    @field_validator("signals", mode="before")
    @classmethod
    def _merge_defaults(cls, value: Any) -> Any:
        """A partial entry overrides only the fields it names; absent signals keep defaults."""
        if not isinstance(value, dict):
            return value
        merged: dict[Any, Any] = {k: v.model_dump() for k, v in DEFAULT_SIGNALS.items()}
        for name, spec in value.items():
            key = SignalName(name) if name in SignalName._value2member_map_ else name
            if isinstance(spec, SignalSpec):
                merged[key] = spec
            elif isinstance(spec, dict) and key in merged:
                merged[key] = {**merged[key], **spec}
            else:
                merged[key] = spec
        return merged

    def spec(self, name: SignalName) -> SignalSpec:
        return self.signals[name]


def load_signal_config(path: Path) -> SignalConfig:
    """Read a YAML signal configuration; every problem becomes one SignalConfigError line."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise SignalConfigError(f"signal config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise SignalConfigError(f"signal config {path} is not valid YAML: {exc}") from None
    try:
        return SignalConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise SignalConfigError(f"signal config {path} is invalid: {problems}") from None
