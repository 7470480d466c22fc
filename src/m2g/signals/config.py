"""Which PromQL feeds which signal, and how old its value may be before it counts as stale.

``SignalConfig`` is frozen; the defaults read NVIDIA DCGM exporter series for GPUs and the
``facility_*`` series (PDU power, rack inlet and coolant, power-domain feeds; see below) for
racks and power domains. A site points the facility signals at its own DCIM/BMS exporter by
overriding ``query`` and ``keyLabel`` in its site configuration (docs/configuration.md).
Default queries are plain selectors on purpose: then ``timestamp(<query>)`` is the age of each
sample; an aggregating query only ages with Prometheus's look-back window (docs/signals.md);
several series per rack are combined by m2g (``aggregate``), not by PromQL.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from m2g import yamlbounds

#: Models of site configuration files: camelCase keys in YAML (``maxAgeSeconds``), the Python
#: names (``max_age_seconds``) accepted too; unknown keys rejected; frozen.
#: Every configuration model: camelCase, unknown keys refused, and no NaN or infinity in a
#: number (``defaultKwPerGpu: .inf`` or ``resync: .nan`` would be read as if they meant one).
CAMEL = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True,
                   allow_inf_nan=False)
#: A duration in a configuration, at most (ten years: a larger one overflows a timedelta and
#: stops every reconcile that adds it to a time).
MAX_SECONDS = 10 * 365 * 86400
#: The most series one Prometheus answer may hold (``prometheus.maxSeries``): 1,400 racks of 72
#: GPUs are 100,800 series of a GPU signal; the rest is room for an exporter's series changing
#: names. A larger answer fails that signal alone (it reads as missing), read no further.
MAX_SERIES = 150_000
#: The most JSON values a Prometheus answer may hold a series (``maxValuesPerSeries``): a series
#: as Prometheus writes it is 5 values and one a label (the element, its ``metric``, each label
#: value, its ``value`` pair and the pair's two items), so 64 fits series of up to 59 labels
#: (DCGM exporter's with Kubernetes' and Thanos's are ~15-20). A larger answer — e.g. one series
#: whose ``value`` is an array of millions of numbers — fails that signal alone, read no further.
MAX_VALUES_PER_SERIES = 64
#: The most JSON values one Prometheus answer may hold in all (``maxValues``): 1,400 racks of 72
#: GPUs (100,800 series) of up to 34 labels, or 150,000 series of up to 21. The two bounds
#: above multiply — 150,000 tiny series leave room for millions of values in one array
#: (~64 x 150,000 = 9.6 M: 5.5-10 s of CPU and +509 MiB to read) —, this one does not: what an
#: answer costs is bounded by it and the bytes. A larger answer fails that signal alone, read
#: no further.
MAX_VALUES = 4_000_000


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


class Aggregate(StrEnum):
    """How several series with the same key (rack, power domain) combine into one reading."""

    NEWEST = "newest"  # one series per key is expected; of duplicates the newest counts
    SUM = "sum"  # e.g. the PDUs / power shelves of a rack: the rack's power is their sum
    MAX = "max"  # e.g. several inlet sensors of a rack: the hottest counts


class SignalSpec(BaseModel):
    """One signal: its PromQL, what its series describe and its maximum age."""

    model_config = CAMEL

    query: str = Field(min_length=1)
    scope: SignalScope
    key_label: str = Field(min_length=1, pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    gpu_label: str = Field(default="gpu", pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")
    max_age_seconds: float = Field(gt=0, le=MAX_SECONDS)
    scale: float = 1.0  # multiply values by this (e.g. 0.001 for a W series feeding a kW signal)
    #: Facility signals only: how series sharing a key combine (a sum is stale if any part is).
    aggregate: Aggregate = Aggregate.NEWEST


DCGM_HOST_LABEL = "Hostname"

#: The facility series m2g reads by default (docs/configuration.md): one per PDU / power shelf
#: (label ``rack``, summed), per rack inlet and coolant sensor (label ``rack``, the hottest
#: counts) and per power-domain feed (label ``power_domain``, summed), in base units. A site
#: maps its DCIM / BMS exporter onto these names with recording rules, or points each signal's
#: query at its own series in the site configuration; the telemetry simulator exports them.
FACILITY_PDU_POWER = "facility_pdu_power_watts"
FACILITY_RACK_INLET = "facility_rack_inlet_temperature_celsius"
FACILITY_RACK_COOLANT = "facility_rack_coolant_supply_temperature_celsius"
FACILITY_DOMAIN_POWER = "facility_power_domain_power_watts"

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
        query=FACILITY_PDU_POWER, scope=SignalScope.RACK, key_label="rack",
        max_age_seconds=60, scale=0.001, aggregate=Aggregate.SUM),
    SignalName.RACK_INLET_C: SignalSpec(
        query=FACILITY_RACK_INLET, scope=SignalScope.RACK, key_label="rack",
        max_age_seconds=120, aggregate=Aggregate.MAX),
    SignalName.COOLANT_TEMP_C: SignalSpec(
        query=FACILITY_RACK_COOLANT, scope=SignalScope.RACK, key_label="rack",
        max_age_seconds=120, aggregate=Aggregate.MAX),
    SignalName.DOMAIN_POWER_KW: SignalSpec(
        query=FACILITY_DOMAIN_POWER, scope=SignalScope.POWER_DOMAIN, key_label="power_domain",
        max_age_seconds=60, scale=0.001, aggregate=Aggregate.SUM),
}


def redact_url(url: str) -> str:
    """``url`` fit for a log line or an error: no user:password, no query values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(f"{kv.split('=', 1)[0]}=***" for kv in parts.query.split("&") if kv)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


