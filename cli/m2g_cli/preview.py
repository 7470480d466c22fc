"""``m2g submit --dry-run``: the admission decision m2g would make now for a rendered template.

Reads the cluster once, as ``m2g explain`` does (m2g_cli.cluster), turns the rendered object
into the Kueue Workload Kueue would create (m2g.templates.workload), and evaluates the
Admission and Placement policies (the cluster's Policy objects, or ``--policies DIR``) with the
same counterfactuals as ``m2g explain``. Without a cluster it still evaluates ``--policies``,
on an empty factory, and says so; without either it says why there is no decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from m2g.k8s.build import ClusterObjects
from m2g.k8s.convert import check_names, workload
from m2g.k8s.snapshot import assemble
from m2g.planner.explain import Explanation, explain
from m2g.templates import Rendered
from m2g.templates.workload import kueue_workload
from m2g_cli.cluster import CliError, ClusterView, planner_config, read
from m2g_cli.ops_cmd import evaluator_for


@dataclass(frozen=True)
class Preview:
    """The decision (None: not evaluated) and notes for the user."""

    explanation: Explanation | None
    notes: tuple[str, ...]


async def preview(rendered: Rendered, kubeconfig: str | None, context: str | None,
                  policies: Path | None, prometheus: str | None = None) -> Preview:
    """Evaluate ``rendered`` against the cluster (or ``policies`` alone when it is out of
    reach). Raises CliError only for policies that do not load."""
    notes: list[str] = []
    try:
        ns = (rendered.workload.get("metadata") or {}).get("namespace")
        view = await read(kubeconfig, context, prometheus, namespace=ns or None)
    except CliError as exc:
        if policies is None:
            return Preview(None, (f"no admission decision: {exc} (pass --policies DIR to "
                                  "evaluate without factory state)",))
        notes.append(f"no factory state read ({exc}): {policies} evaluated on an empty "
                     "factory, no grid event, no queues")
        now = datetime.now(UTC)
        view = ClusterView(assemble(ClusterObjects(), None, now), ClusterObjects())
    notes += view.warnings
    if policies is None and "policies" in view.forbidden:
        try:
            evaluator_for(view, policies)
        except CliError as exc:
            return Preview(None, (*notes, f"no admission decision: {exc}"))
    if policies is None and not view.policies:
        notes.append("the cluster has no m2g Policy objects (is m2g installed?): nothing "
                     "would object")
    evaluator = evaluator_for(view, policies)
    objs = view.objects
    wl = workload(kueue_workload(rendered), view.snapshot.now,
                  local_queues={k: str((o.get("spec") or {}).get("clusterQueue", ""))
                                for k, o in objs.local_queues.items()},
                  checks=check_names(objs.admission_checks.values()))
    if objs.cluster_queues and not wl.cluster_queue:
        notes.append(f"LocalQueue {wl.namespace}/{wl.view.queue} does not exist: Kueue would "
                     "leave the workload pending")
    return Preview(explain(view.snapshot, wl, evaluator, planner_config()), tuple(notes))
