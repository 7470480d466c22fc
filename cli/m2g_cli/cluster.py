"""One-shot cluster reads for the CLI: list every kind once and build a ClusterSnapshot.

The controllers keep watch caches; a CLI call lists instead — the same kinds, through the same
assembler (m2g.k8s.snapshot), KAI included. Errors become one line: no cluster, Kueue CRDs
missing, RBAC denied. m2g's own CRDs and KAI are optional (a warning).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from m2g.config import SiteConfig, SiteConfigError, load_site_config
from m2g.k8s import client as k
from m2g.k8s.build import ClusterObjects
from m2g.k8s.cache import object_key
from m2g.k8s.kubeconfig import context_namespace, merged_kubeconfig
from m2g.k8s.snapshot import RequiredKindMissing, assemble, list_objects
from m2g.model.cluster import ClusterSnapshot, Rejected
from m2g.planner.config import PlannerConfig
from m2g.signals.config import PrometheusSettings
from m2g.signals.http import make_http_client
from m2g.signals.prometheus import PrometheusClient
from m2g.signals.reader import read_signals

KUEUE_TOPOLOGIES = k.Resource("kueue.x-k8s.io", "v1beta2", "topologies", "Topology", False)


class CliError(Exception):
    """A user-facing failure: one line, exit code ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ClusterView:
    """What the operator commands show."""

    snapshot: ClusterSnapshot
    objects: ClusterObjects
    policies: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    topologies: dict[str, Any] = field(default_factory=dict)  # Kueue Topologies (explain)
    namespace: str = "default"  # the context's namespace: what -n defaults to, as in kubectl
    lease: dict[str, Any] | None = None  # m2g's Lease, when asked for (m2g status)
    #: NS/NAME of the Workloads the API server matched to a field selector (None: not asked)
    selected: set[str] | None = None
    #: ClusterObjects fields (and ``policies``, ``topologies``) the reader may not list anywhere
    #: (namespace rights only): empty because unreadable, not because absent
    forbidden: frozenset[str] = frozenset()


def server(kubeconfig: str | None, context: str | None) -> str:
    """The API server URL the kubeconfig names (for error messages; best effort)."""
    path = k.resolve_kubeconfig(kubeconfig)
    if path is None:
        return "the in-cluster API server"
    try:
        cfg = merged_kubeconfig(path)
        ctx = next(c["context"] for c in cfg.get("contexts") or []
                   if c.get("name") == (context or cfg.get("current-context")))
        return str(next(c["cluster"]["server"] for c in cfg.get("clusters") or []
                        if c.get("name") == ctx.get("cluster")))
    except (OSError, yaml.YAMLError, StopIteration, KeyError, TypeError, AttributeError):
        return f"the server of {path}"


