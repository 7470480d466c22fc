"""Template parameters: the catalogue of knobs, ``--set key=value`` parsing and resolution.

Every knob has one type and one meaning across templates (the catalogue below). Common knobs
(name, priority, image, ...) exist for every template; shape knobs (tp, replicas, workers, ...)
only where the template declares them. Resolution order: catalogue default, then the template's
default, then ``--set``. Every error is one line naming the template and the key.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from m2g.templates.errors import TemplateError
from m2g.templates.schema import DNS_LABEL, ParamBounds, Shape, WorkloadTemplate

Value = int | str


@dataclass(frozen=True, slots=True)
class Knob:
    """One catalogue entry: type, global default and hard bounds."""

    name: str
    type: type[int] | type[str]
    default: Value
    help: str
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] | None = None
    shapes: frozenset[Shape] | None = None  # None: common to every template


_TRAIN = frozenset({Shape.TRAINING})
_MODEL = frozenset({Shape.TRAINING, Shape.SERVING})
_SERVE = frozenset({Shape.SERVING})
_INDEP = frozenset({Shape.INDEPENDENT})

CATALOGUE: dict[str, Knob] = {k.name: k for k in (
    Knob("name", str, "", "workload name (default: the template name)"),
    Knob("api", str, "", "workload API to render (one of the template's apis)"),
    Knob("priority", str, "", "Kueue WorkloadPriorityClass name"),
    Knob("flex_tier", int, 2, "m2g flex tier: 0 never curtailed .. 3 most flexible", 0, 3),
    Knob("image", str, "", "container image"),
    Knob("scheduler", str, "kai", "pod scheduler", choices=("kai", "default")),
    Knob("kai_queue", str, "", "KAI queue label (empty: KAI's default queue)"),
    Knob("topology", str, "nvl72", "KAI Topology object name"),
    Knob("nvlink_level", str, "nvidia.com/gpu.clique", "node label of an NVLink domain"),
    Knob("block_level", str, "network.topology.nvidia.com/block", "node label of a network block"),
    Knob("block_gpus", int, 576, "GPUs in one block (8 NVL72 racks)", 72, 73728),
    Knob("checkpoint_interval", int, 0, "seconds between checkpoints (0: none)", 0, 86400),
    Knob("checkpoint_pvc", str, "", "PVC for checkpoints (empty: none mounted)"),
    Knob("data_pvc", str, "", "PVC mounted at /data (datasets, shards; empty: none)"),
    Knob("expected_runtime", int, 3600, "expected runtime in seconds", 60, 90 * 86400),
    Knob("tp", int, 1, "tensor-parallel size", 1, 72, shapes=_MODEL),
    Knob("pp", int, 1, "pipeline-parallel size", 1, 64, shapes=_MODEL),
    Knob("cp", int, 1, "context-parallel size", 1, 16, shapes=_TRAIN),
    Knob("dp", int, 1, "data-parallel size", 1, 4096, shapes=_TRAIN),
    Knob("ep", int, 1, "expert-parallel size (MoE)", 1, 72, shapes=_MODEL),
    Knob("seq_len", int, 8192, "sequence length (serving: max model length)", 128, 1 << 20,
         shapes=_MODEL),
    Knob("micro_batch", int, 1, "micro-batch size per GPU", 1, 64, shapes=_TRAIN),
    Knob("precision", str, "bf16", "weight/compute precision", choices=("bf16", "fp8", "fp4"),
         shapes=_MODEL),
    Knob("replicas", int, 1, "serving replicas (LeaderWorkerSet groups)", 1, 512, shapes=_SERVE),
    Knob("workers", int, 1, "independent worker pods", 1, 4096, shapes=_INDEP),
    Knob("gpus_per_worker", int, 4, "GPUs per worker pod", 1, 4, shapes=_INDEP),
)}


class Values(BaseModel):
    """Resolved parameters, typed; the input of sizing and rendering."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    api: str
    priority: str
    flex_tier: int
    image: str
    scheduler: str
    kai_queue: str
    topology: str
    nvlink_level: str
    block_level: str
    block_gpus: int
    checkpoint_interval: int
    checkpoint_pvc: str
    data_pvc: str
    expected_runtime: int
    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    seq_len: int
    micro_batch: int
    precision: str
    replicas: int
    workers: int
    gpus_per_worker: int


def settable(template: WorkloadTemplate) -> list[str]:
    """Names a user may ``--set`` on this template, sorted."""
    common = [k.name for k in CATALOGUE.values() if k.shapes is None]
    return sorted(set(common) | set(template.spec.parameters))


def parse_sets(items: Iterable[str]) -> dict[str, str]:
    """``["tp=8", "image=x"]`` → ``{"tp": "8", "image": "x"}``; a later key wins."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise TemplateError(f"--set expects key=value, got {item!r}")
        out[key] = value.strip()
    return out


def resolve(template: WorkloadTemplate, sets: Mapping[str, str]) -> Values:
    """Defaults, then the template's defaults, then ``sets``; every value checked."""
    name = template.name
    allowed = settable(template)
    for key in sets:
        if key not in allowed:
            raise TemplateError(f"{name}: unknown parameter {key!r} (parameters: "
                                f"{', '.join(allowed)})")
    values: dict[str, Value] = {k.name: k.default for k in CATALOGUE.values()}
    values.update(name=name, api=template.spec.apis[0].value)
    for key, bounds in template.spec.parameters.items():
        values[key] = _check(name, CATALOGUE[key], bounds, bounds.default, template)
    for key, raw in sets.items():
        knob = CATALOGUE[key]
        values[key] = _check(name, knob, template.spec.parameters.get(key),
                             _coerce(name, knob, raw), template)
    return Values.model_validate(values)