class PrometheusSettings(BaseModel):
    """How to reach the site's Prometheus-compatible API (Prometheus, Thanos Querier, Mimir,
    OpenShift's monitoring stack). Credentials are read from files (a mounted Secret or the
    pod's ServiceAccount token), never written in the configuration itself."""

    model_config = CAMEL

    url: str = Field(default="http://127.0.0.1:9090", pattern=r"^https?://[^\s]+$")
    timeout_seconds: float = Field(default=5.0, gt=0, le=3600)
    #: The largest answer read (bytes, default 64 MiB): a larger or endless one fails that
    #: signal (it reads as missing: the fail-safe), read no further.
    max_response_bytes: int = Field(default=64 << 20, ge=1 << 10, le=1 << 30)
    #: The most series an answer may hold (default ``MAX_SERIES``, 150,000: 1,400 racks of 72
    #: GPUs and room to spare): a larger one fails that signal (it reads as missing), read no
    #: further; the other signals are read as usual.
    max_series: int = Field(default=MAX_SERIES, ge=1, le=10_000_000)
    #: The most JSON values an answer may hold a series (default ``MAX_VALUES_PER_SERIES``, 64:
    #: series of up to 59 labels): a larger one fails that signal (it reads as missing), read
    #: no further; the other signals are read as usual.
    max_values_per_series: int = Field(default=MAX_VALUES_PER_SERIES, ge=8, le=1_000_000)
    #: The most JSON values an answer may hold in all (default ``MAX_VALUES``, 4,000,000:
    #: 100,800 series of up to 34 labels): a larger one fails that signal (it reads as
    #: missing), read no further; the other signals are read as usual.
    max_values: int = Field(default=MAX_VALUES, ge=64, le=100_000_000)
    #: ``Authorization: Bearer <file's content>``, re-read when the file changes (projected
    #: ServiceAccount tokens rotate). A file that is missing is an error, never anonymous access.
    bearer_token_file: Path | None = None
    #: PEM bundle to verify the server's certificate with (e.g. OpenShift's service CA).
    ca_file: Path | None = None
    #: Skip certificate verification (test clusters only; says so in the log).
    insecure_skip_verify: bool = False
    #: Extra request headers, e.g. ``X-Scope-OrgID`` (Mimir, Cortex, Thanos tenancy).
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _no_credentials_inline(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name.lower() in ("authorization", "proxy-authorization", "cookie"):
                raise ValueError(f"header {name} carries a credential: put the token in a file "
                                 "and name it with bearerTokenFile")
        return value

    @field_validator("url")
    @classmethod
    def _no_password_in_url(cls, value: str) -> str:
        if "@" in urlsplit(value).netloc:
            raise ValueError(f"the URL {redact_url(value)} carries credentials: use "
                             "bearerTokenFile")
        return value

    def where(self) -> str:
        """The server as errors name it (credentials never printed)."""
        return redact_url(self.url)


class SignalConfig(BaseModel):
    """Where Prometheus is and the spec of every signal (missing ones take the default)."""

    model_config = CAMEL

    url: str = "http://127.0.0.1:9090"
    timeout_seconds: float = Field(default=5.0, gt=0, le=3600)
    #: the largest answer read (PrometheusSettings.max_response_bytes)
    max_response_bytes: int = Field(default=64 << 20, ge=1 << 10, le=1 << 30)
    #: the most series an answer may hold (PrometheusSettings.max_series)
    max_series: int = Field(default=MAX_SERIES, ge=1, le=10_000_000)
    #: the most JSON values an answer may hold a series (PrometheusSettings.max_values_per_series)
    max_values_per_series: int = Field(default=MAX_VALUES_PER_SERIES, ge=8, le=1_000_000)
    #: the most JSON values an answer may hold in all (PrometheusSettings.max_values)
    max_values: int = Field(default=MAX_VALUES, ge=64, le=100_000_000)
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
                merged[key] = {**merged[key], **_snake_keys(spec)}
            else:
                merged[key] = spec
        return merged

    def spec(self, name: SignalName) -> SignalSpec:
        return self.signals[name]


def _snake_keys(spec: dict[Any, Any]) -> dict[Any, Any]:
    """``{maxAgeSeconds: 15}`` → ``{max_age_seconds: 15}`` for the merge with a default (an
    unknown key stays as it is, so validation still names it)."""
    names = {to_camel(f): f for f in SignalSpec.model_fields}
    return {names.get(k, k) if isinstance(k, str) else k: v for k, v in spec.items()}


def load_signal_config(path: Path) -> SignalConfig:
    """Read a YAML signal configuration; every problem becomes one SignalConfigError line."""
    try:
        docs = yamlbounds.load_file(path)
    except ValueError as exc:
        raise SignalConfigError(f"signal config {path}: {exc}") from None
    if len(docs) > 1:
        raise SignalConfigError(f"signal config {path}: {len(docs)} YAML documents, one "
                                "expected")
    data = (docs[0] if docs else None) or {}
    try:
        return SignalConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise SignalConfigError(f"signal config {path} is invalid: {problems}") from None
