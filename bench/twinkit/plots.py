"""The report's PNG plots (matplotlib, Agg): site kW vs target, queue and GPUs, per tier."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from twinkit.harness import RunData

COLOURS = {"kueue": "tab:gray", "m2g": "tab:blue", "m2g-pause-only": "tab:red",
           "m2g-restore-after": "tab:green", "m2g-gate-before": "tab:orange"}
OWN = frozenset(COLOURS)
OTHER = ["tab:purple", "tab:brown", "tab:olive", "tab:cyan"]  # runs of other names, in turn


def colour(name: str) -> str:
    """A run's colour: its own, else one of ``OTHER`` (never another run's: matplotlib's
    default cycle starts with m2g's blue)."""
    if name not in COLOURS:
        COLOURS[name] = OTHER[sum(1 for k in COLOURS if k not in OWN) % 4]
    return COLOURS[name]


def _event(ax: Any, d: RunData) -> None:
    if d.event_start is not None and d.event_end is not None:
        ax.axvspan(d.event_start, d.event_end, color="tab:orange", alpha=0.12, lw=0)


def site_kw(path: Path, datas: dict[str, RunData], title: str) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    for name, d in datas.items():
        if d.samples:
            ax.plot([t for t, _ in d.samples], [kw for _, kw in d.samples],
                    color=colour(name), lw=1.3, label=f"{name}: site draw")
        if d.intervals and d.event_start is not None:
            xs, ys = [], []
            for iv in d.intervals:
                xs += [d.event_start + iv.offset_s, d.event_start + iv.offset_s + iv.duration_s]
                ys += [iv.limit_kw, iv.limit_kw]
            ax.plot(xs, ys, color=colour(name), ls="--", lw=1.0,
                    label=f"{name}: grid limit")
    first = next(iter(datas.values()))
    _event(ax, first)
    for t, what in first.timeline:
        ax.axvline(t, color="tab:orange", lw=0.8)
        ax.annotate(what[:48], (t, ax.get_ylim()[1]), fontsize=7, va="top", rotation=0,
                    xytext=(3, -3), textcoords="offset points")
    ax.set_xlabel("wall seconds from replay start")
    ax.set_ylabel("site kW")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def queue_gpus(path: Path, datas: dict[str, RunData], total_gpus: int) -> None:
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), dpi=110, sharex=True)
    for name, d in datas.items():
        a1.plot([q[0] for q in d.queue], [q[1] for q in d.queue], color=colour(name),
                lw=1.2, label=f"{name}: pending workloads")
        samples = d.driver.get("samples") or []
        a2.plot([s[0] for s in samples], [100.0 * s[1] / total_gpus for s in samples],
                color=colour(name), lw=1.2, label=f"{name}: GPUs allocated")
        _event(a1, d)
        _event(a2, d)
    a1.set_ylabel("pending workloads")
    a2.set_ylabel(f"% of {total_gpus} GPUs")
    a2.set_xlabel("wall seconds from replay start")
    a2.set_ylim(0, 105)
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def tiers(path: Path, runs: dict[str, dict[str, Any]]) -> None:
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    labels = ["all", "0", "1", "2", "3"]
    width = 0.8 / max(1, len(runs))
    for i, (name, run) in enumerate(runs.items()):
        w = run["workloads"]
        vals = [w["weightedPerformance"], *[w["perTier"].get(t) for t in labels[1:]]]
        xs = [k + i * width for k in range(len(labels))]
        ax.bar(xs, [v if v is not None else 0 for v in vals], width,
               color=colour(name), label=name)
        for x, v in zip(xs, vals, strict=True):
            ax.text(x, (v or 0) + 0.01, "—" if v is None else f"{v:.2f}", ha="center",
                    fontsize=7)
    ax.axhline(0.95, color="tab:green", ls=":", lw=1, label="goal 0.95")
    ax.set_xticks([k + width * (len(runs) - 1) / 2 for k in range(len(labels))],
                  ["weighted", "flex 0", "flex 1", "flex 2", "flex 3"])
    ax.set_ylim(0, 1.25)
    ax.set_ylabel("performance during the event")
    ax.legend(fontsize=8, loc="upper right", ncol=3)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