def _coerce(template: str, knob: Knob, raw: str) -> Value:
    if knob.type is int:
        try:  # ASCII digits only (int() also reads "１" and "٣"), at most 30 of them
            if not raw.isascii() or len(raw) > 30:
                raise ValueError(raw)
            return int(raw.replace("_", ""))
        except ValueError:
            raise TemplateError(f"{template}: {knob.name} must be an integer, got {raw!r}") \
                from None
    return raw


def _check(template: str, knob: Knob, bounds: ParamBounds | None, value: object,
           doc: WorkloadTemplate) -> Value:
    """Type, then the catalogue's hard bounds, then the template's own bounds."""
    if knob.type is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise TemplateError(f"{template}: {knob.name} must be an integer, got {value!r}")
    if knob.type is str and not isinstance(value, str):
        raise TemplateError(f"{template}: {knob.name} must be a string, got {value!r}")
    assert isinstance(value, int | str)
    lo, hi = lowest(knob, bounds), highest(knob, bounds)
    if isinstance(value, int) and ((lo is not None and value < lo) or
                                   (hi is not None and value > hi)):
        raise TemplateError(f"{template}: {knob.name}={value} is out of range "
                            f"[{_fmt(lo)}, {_fmt(hi)}]")
    options = choices(knob, bounds, doc)
    if options is not None and value not in options:
        raise TemplateError(f"{template}: {knob.name} must be one of {', '.join(options)}, "
                            f"got {value!r}")
    if knob.name == "name" and (not re.match(DNS_LABEL, str(value)) or len(str(value)) > 40):
        raise TemplateError(f"{template}: name {value!r} must be a DNS label of at most 40 "
                            "characters (lower case, digits, '-')")
    if knob.name in _K8S_NAMES and value and (len(str(value)) > 253
                                              or not re.match(_SUBDOMAIN, str(value))):
        raise TemplateError(f"{template}: {knob.name} {str(value)[:80]!r} is not a Kubernetes "
                            "name (lower case, digits, '-', '.')")
    if knob.name == "image" and value and not image_reference(str(value)):
        raise TemplateError(f"{template}: image {str(value)[:80]!r} is not an image reference "
                            "([REGISTRY[:PORT]/]PATH[:TAG][@DIGEST]: a lower-case path, a tag "
                            "of at most 128 word characters, '.' and '-', a digest "
                            "ALGORITHM:HEX of 32 or more)")
    return value


#: Parameters that name Kubernetes objects (a PriorityClass, a PVC, a KAI queue label value is
#: checked as a name too): the API server would refuse the manifest at create time, after the
#: dry run printed it as fine.
_K8S_NAMES = frozenset({"priority", "checkpoint_pvc", "data_pvc", "kai_queue"})
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: An image reference as the container runtime parses it (github.com/distribution/reference:
#: ``[domain[:port]/]path[:tag][@digest]``); anything else — whitespace, shell or YAML syntax,
#: bidi overrides, an upper-case path, two tags, a short digest — makes a pod that never
#: starts (InvalidImageName) while its job holds admitted quota.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (r"(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
           r"(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*"
           r"|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")
_NAME = rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_IMAGE = re.compile(rf"({_NAME})(?::[\w][\w.-]{{0,127}})?"
                    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
                    re.ASCII)
#: The longest name part (distribution/reference's NameTotalLengthMax).
MAX_IMAGE_NAME = 255


def image_reference(text: str) -> bool:
    """Whether ``text`` is an image reference the container runtime accepts (at most 1,024
    characters in all)."""
    if len(text) > 1024:
        return False
    m = _IMAGE.fullmatch(text)
    return m is not None and len(m.group(1)) <= MAX_IMAGE_NAME


def lowest(knob: Knob, bounds: ParamBounds | None) -> int | None:
    """The tighter of the catalogue's and the template's lower bound."""
    own = None if bounds is None or bounds.min is None else int(bounds.min)
    if knob.lo is None or own is None:
        return own if own is not None else knob.lo
    return max(knob.lo, own)


def highest(knob: Knob, bounds: ParamBounds | None) -> int | None:
    """The tighter of the catalogue's and the template's upper bound."""
    own = None if bounds is None or bounds.max is None else int(bounds.max)
    if knob.hi is None or own is None:
        return own if own is not None else knob.hi
    return min(knob.hi, own)


def choices(knob: Knob, bounds: ParamBounds | None,
            doc: WorkloadTemplate) -> tuple[str, ...] | None:
    """Allowed values of a string knob, if restricted."""
    if knob.name == "api":
        return tuple(a.value for a in doc.spec.apis)
    if bounds is not None and bounds.choices is not None:
        return bounds.choices
    return knob.choices


def _fmt(bound: int | None) -> str:
    return "-" if bound is None else str(bound)
