"""Pure renderers for ``m2g templates`` and ``m2g submit``: data in, text out.

Tables are rich tables rendered to a string (no colour unless asked), so their output can be
compared with golden files in tests/unit/golden/.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

import yaml
from rich import box
from rich.console import Console
from rich.table import Table

from m2g.templates import CATALOGUE, Rendered, WorkloadTemplate, render, settable
from m2g.templates.params import choices, highest, lowest
from m2g.templates.sizing import HBM_GB, Sizing
from m2g_cli.views import Listing, Output, as_list, sort_items, structured
from m2g_cli.views import table as plain_table

WIDTH = 120


def to_text(*items: Any, width: int = WIDTH, color: bool = False) -> str:
    """Print rich renderables to a string."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system="standard" if color else None,
                      force_terminal=color, highlight=False, soft_wrap=False)
    for item in items:
        console.print(item)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def _table(*columns: str, title: str | None = None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", pad_edge=False,
                  show_edge=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    return table


def template_rows(templates: Iterable[WorkloadTemplate], sort_by: str | None = None
                  ) -> list[dict[str, Any]]:
    """``m2g templates list -o json`` items, by name (``sort_by``: a field of them, as
    m2g_cli.views.sort_items sorts)."""
    rows = []
    for t in sorted(templates, key=lambda t: t.name):
        r = render(t)
        rows.append({"name": t.name, "kind": t.spec.workload_kind.value, "api": r.values.api,
                     "gpus": r.sizing.gpus, "flexTier": r.values.flex_tier,
                     "description": t.metadata.description})
    return sort_items(rows, sort_by)


def list_table(templates: Iterable[WorkloadTemplate], listing: Listing | None = None) -> str:
    """``m2g templates list``: one row per template, with its default GPU count, as kubectl
    prints a table: one line per row whatever its length (no wrapped cells, no rule under the
    header), so ``--no-headers | awk '{print $1}'`` gets the names and nothing else."""
    listing = listing or Listing()
    rows = [[r["name"], r["kind"], r["api"], str(r["gpus"]), str(r["flexTier"]),
             r["description"]] for r in template_rows(templates, listing.sort_by)]
    return plain_table(["NAME", "KIND", "API", "GPUS", "FLEX", "DESCRIPTION"], rows,
                 no_headers=listing.no_headers)


def list_structured(templates: Iterable[WorkloadTemplate], out: Output,
                    listing: Listing | None = None) -> str:
    """``m2g templates list -o json|yaml``: a kubectl ``List`` of the rows."""
    sort_by = listing.sort_by if listing else None
    return structured(as_list(template_rows(templates, sort_by)), out)


def show_text(rendered: Rendered, width: int = WIDTH, color: bool = False) -> str:
    """``m2g templates show``: facts, parameters (default, bounds) and what they derive."""
    t = rendered.template
    return to_text(_facts(t), _params_table(rendered), _derived_table(rendered),
                   width=width, color=color)


def _facts(t: WorkloadTemplate) -> str:
    spec = t.spec
    lines = [f"{t.name}: {t.metadata.description}",
             f"kind {spec.workload_kind.value}, shape {spec.shape.value}, apis "
             + ", ".join(a.value for a in spec.apis) + " (first is the default)"]
    if spec.model:
        m = spec.model
        moe = f", MoE {m.moe.experts} experts ({m.moe.active_parameters_b:g}B active)" \
            if m.moe else ""
        lines.append(f"model {m.name}: {m.parameters_b:g}B parameters, {m.layers} layers, "
                     f"hidden {m.hidden}, {m.heads} heads, {m.kv_heads} KV heads{moe}")
    p = spec.power
    curve = ", ".join(f"{c.cap:.0%}→{c.throughput:.2f}" for c in p.cap_curve)
    lines.append(f"power {p.kw_per_gpu:g} kW/GPU, {p.shape.value}"
                 + (f"; throughput at power cap: {curve}" if curve else ""))
    if spec.benchmark:
        b = spec.benchmark
        lines.append(f"benchmark {b.metric}: {b.target:g} {b.unit} ({b.source})")
    return "\n".join(lines) + "\n"


def _params_table(rendered: Rendered) -> Table:
    t = rendered.template
    values = rendered.values.model_dump()
    table = _table("PARAMETER", "VALUE", "BOUNDS", "HELP", title="Parameters (--set key=value)")
    for key in settable(t):
        knob, bounds = CATALOGUE[key], t.spec.parameters.get(key)
        options = choices(knob, bounds, t)
        lo, hi = lowest(knob, bounds), highest(knob, bounds)
        if options is not None:
            limit = " | ".join(options)
        elif lo is not None or hi is not None:
            limit = f"{'' if lo is None else lo}..{'' if hi is None else hi}"
        else:
            limit = ""
        help_text = bounds.help if bounds and bounds.help else knob.help
        table.add_row(key, _value(values[key]), limit, help_text)
    return table


def _value(value: object) -> str:
    return '""' if value == "" else str(value)


def _derived_table(rendered: Rendered) -> Table:
    table = _table("DERIVED", "VALUE", title="Derived")
    for key, value in derived(rendered):
        table.add_row(key, value)
    return table


def derived(rendered: Rendered) -> list[tuple[str, str]]:
    """What the parameters imply, as (label, text) rows."""
    s, v = rendered.sizing, rendered.values
    rows = [("gpus", _gpus_formula(rendered)),
            ("pods", f"{s.pods} x {s.gpus_per_pod} GPUs" + (f" per group, {s.groups} groups"
                                                           if s.groups > 1 else "")),
            ("placement", _placement(s)),
            ("power", f"{s.kw:g} kW estimated ({s.gpus} x "
                      f"{rendered.template.spec.power.kw_per_gpu:g} kW/GPU)")]
    if s.memory is not None:
        m = s.memory
        parts = [f"weights {m.weights:.1f}", f"gradients {m.gradients:.1f}",
                 f"optimizer {m.optimizer:.1f}", f"activations {m.activations:.1f}"]
        if m.kv_tokens:
            parts = [f"weights {m.weights:.1f}", f"KV cache {m.kv_cache:.1f}"]
        rows.append(("memory/GPU", f"{m.total:.1f} of {HBM_GB:g} GB (" + ", ".join(parts) + ")"))
        if m.kv_tokens:
            rows.append(("KV cache", f"{m.kv_tokens:,} tokens per replica = "
                                     f"{m.kv_tokens // v.seq_len} sequences of {v.seq_len}"))
    if s.checkpoint_gb:
        every = f" every {v.checkpoint_interval} s" if v.checkpoint_interval else ""
        rows.append(("checkpoint", f"{s.checkpoint_gb:,.0f} GB{every}"))
    rows += [("note", n) for n in rendered.notes]
    return rows


def _gpus_formula(rendered: Rendered) -> str:
    s, v, shape = rendered.sizing, rendered.values, rendered.template.spec.shape.value
    if shape == "training":
        return f"{s.gpus} = tp {v.tp} x cp {v.cp} x pp {v.pp} x dp {v.dp}"
    if shape == "serving":
        return f"{s.gpus} = replicas {v.replicas} x (tp {v.tp} x pp {v.pp})"
    return f"{s.gpus} = workers {v.workers} x {v.gpus_per_worker}"


def _placement(s: Sizing) -> str:
    p = s.placement
    if p.unconstrained:
        return "unconstrained (TAS accounting only)"
    head = f"required {p.required}" if p.required else f"preferred {p.preferred}"
    if p.slice_pods:
        head += f"; slices of {p.slice_pods} pods required in {p.slice_level}"
    return head


def manifests_text(objects: Sequence[dict[str, Any]], output: str) -> str:
    """The rendered objects as multi-document YAML or a JSON ``List``."""
    if output == "json":
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        return json.dumps(doc, indent=2) + "\n"
    return yaml.safe_dump_all(list(objects), sort_keys=False, default_flow_style=False,
                              width=1000)
