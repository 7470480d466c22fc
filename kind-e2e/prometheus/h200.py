"""The recorded H200 telemetry as DCGM-exporter series, backfilled into a Prometheus TSDB.

``telemetry.csv`` (nvidia-smi --query-gpu every 250 ms, timestamps in UTC) becomes OpenMetrics:
``DCGM_FI_DEV_POWER_USAGE`` (W, from ``power.draw``), ``DCGM_FI_DEV_GPU_TEMP`` (°C, from
``temperature.gpu``) and ``DCGM_FI_DEV_XID_ERRORS`` (0: the recording saw no XID), labelled like
the DCGM exporter: ``gpu``, ``UUID``, ``Hostname``, ``modelName``.
Run ``python kind-e2e/prometheus/h200.py OUT_DIR`` to write ``h200.om`` and a TSDB.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

if __name__ == "__main__":  # run as a script: make kind-e2e/ importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus import PrometheusFailed
from prometheus.server import binary

REPO = Path(__file__).resolve().parents[2]
HOSTNAME = "h200-lab-0"


def data_dir() -> Path:
    """The repository's data/h200-telemetry (or $M2G_DATA/h200-telemetry)."""
    return Path(os.environ.get("M2G_DATA") or REPO / "data") / "h200-telemetry"


@dataclass(frozen=True)
class Row:
    t: float
    uuid: str
    name: str
    power_w: float
    temp_c: float


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    seconds: float
    duty: float


def read_rows(path: Path) -> list[Row]:
    rows: list[Row] = []
    with path.open(newline="") as fh:
        reader = csv.reader(fh, skipinitialspace=True)
        header = [h.strip() for h in next(reader)]
        col = {h: i for i, h in enumerate(header)}
        for rec in reader:
            if not rec:
                continue
            stamp = datetime.strptime(rec[col["timestamp"]].strip(), "%Y/%m/%d %H:%M:%S.%f")
            rows.append(Row(
                t=stamp.replace(tzinfo=UTC).timestamp(),
                uuid=rec[col["uuid"]].strip(), name=rec[col["name"]].strip(),
                power_w=float(rec[col["power.draw [W]"]].split()[0]),
                temp_c=float(rec[col["temperature.gpu"]])))
    return rows


def read_phases(path: Path) -> list[Phase]:
    return [Phase(p["phase"], float(p["start"]), float(p["seconds"]), float(p["duty"]))
            for p in json.loads(path.read_text())]


def openmetrics(rows: list[Row], hostname: str = HOSTNAME) -> str:
    families: list[tuple[str, str, Callable[[Row], float]]] = [
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temp_c),
        ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", lambda r: 0.0),
    ]
    out: list[str] = []
    for name, help_text, get in families:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for r in rows:
            labels = (f'gpu="0",UUID="{r.uuid}",Hostname="{hostname}",'
                      f'modelName="{r.name}"')
            out.append(f"{name}{{{labels}}} {get(r):g} {r.t:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def backfill(rows: list[Row], workdir: Path, tsdb: Path) -> None:
    """Write the OpenMetrics file and create TSDB blocks from it with promtool."""
    om = workdir / "h200.om"
    om.write_text(openmetrics(rows))
    tsdb.mkdir(parents=True, exist_ok=True)
    res = subprocess.run([binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                          str(om), str(tsdb)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise PrometheusFailed(f"promtool backfill failed ({res.returncode}): {' | '.join(tail)}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: h200.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(data_dir() / "telemetry.csv")
    backfill(rows, out, out / "tsdb")
    print(f"{len(rows)} readings → {out / 'tsdb'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
