"""Operator commands: ``m2g queues``, ``m2g workloads``, ``m2g signals``, ``m2g explain``.

Each reads the cluster once (m2g_cli.cluster), then renders with a pure function
(m2g_cli.views). Exit codes (m2g_cli.term): 0 ok, 1 cluster/policy problem, 2 usage (an
unknown workload too).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from m2g.planner.admission import deciding
from m2g.planner.explain import explain as explain_workload
from m2g.policy import Evaluator, PolicySetError, build, read_dir, read_texts
from m2g.policy.objects import policy_texts
from m2g_cli import names, term
from m2g_cli.blockers import kueue_blockers, power_blockers
from m2g_cli.selectors import SelectorError, parse_selector
from m2g_cli.views import (
    Listing,
    Output,
    SortKeyError,
    WorkloadFilter,
    event_note,
    queue_cells,
    queue_rows,
    render_explanation,
    render_queues,
    render_signals,
    render_workloads,
    signal_data,
    sort_items,
    sort_path,
    structured,
    table,
    workload_cells,
    workload_rows,
)
from m2g_cli.watch_cmd import queue_key, workload_key

if TYPE_CHECKING:
    from m2g.k8s.client import Resource
    from m2g.model.factory import FactorySnapshot
    from m2g_cli.cluster import ClusterView

T = TypeVar("T")

Kubeconfig = Annotated[str | None, typer.Option("--kubeconfig", help="Path to a kubeconfig")]
Context = Annotated[str | None, typer.Option("--context", help="Kubeconfig context to use")]
Out = Annotated[Output, typer.Option("--output", "-o", help="table | wide | yaml | json")]
Namespace = Annotated[str | None, typer.Option(
    "--namespace", "-n", help="Namespace (default: the kubeconfig context's, as kubectl)")]
AllNamespaces = Annotated[bool, typer.Option(
    "--all-namespaces", "-A", help="Every namespace (NAMESPACE/NAME also names one)")]


def check_namespaces(namespace: str | None, all_namespaces: bool) -> None:
    if all_namespaces and namespace:
        term.fail("-n and -A do not go together", term.USAGE)


def chosen_namespace(view: ClusterView, namespace: str | None, all_namespaces: bool
                     ) -> str | None:
    """kubectl's rule: -A is every namespace (None), else -n, else the context's."""
    return None if all_namespaces else namespace or view.namespace
NoHeaders = Annotated[bool, typer.Option(
    "--no-headers", help="Tables without their header line (as kubectl)")]
SortBy = Annotated[str | None, typer.Option(
    "--sort-by", help="Sort by a field of the -o json items: .name, {.gpus} (as kubectl)")]


def listing(no_headers: bool, sort_by: str | None) -> Listing:
    """--no-headers and --sort-by; a --sort-by that is not a field path is exit code 2."""
    if sort_by is not None:
        try:
            sort_path(sort_by)
        except SortKeyError as exc:
            term.fail(str(exc), term.USAGE)
    return Listing(no_headers, sort_by)


def rendered(render: Callable[[], str]) -> None:
    """Print what ``render`` gives; a --sort-by naming no field of the items is exit 2."""
    try:
        typer.echo(render(), nl=False)
    except SortKeyError as exc:
        term.fail(str(exc), term.USAGE)


Prom = Annotated[str | None, typer.Option(
    "--prometheus", envvar="M2G_PROMETHEUS_URL", help="Prometheus URL for power and thermal")]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from m2g_cli.cluster import CliError

    try:
        return term.run_async(coro, "reading the cluster")
    except CliError as exc:
        term.fail(str(exc), exc.code)


def _view(kubeconfig: str | None, context: str | None, prometheus: str | None = None,
          lease: tuple[str, str] | None = None, field_selector: str | None = None,
          namespace: str | None = None) -> ClusterView:
    from m2g_cli.cluster import read  # kr8s and the adapters: only for commands that need them

    view = _run(read(kubeconfig, context, prometheus, lease=lease,
                     field_selector=field_selector, namespace=namespace or None))
    for w in view.warnings:
        typer.echo(f"warning: {w}", err=True)
    return view


def _never(_view: ClusterView) -> Iterable[datetime]:
    return ()


@dataclass(frozen=True)
class Watched:
    """What ``-w`` follows (m2g_cli.watch_cmd): ``what`` (for errors), the watches (resource,
    namespace, field selector), each item's key, the items of a read (sorted), their table
    cells (``wide``), and the table as the one-shot command prints it (the first listing).

    ``moments``: when what a view shows changes by the clock alone (a grid event's start and
    end, the Lease's expiry), each followed by a read; ``every``: seconds after which a read
    follows anyway (Prometheus readings, which no watch announces; None: never).
    ``single``: the command shows one object (``m2g status``, ``m2g signals``): ``items``
    gives it as the only item and each change prints ``table`` again, whole, in every -o
    (a JSON object, a YAML document, or the table after a blank line)."""

    what: str
    resources: Sequence[tuple[Resource, str | None, str | None]]
    key: Callable[[Mapping[str, Any]], str]
    items: Callable[[ClusterView], list[dict[str, Any]]]
    cells: Callable[[ClusterView, list[dict[str, Any]], bool],
                    tuple[list[str], list[list[str]]]] | None
    table: Callable[[ClusterView, Output], str]
    moments: Callable[[ClusterView], Iterable[datetime]] = _never
    every: float | None = None
    single: bool = False


def _watch(kubeconfig: str | None, context: str | None, spec: Watched, output: Output,
           first: ClusterView, **read_args: Any) -> None:
    """``-w``, as kubectl get -w: the list (a table; with -o json|yaml each item as its own
    document), then each item that changes, until Ctrl-C (exit 0) or a failure (one line).
    ``read_args``: what m2g_cli.cluster.read is given besides the kubeconfig and context."""
    import asyncio

    from m2g_cli import watch_cmd
    from m2g_cli.cluster import CliError, read
    from m2g_cli.watch_cmd import Rows, Stream, follow_cluster, keyed

    documents = output in (Output.YAML, Output.JSON)
    last = [first]

    def rows_of(view: ClusterView) -> Rows:
        items = spec.items(view)
        if spec.single:
            return keyed(items, [spec.table(view, output)], spec.key)
        if documents:  # "_" fields are compared for the table only (its NOTE), not printed
            items = [{k: v for k, v in i.items() if not k.startswith("_")} for i in items]
            return keyed(items, [structured(i, output) for i in items], spec.key)
        assert spec.cells is not None
        head, body = spec.cells(view, items, output is Output.WIDE)
        return keyed(items, table(head, body, no_headers=True).splitlines() if body else [],
                     spec.key)

    async def read_rows() -> Rows:
        last[0] = await read(kubeconfig, context, **read_args)
        return rows_of(last[0])

    def wake() -> float | None:
        view = last[0]
        return watch_cmd.until(view.snapshot.now, watch_cmd.now(), spec.moments(view),
                               spec.every)

    separator = "---\n" if output is Output.YAML else "\n" if spec.single and not documents \
        else ""
    echo = Stream(lambda text: typer.echo(text, nl=False), documents=documents or spec.single,
                  separator=separator)
    try:
        shown = rows_of(first)
        if documents or spec.single:  # kubectl -w -o json|yaml: the objects one by one
            for _, text in shown.values():
                echo(text)
        else:
            typer.echo(spec.table(first, output), nl=False)
        asyncio.run(follow_cluster(kubeconfig, context, spec.resources, spec.what, read_rows,
                                   shown, echo, wake))
    except KeyboardInterrupt:
        return
    except SortKeyError as exc:
        term.fail(str(exc), term.USAGE)
    except CliError as exc:
        term.fail(str(exc), exc.code)


Watch = Annotated[bool, typer.Option(
    "--watch", "-w", help="After the list, print each item that changes, as kubectl -w (a row, "
    "or with -o json|yaml the item as a document; Ctrl-C ends)")]
WatchOne = Annotated[bool, typer.Option(
    "--watch", "-w", help="Print it again whenever what it shows changes (the whole table "
    "after a blank line, or with -o json|yaml the object as a document; Ctrl-C ends)")]


def queues(kubeconfig: Kubeconfig = None, context: Context = None,
           output: Out = Output.TABLE, no_headers: NoHeaders = False,
           sort_by: SortBy = None, watch: Watch = False) -> None:
    """ClusterQueues: GPU quota (m2g-derated vs base), usage, pending, stopPolicy."""
    how = listing(no_headers, sort_by)
    view = _view(kubeconfig, context)
    if watch:
        _watch(kubeconfig, context, _queues_watched(how), output, view)
        return
    rendered(lambda: render_queues(view.snapshot, output, how))


def _queues_watched(how: Listing) -> Watched:
    from m2g.k8s import client as k

    return Watched(
        "ClusterQueues", ((k.CLUSTER_QUEUES, None, None), (k.LOCAL_QUEUES, None, None),
                          (k.GRID_EVENTS, None, None)), queue_key,
        # -o wide's NOTE names the grid event in force: a row whose note changes is printed,
        # also when the event starts or ends by the clock alone (no object changed)
        lambda view: [{**r, "_note": event_note(view.snapshot)}
                      for r in sort_items(queue_rows(view.snapshot), how.sort_by)],
        lambda view, rows, wide: queue_cells(rows, wide, event_note(view.snapshot)),
        lambda view, out: render_queues(view.snapshot, out, how),
        moments=lambda view: event_moments(view.snapshot.factory))


def workloads(
    namespace: Namespace = None, all_namespaces: AllNamespaces = False,
    queue: Annotated[str | None, typer.Option("--queue", "-q", help="LocalQueue or CQ")] = None,
    selector: Annotated[str | None, typer.Option(
        "--selector", "-l", help="Label selector, as kubectl's (app=x,tier in (2,3),!y)")] = None,
    field_selector: Annotated[str | None, typer.Option(
        "--field-selector", help="Field selector the API server evaluates, as kubectl's "
        "(metadata.name=x, status.admission.clusterQueue=cq)")] = None,
    kubeconfig: Kubeconfig = None, context: Context = None, output: Out = Output.TABLE,
    no_headers: NoHeaders = False, sort_by: SortBy = None, watch: Watch = False,
) -> None:
    """Workloads with their Kueue phase and m2g's check state and message."""
    try:
        match = parse_selector(selector)
    except SelectorError as exc:
        term.fail(str(exc), term.USAGE)
    check_namespaces(namespace, all_namespaces)
    names.check(namespace, "namespace", namespace=True)
    names.check(queue, "queue")
    how = listing(no_headers, sort_by)
    view = _view(kubeconfig, context, field_selector=field_selector, namespace=namespace)
    ns = chosen_namespace(view, namespace, all_namespaces)
    chosen = WorkloadFilter(ns, queue, match)
    if watch:
        _watch(kubeconfig, context, _workloads_watched(chosen, how), output, view,
               field_selector=field_selector)
        return
    rendered(lambda: render_workloads(view.snapshot, output, ns, queue, match, how,
                                      view.selected, view.objects.workloads))


def _workloads_watched(chosen: WorkloadFilter, how: Listing) -> Watched:
    import dataclasses

    from m2g.k8s import client as k

    def items(view: ClusterView) -> list[dict[str, Any]]:
        return workload_rows(view.snapshot, dataclasses.replace(chosen, keys=view.selected),
                             how.sort_by, view.objects.workloads)

    def first(view: ClusterView, out: Output) -> str:
        c = chosen
        return render_workloads(view.snapshot, out, c.namespace, c.queue, c.labels, how,
                                view.selected, view.objects.workloads)

    return Watched("Workloads", ((k.WORKLOADS, chosen.namespace, None),), workload_key, items,
                   lambda _view, rows, wide: workload_cells(rows, wide,
                                                            chosen.namespace is None), first)


#: m2g status -w and m2g signals -w read again this often (s): Prometheus has no watch
READINGS_EVERY = 15.0


def event_moments(f: FactorySnapshot, maintenance: bool = False) -> list[datetime]:
    """When a view of ``f`` changes by the clock alone: each grid event's start and end (the
    limit in force, queues' NOTE); ``maintenance``: each window's start and end too (signals
    lists the windows not yet over)."""
    return [t for e in f.grid_events for t in (e.start, e.end)] + [
        t for w in f.maintenance for t in (w.start, w.end) if maintenance]


def signals(kubeconfig: Kubeconfig = None, context: Context = None, prometheus: Prom = None,
            output: Out = Output.TABLE, no_headers: NoHeaders = False,
            sort_by: SortBy = None, watch: WatchOne = False) -> None:
    """The factory as m2g sees it: power vs budget, thermal, health, grid events, maintenance."""
    how = listing(no_headers, sort_by)
    view = _view(kubeconfig, context, prometheus)
    if watch:
        _watch(kubeconfig, context, _signals_watched(how), output, view, prometheus=prometheus)
        return
    rendered(lambda: render_signals(view.snapshot.factory, output, how))


def _signals_watched(how: Listing) -> Watched:
    from m2g.k8s import client as k

    return Watched(
        "signals", ((k.NODES, None, None), (k.POWER_DOMAINS, None, None),
                    (k.GRID_EVENTS, None, None), (k.MAINTENANCE_WINDOWS, None, None)),
        lambda _item: "signals", lambda view: [signal_data(view.snapshot.factory)], None,
        lambda view, out: render_signals(view.snapshot.factory, out, how),
        moments=lambda view: event_moments(view.snapshot.factory, maintenance=True),
        every=READINGS_EVERY,
        single=True)


def evaluator_for(view: ClusterView, policies: Path | None) -> Evaluator:
    """The policies to evaluate: ``policies`` (a folder) or the cluster's Policy objects."""
    from m2g_cli.cluster import CliError

    if policies is None and "policies" in view.forbidden:
        raise CliError("no rights to read the cluster's Policy objects (policies.m2g.io): pass "
                       "--policies DIR (the folder m2g run reads; the shipped examples: "
                       "\"$(m2g policy examples)\"), or ask for ClusterRole m2g-user bound "
                       "cluster-wide (docs/deploy.md, \"Roles for people\")")
    try:
        sources = read_dir(policies) if policies else read_texts(policy_texts(view.policies))
        return Evaluator(build(sources))
    except PolicySetError as exc:
        where = str(policies) if policies else "the cluster's Policy objects"
        raise CliError(f"policies from {where} do not load: {exc.problems[0].render()}") from None


def _owners(raw: Mapping[str, Any] | None) -> list[str]:
    """Names of the objects a Workload belongs to (the Job, JobSet, ... the user created)."""
    refs = ((raw or {}).get("metadata") or {}).get("ownerReferences") or []
    return [str(r.get("name")) for r in refs if r.get("name")]


def explain(
    workload: Annotated[str, typer.Argument(
        help="Workload name, or the name of its Job (JobSet, ...); NAMESPACE/NAME works too")],
    namespace: Namespace = None, all_namespaces: AllNamespaces = False,
    policies: Annotated[Path | None, typer.Option(
        "--policies", help="Evaluate these policy files instead of the cluster's")] = None,
    kubeconfig: Kubeconfig = None, context: Context = None, prometheus: Prom = None,
    output: Out = Output.TABLE,
) -> None:
    """Why a workload waits (or runs), and which single change would alter m2g's decision."""
    check_namespaces(namespace, all_namespaces)
    prefix, slash, name = workload.rpartition("/")
    if slash and "/" in prefix:
        term.fail(f"workload {workload[:60]!r}: NAME or NAMESPACE/NAME", term.USAGE)
    names.check(prefix or None, "namespace", namespace=True)
    names.check(name, "workload name")
    names.check(namespace, "namespace", namespace=True)
    view = _view(kubeconfig, context, prometheus, namespace=prefix or namespace)
    prefix, _, name = workload.rpartition("/")
    ns = prefix or chosen_namespace(view, namespace, all_namespaces)
    matches = [w for w in view.snapshot.workloads if (ns is None or w.namespace == ns)
               and name in (w.name, *_owners(view.objects.workloads.get(w.key)))]
    if len(matches) != 1:
        what = "no workload" if not matches else f"{len(matches)} workloads"
        where = f" in namespace {ns} (-A: every namespace)" if ns and not prefix and \
            not namespace else ""
        term.fail(f"{what} named {workload!r}{where}" + ("" if ns else " (use -n NAMESPACE)"),
                  term.USAGE)
    from m2g_cli.cluster import CliError, planner_config

    try:
        evaluator = evaluator_for(view, policies)
        config = planner_config()
    except CliError as exc:
        term.fail(str(exc), exc.code)
    if policies is None and not view.policies:
        typer.echo("warning: the cluster has no m2g Policy objects, so nothing objects; pass "
                   "--policies DIR to evaluate a policy folder (the one `m2g run --policies` "
                   "reads)", err=True)
    w = matches[0]
    raw = view.objects.workloads.get(f"{w.namespace}/{w.name}") or {}
    conditions = (raw.get("status") or {}).get("conditions") or []
    ex = explain_workload(view.snapshot, w, evaluator, config)
    o = view.objects
    found = kueue_blockers(raw, o.local_queues, o.cluster_queues, o.resource_flavors,
                           o.admission_checks, view.topologies, view.forbidden)
    found += power_blockers(view.snapshot.factory, [r.message for r in deciding(ex.now)])
    typer.echo(render_explanation(ex, output, conditions, found), nl=False)


def register(app: typer.Typer) -> None:
    from m2g_cli.status_cmd import status

    for fn in (queues, workloads, signals, explain, status):
        app.command()(fn)
