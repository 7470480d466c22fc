"""deploy/monitoring/prometheusrule.yaml: its rules are valid PromQL (promtool) and name only
metrics the controller exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from m2g.signals.readings import build_readings
from m2g_controllers.metrics import Metrics

RULE = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "prometheusrule.yaml"


def groups() -> list[dict[str, object]]:
    spec = yaml.safe_load(RULE.read_text())["spec"]
    assert isinstance(spec["groups"], list)
    return spec["groups"]


def test_rules_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups()}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_name_exported_metrics() -> None:
    """What the controller's registry exports once it has read its signals (M2GSignalStale
    named m2g_signal_stale, which m2g run did not export until 2026-12-06: the alert could not
    fire)."""
    metrics = Metrics()
    metrics.latest_readings = lambda: build_readings({}, 0.0)
    exported = {m.name for m in metrics.registry.collect()}
    exported |= {f"{n}_total" for n in exported}
    for group in groups():
        for rule in group["rules"]:  # type: ignore[attr-defined]
            for name in re.findall(r"\bm2g_[a-z_]+", rule["expr"]):
                assert name in exported, (rule["alert"], name)