async def read(kubeconfig: str | None, context: str | None,
               prometheus: str | None = None, lease: tuple[str, str] | None = None,
               field_selector: str | None = None, namespace: str | None = None
               ) -> ClusterView:
    """List everything once; raise CliError with one clear line on failure.
    ``field_selector``: also list the Workloads it selects, evaluated by the API server
    (``ClusterView.selected``); one it refuses is exit code 2. A reader with rights in one
    namespace only (``namespace``, default the context's) reads what it may: the namespaced
    kinds there, the rest left out with a warning (``ClusterView.forbidden``)."""
    if k.resolve_kubeconfig(kubeconfig) is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise CliError("no cluster: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not running "
                       "in a pod; pass --kubeconfig")
    try:
        kube = await k.connect(kubeconfig, context)
    except k.RetryableError as exc:
        raise CliError(f"cannot reach the cluster at {server(kubeconfig, context)}: "
                       f"{exc}") from None
    except k.KubeError as exc:
        raise CliError(str(exc)) from None
    warnings: list[str] = []
    # the same function as `m2g submit` (kr8s's own namespace is the current context's even
    # under --context, so it is not used)
    default_ns = context_namespace(kubeconfig, context)
    unread: set[str] = set()
    try:
        listed = await list_objects(kube, namespace or default_ns)
        try:
            policies = list((await kube.list(k.POLICIES)).get("items") or [])
        except k.PermanentError as exc:
            if not isinstance(exc, k.ResourceMissing) and exc.status != 403:
                raise
            policies = []
            unread |= {"policies"} if exc.status == 403 else set()
        try:
            topologies = {object_key(o): o
                          for o in (await kube.list(KUEUE_TOPOLOGIES)).get("items") or []}
        except k.PermanentError as exc:  # Kueue without TAS, or not readable
            if not isinstance(exc, k.ResourceMissing) and exc.status != 403:
                raise
            topologies = {}
            unread |= {"topologies"} if exc.status == 403 else set()
        held = await kube.get_or_none(k.LEASES, lease[1], lease[0]) if lease else None
        narrowed = namespace or default_ns if "workloads" in listed.namespace_only else None
        selected = await _selected(kube, field_selector, narrowed) if field_selector else None
    except RequiredKindMissing as exc:
        raise CliError(f"{exc.resource.kind} ({exc.resource.group}) is not served by this "
                       "cluster: is Kueue installed (v1beta2 CRDs)?") from None
    except k.RetryableError as exc:
        raise CliError(f"cannot reach the cluster: {exc}") from None
    except k.PermanentError as exc:
        raise CliError(str(exc)) from None
    finally:
        await kube.close()
    warnings += [f"m2g CRD {res.kind} is not installed" for res in listed.missing]
    warnings += listed.warnings
    readings = await _readings(prometheus, warnings)
    snap = assemble(listed.objects, readings, datetime.now(UTC), kai=listed.kai,
                    labels=(site_config() or SiteConfig()).topology.labels)
    warnings += [rejected_warning(r) for r in snap.rejected]
    return ClusterView(snap, listed.objects, policies, warnings, topologies, default_ns, held,
                       selected, listed.forbidden | unread)


def rejected_warning(r: Rejected) -> str:
    """The CLI's warning for an object m2g leaves out, or uses with a part of it ignored."""
    what = f"ignored the {r.part} of" if r.part else "left out"
    return f"{what} {r.kind} {r.name}: {r.reason}"


async def _selected(kube: k.Kube, field_selector: str, namespace: str | None = None
                    ) -> set[str]:
    """The keys of the Workloads the API server selects with ``field_selector`` (in
    ``namespace`` only when given: the reader may list Workloads there only)."""
    try:
        found = await kube.list(k.WORKLOADS, namespace,
                                params={"fieldSelector": field_selector})
    except k.PermanentError as exc:
        if exc.status == 400:  # the API server's word on a selector it cannot read
            raise CliError(f"--field-selector {field_selector!r}: "
                           f"{exc.api_message or exc}", code=2) from None
        raise
    return {object_key(o) for o in found.get("items") or []}


def site_config() -> SiteConfig | None:
    """The site configuration named by ``$M2G_CONFIG`` (the file ``m2g run --config`` reads),
    so the CLI reads the signals with the site's PromQL and Prometheus auth."""
    path = os.environ.get("M2G_CONFIG")
    if not path:
        return None
    try:
        return load_site_config(Path(path))
    except SiteConfigError as exc:
        raise CliError(f"M2G_CONFIG: {exc}", code=2) from None


def planner_config() -> PlannerConfig:
    """The planner's settings of ``$M2G_CONFIG`` (the site configuration), else the
    defaults: the ones the controller decides with (the headroom gate's, the forecast's)."""
    site = site_config()
    return site.planner_config() if site is not None else PlannerConfig()


async def _readings(url: str | None, warnings: list[str]) -> Any:
    site = site_config() or SiteConfig()
    prom = site.prometheus
    if url:
        prom = (prom or PrometheusSettings()).model_copy(update={"url": url})
    if prom is None:
        return None
    config = site.signal_config().model_copy(update={"url": prom.url})
    try:
        async with make_http_client(prom) as http:
            return await read_signals(PrometheusClient(
                prom.url, http, prom.timeout_seconds, max_response_bytes=prom.max_response_bytes,
                max_series=prom.max_series, max_values_per_series=prom.max_values_per_series,
                max_values=prom.max_values),
                config)
    except Exception as exc:  # signals are optional for the CLI: say so, go on
        warnings.append(f"signals from {prom.where()} unavailable: {exc}")
        return None
