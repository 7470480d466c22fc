"""Measured power curves: the one module of m2g.sim that reads files.

``dvfs_sweep.csv`` (Emerald AI / EPRI / SRP field demonstration, Apache-2.0; arXiv 2507.00909)
gives, for 13 jobs, per-GPU power and normalised throughput at per-GPU power caps 100–400 W.
``derive_curves`` groups the jobs into families (``ft_*`` fine-tuning, ``infer_*`` inference,
``pt_*`` pre-training), averages each family per cap and normalises by the sweep's largest
cap (400 W): ``power`` and ``cap`` become fractions of the GPU's TDP. The result is shipped as
``power_curves.json`` so the simulator needs no data folder at run time; a unit test checks the
shipped file against the CSV.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

FAMILY_PREFIX = {"ft_": "fine-tuning", "infer_": "inference", "pt_": "pre-training"}
PACKAGED = "power_curves.json"


@dataclass(frozen=True)
class CurvePoint:
    """At power cap ``cap`` (fraction of TDP) the GPU draws ``power`` (fraction of TDP) and
    runs at ``throughput`` of its uncapped speed."""

    cap: float
    power: float
    throughput: float


Curves = dict[str, tuple[CurvePoint, ...]]


def derive_curves(csv_text: str) -> tuple[float, Curves]:
    """(reference TDP in W, family → points sorted by cap) from dvfs_sweep.csv's text."""
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    tdp = max(float(r["GPU power cap"]) for r in rows)
    acc: dict[str, dict[float, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        family = next((f for p, f in FAMILY_PREFIX.items() if r["Workload"].startswith(p)), None)
        if family is None:
            continue
        acc[family][float(r["GPU power cap"])].append(
            (float(r["power per GPU"]), float(r["normalized throughput"])))
    curves: Curves = {}
    for family, by_cap in sorted(acc.items()):
        curves[family] = tuple(
            CurvePoint(cap / tdp, sum(p for p, _ in v) / len(v) / tdp,
                       sum(t for _, t in v) / len(v))
            for cap, v in sorted(by_cap.items()))
    return tdp, curves


def curves_to_json(tdp: float, curves: Curves) -> str:
    return json.dumps({
        "source": "emerald-dr-2025/dvfs_sweep.csv (Apache-2.0), family means, fractions of TDP",
        "referenceTdpW": tdp,
        "families": {f: [[round(p.cap, 6), round(p.power, 6), round(p.throughput, 6)]
                         for p in pts] for f, pts in curves.items()},
    }, indent=1) + "\n"


def curves_from_json(text: str) -> tuple[float, Curves]:
    data = json.loads(text)
    return float(data["referenceTdpW"]), {
        f: tuple(CurvePoint(*map(float, p)) for p in pts) for f, pts in data["families"].items()}


def load_curves(csv_path: Path | None = None) -> tuple[float, Curves]:
    """From ``csv_path`` if given, else the packaged ``power_curves.json``."""
    if csv_path is not None:
        return derive_curves(csv_path.read_text())
    return curves_from_json(resources.files("m2g.sim").joinpath(PACKAGED).read_text())


if __name__ == "__main__":  # regenerate: python -m m2g.sim.data data/emerald-dr-2025/dvfs_sweep.csv
    import sys

    print(curves_to_json(*derive_curves(Path(sys.argv[1]).read_text())), end="")
